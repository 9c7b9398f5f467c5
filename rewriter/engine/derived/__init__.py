"""Derived patches: an upstream fix made into data (docs/derive.md).

The package's modules, in the order a fix travels through them:

- :mod:`.units` reads a diff's two versions of a file into units and edits;
- :mod:`.data` is the data file (TOML, schema 1) and its tables;
- :mod:`.truth` is the loader's check that a file's edits and code agree;
- :mod:`.shapes` and :mod:`.match` compare statements by their shape and
  find an edit's block, its anchors and its statements (the one locator the
  recognition and the rewrite share);
- :mod:`.patch` is :class:`DerivedPatch`, the four states unit by unit
  (:mod:`.imports` its imports edits);
- :mod:`.rename` follows a vendor's consistent renaming of locals;
- :mod:`.moved` finds a function upstream moved (another class of the file);
- :mod:`.never`: code the fix changes that this release never had (a name
  it takes away is nowhere in the file): not-applicable, not drifted;
- :mod:`.names` and :mod:`.reads`: only code whose names resolve in the
  target, and the other modules that takes reading; :mod:`.declared`, the
  names a module ``__getattr__`` declares (``vllm.envs``);
- :mod:`.runtime`: only code whose attributes are there at run time (ty on
  the fixed file, run and cached by :mod:`.typecheck`, through
  :mod:`.tyserver` or in folders of links, :mod:`.tyfolders`; what another
  function sees of a module, its bodies left out, :mod:`.interface`; attribute
  names the release defines or reads somewhere; :mod:`.outside`, the attributes
  there at run time from outside vLLM; a verdict keyed by the modules ty can
  reach, :mod:`.closure`, over each file's imports, :mod:`.import_lists`);
- :mod:`.entries`: an entry of a large literal or a keyword of a long call
  as an edit of its own, found by its key whatever the other entries hold;
- :mod:`.regions` and :mod:`.rewrite`: the lines an edit changes, and the
  rewrite that changes only those (as text; imports by name where it must);
- :mod:`.docstrings` and :mod:`.comments`: documentation the fix edits,
  carried where the old text is there exactly, never counting for
  recognition.
"""

from deepstack_patch.engine.derived.data import (
    EDIT_KINDS,
    FILE_KINDS,
    SCHEMA,
    UNIT_KINDS,
    Anchor,
    Edit,
    SkippedTest,
    Step,
    Unit,
    data_file_name,
    dump_derived,
    write_derived,
)
from deepstack_patch.engine.derived.patch import DerivedPatch, load_derived
from deepstack_patch.engine.protocol import RecordedTest

__all__ = [
    "EDIT_KINDS",
    "SCHEMA",
    "FILE_KINDS",
    "UNIT_KINDS",
    "Anchor",
    "DerivedPatch",
    "Edit",
    "RecordedTest",
    "SkippedTest",
    "Step",
    "Unit",
    "data_file_name",
    "dump_derived",
    "load_derived",
    "write_derived",
]

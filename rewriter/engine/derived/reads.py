"""The files of the tree a derived patch reads besides its own: those of the
``vllm`` modules its fix imports from or reads attributes of, where
:mod:`.names` looks the fix's names up.

Computed from the patch's data alone (the imports and attribute reads of its
edits' code, import edits included), so that a partial extraction of a
release (``status --release``, ``matrix``, ``derive --base``) can hold them,
and list them as asked for: a module the release lacks is then known to be
missing there, as in a whole tree. A module the fix reads through an import
of the file outside the diff's lines is not among them: a partial extraction
cannot tell about it, and accepts its names.
"""

from __future__ import annotations

from collections.abc import Iterable

from deepstack_patch.engine.derived.data import Unit
from deepstack_patch.engine.derived.match import code_nodes, import_aliases
from deepstack_patch.engine.derived.names import (
    absolute_module,
    attribute_chains,
    imported_modules,
    imports_in,
)


def module_files(units: Iterable[Unit]) -> tuple[str, ...]:
    """The files that may hold the ``vllm`` modules the units' fix reads:
    ``vllm/a/b.py`` and ``vllm/a/b/__init__.py`` for each, with the package
    ``__init__.py`` files on their way; for ``from vllm.a import b`` and an
    attribute ``a.b`` also ``b`` as a submodule."""
    modules: set[str] = set()
    for unit in units:
        code = [
            node
            for edit in unit.edits
            for text, header in (
                (edit.inserted, edit.header_after),
                (edit.removed, edit.header_before),
            )
            for node in code_nodes(text, header)
        ]
        for kind, module, level, name, _asname in import_aliases(imports_in(code)):
            if kind == "import":
                modules.add(name)
            elif name != "*":
                dotted = absolute_module(module, level, unit.path)
                modules |= {dotted, f"{dotted}.{name}"}
        bound = imported_modules(code, unit.path)
        for first, *rest in attribute_chains(code):
            if first in bound:
                modules |= {
                    ".".join([bound[first], *rest[:end]])
                    for end in range(len(rest) + 1)
                }
    return tuple(sorted({file for dotted in modules for file in _files_of(dotted)}))


def _files_of(dotted: str) -> list[str]:
    parts = dotted.split(".")
    if parts[0] != "vllm" or not all(part.isidentifier() for part in parts):
        return []
    on_the_way = [
        "/".join(parts[:end]) + "/__init__.py" for end in range(1, len(parts))
    ]
    module = "/".join(parts)
    return [*on_the_way, f"{module}.py", f"{module}/__init__.py"]

"""Files a derived patch adds or deletes whole (issue 40, item 2).

A fix that adds a module carries it: the unit (``new-file``) is

- ``needed`` where the tree lacks the file and has the folder it goes into
  (or the patch adds that folder's ``__init__.py`` too), and every name the
  new module reads is there, as for any other new code (:mod:`.names`,
  :mod:`.runtime`: a module importing what the release lacks is refused);
- ``applied`` where the file is there with upstream's code;
- ``drifted`` where it is there with other code;
- absent (no finding) where its folder is not in the tree: a release from
  before the package existed; the patch is then not-applicable, or drifts
  where its other units are there (it applies whole or not at all).

A deleted file (``deleted-file``) is the reverse: ``needed`` where it is
there with the code the fix deletes, ``applied`` where it is absent,
``drifted`` where it is there with other code.

Code is compared as everywhere else in a derived patch: by ``ast.dump``,
formatting and comments aside (a vendor's reformatted copy of upstream's
module is upstream's module).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence
from typing import Any

from deepstack_patch.engine.context import tree_context
from deepstack_patch.engine.derived import names, shapes
from deepstack_patch.engine.derived.data import Unit
from deepstack_patch.engine.derived.runtime import (
    package_is_whole,
    package_of,
    settle_runtime,
)
from deepstack_patch.engine.protocol import Finding, PatchState


@dataclasses.dataclass
class _FileState:
    """A whole-file unit's state, in the shape :mod:`.names` and
    :mod:`.runtime` settle."""

    state: PatchState
    span: tuple[int, int]
    reason: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    line: int = 1


def present(unit: Unit, tree: ast.Module) -> Finding:
    """The unit where the tree has its file (parsed as ``tree``)."""
    ours = unit.after if unit.kind == "new-file" else unit.before
    span = (1, max((node.end_lineno or 1 for node in tree.body), default=1))
    difference = _first_difference(tree, ast.parse(ours))
    if not difference:
        state = PatchState.APPLIED if unit.kind == "new-file" else PatchState.NEEDED
        return _finding(unit, _FileState(state, span))
    what = "adds" if unit.kind == "new-file" else "deletes"
    reason = (
        f"{unit.path} is there, and is not the module the fix {what} ({difference})"
    )
    return _finding(unit, _FileState(PatchState.DRIFTED, span, reason))


def still_imported(patch: names.DerivedPatch, finding: Finding) -> Finding:
    """A deletion that is needed drifts where the release imports the module
    it deletes from a file the patch does not change (a vendor's module, code
    upstream had changed before the fix): deleting it would break that
    import. Judged in a whole tree only (a partial one cannot tell)."""
    unit = next(u for u in patch.units if u.part == finding.part)
    context = tree_context()
    if finding.state is not PatchState.NEEDED or unit.kind != "deleted-file":
        return finding
    if context is None or not package_is_whole(context):
        return finding
    word = unit.name.rpartition(".")[2].encode()
    context.scanned_for.add(word)  # only a file that holds it can import it
    for relpath, raw in package_of(context).files:
        line = 0
        if relpath not in patch.paths and word in raw:
            line = _imports_module(raw, relpath, unit.name)
        if line:
            reason = f"the fix deletes {unit.path}, which {relpath}:{line} imports"
            return dataclasses.replace(finding, state=PatchState.DRIFTED, reason=reason)
    return finding


def _imports_module(raw: bytes, relpath: str, dotted: str) -> int:
    """The line of the first import of the module ``dotted`` in the file, or 0."""
    try:
        tree = ast.parse(raw)
    except (SyntaxError, ValueError):
        return 0
    parent, _, name = dotted.rpartition(".")
    for node in ast.walk(tree):
        match node:
            case ast.Import(names=aliases) if any(
                a.name == dotted or a.name.startswith(dotted + ".") for a in aliases
            ):
                return node.lineno
            case ast.ImportFrom(module=module, level=level, names=aliases):
                source = names.absolute_module(module or "", level or 0, relpath)
                if source == dotted or source.startswith(dotted + "."):
                    return node.lineno
                if source == parent and any(a.name == name for a in aliases):
                    return node.lineno
    return 0


def missing(patch: names.DerivedPatch, unit: Unit) -> list[Finding]:
    """The unit where the tree lacks its file."""
    if unit.kind == "deleted-file":
        return [_finding(unit, _FileState(PatchState.APPLIED, (1, 1)))]
    if not _folder_there(patch, unit.path):
        return []  # a release from before its package: not-applicable
    tree = ast.parse(unit.after)
    span = (1, max((node.end_lineno or 1 for node in tree.body), default=1))
    states: dict[str, Any] = {unit.part: _FileState(PatchState.NEEDED, span)}
    why = names.unresolved(patch, [unit], states, tree, unit.path)
    if why:
        states[unit.part] = _FileState(PatchState.DRIFTED, span, why)
    else:
        states = settle_runtime(patch, [unit], states, unit.path)
    return [_finding(unit, states[unit.part])]


def in_tree(patch: names.DerivedPatch, unit: Unit | None) -> list[Finding]:
    """The unit in the tree being recognised, its file there or not."""
    context = tree_context()
    if context is None or unit is None:
        return []
    raw = context.sources.get(unit.path)
    if raw is None:
        try:
            raw = context.read(unit.path)
        except OSError:
            return missing(patch, unit)
    try:
        return [present(unit, ast.parse(raw))]
    except (SyntaxError, ValueError):
        return []  # unreadable here: the file's own plan says so


def after_fix(unit: Unit) -> bytes | None:
    """What the unit's file holds after the fix: its bytes, or None (deleted)."""
    return unit.after.encode("utf-8") if unit.kind == "new-file" else None


def folders_read(units: Sequence[Unit]) -> list[str]:
    """The ``__init__.py`` of each folder a new file goes into: whether the
    folder is there is read from it (a partial extraction holds it)."""
    return [
        f"{unit.path.rpartition('/')[0]}/__init__.py"
        for unit in units
        if unit.kind == "new-file"
    ]


def _folder_there(patch: names.DerivedPatch, path: str) -> bool:
    """Whether the folder ``path`` goes into is there, or the patch adds it
    as a package (its ``__init__.py``, in a folder that is there)."""
    folder = path.rpartition("/")[0]
    context = tree_context()
    if not folder or context is None:  # a patch's examples: the file alone
        return True
    # A partial extraction holds the folder's __init__.py where the release
    # has it (a derived patch asks for it: ``also_reads``).
    if context.is_dir(folder):
        return True
    package = f"{folder}/__init__.py"
    adds_package = any(
        unit.path == package and unit.kind == "new-file" for unit in patch.units
    )
    return adds_package and _folder_there(patch, folder)  # the folder's own


def _first_difference(tree: ast.Module, expected: ast.Module) -> str:
    """Where the tree's module first differs from the expected one, as code;
    "" where they are the same."""
    if ast.dump(tree) == ast.dump(expected):
        return ""
    for ours, theirs in zip(tree.body, expected.body, strict=False):
        if ast.dump(ours) != ast.dump(theirs):
            return (
                f"line {ours.lineno}: `{shapes.quoted(ast.unparse(ours))}` where "
                f"the fix has `{shapes.quoted(ast.unparse(theirs))}`"
            )
    if len(tree.body) > len(expected.body):
        extra = tree.body[len(expected.body)]
        return f"line {extra.lineno}: `{shapes.quoted(ast.unparse(extra))}` is more"
    if len(tree.body) == len(expected.body):  # its `# type: ignore` comments
        return "its type-checker comments differ"
    shown = shapes.quoted(ast.unparse(expected.body[len(tree.body)]))
    return f"it ends before `{shown}`"


def _finding(unit: Unit, state: Any) -> Finding:
    return Finding(
        state=state.state,
        symbol=unit.name,
        line=1,
        span=state.span,
        reason=state.reason,
        part=unit.part,
        details=state.details,
    )

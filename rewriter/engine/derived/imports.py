"""A derived patch's imports edit recognised: names added where the file
lacks them, and dropped where the fix dropped them and nothing uses them
once the fix is in; imports never drift (docs/derive.md)."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from typing import Any

from deepstack_patch.engine.derived import names, shapes
from deepstack_patch.engine.derived.data import Edit
from deepstack_patch.engine.derived.match import (
    CompiledEdit,
    ShapeCache,
    bound_name,
    import_aliases,
    name_uses,
)
from deepstack_patch.engine.protocol import PatchState


def rebound(edits: Sequence[Edit], tree: ast.Module) -> frozenset[str]:
    """The names the import edits ``edits`` (one unit's) bind that the file's
    imports lack: a name one edit imports from another module and another
    edit stops importing where it was (vllm#30566 moves ``MultiModalDataDict``
    to ``vllm.inputs``) is dropped where it was while it is added."""
    present = set(
        import_aliases(
            i for i in tree.body if isinstance(i, ast.Import | ast.ImportFrom)
        )
    )
    return frozenset(
        bound_name(alias)
        for edit in edits
        if edit.kind == "imports"
        for alias in names.wanted_imports(edit)
        if alias not in present
    )


def recognise_imports(
    compiled: CompiledEdit,
    tree: ast.Module,
    shapes_of: ShapeCache,
    uses_after_fix: Counter[str] | None,
    unit_edits: Sequence[Edit] = (),
) -> tuple[PatchState, str, tuple[int, int], dict[str, Any]]:
    """Imports are added where missing and dropped where the fix dropped them
    and nothing uses them once the fix is in (``uses_after_fix``: what the
    needed units' rewrites take away and bring), or where the unit's edits
    (``unit_edits``) import them from elsewhere instead (:func:`rebound`);
    they never drift."""
    edit = compiled.edit
    wanted = names.wanted_imports(edit)  # never a name of a context line
    dropped = [
        alias
        for alias in import_aliases(shapes.parse_statements(edit.removed))
        if alias not in import_aliases(shapes.parse_statements(edit.inserted))
    ]
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    present = set(import_aliases(imports))
    missing = [alias for alias in wanted if alias not in present]
    unused = []
    if dropped and uses_after_fix is not None:
        used = name_uses([tree])
        used.update(uses_after_fix)  # update adds negative counts too
        unused = [a for a in dropped if a in present and used[bound_name(a)] <= 0]
    moving = rebound(unit_edits, tree) if dropped else frozenset()
    unused += [
        a
        for a in dropped
        if a in present and a not in unused and bound_name(a) in moving
    ]
    leading = _leading_imports(tree)
    if leading:
        # With the blank and comment lines after them, up to the next
        # statement: a new group of imports goes there (rewrite.py).
        last = leading[-1].end_lineno or leading[-1].lineno
        following = [_first_line(n) for n in tree.body if _first_line(n) > last]
        span = (leading[0].lineno, max(last, min(following, default=1) - 1))
    else:
        span = (1, (tree.body[0].end_lineno or 1) if tree.body else 1)
    if not missing and not unused:
        return PatchState.APPLIED, "", span, {}
    anchor = compiled.before_anchor
    after_statement = ""
    if anchor is not None:
        matches = [n for n in leading if anchor.matches(n, shapes_of)]
        if len(matches) == 1:
            after_statement = ast.unparse(matches[0])
    # Upstream's first import (no import before it): before the one it
    # precedes upstream, where that one is there once (vllm#30518's
    # `import sys`); else after the last leading import.
    following = compiled.after_anchor if anchor is None else None
    before = [n for n in leading if following and following.matches(n, shapes_of)]
    if not after_statement and len(before) != 1 and leading:
        after_statement = ast.unparse(leading[-1])
    details = {
        "add": [list(a) for a in missing],
        "drop": [list(a) for a in unused],
        "after": after_statement,
    }
    if not after_statement and len(before) == 1:
        details["before"] = ast.unparse(before[0])
    return PatchState.NEEDED, "", span, details


def _leading_imports(tree: ast.Module) -> list[ast.stmt]:
    """The module's top-level imports before its first definition."""
    found: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, shapes.DEFINITIONS):
            break
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
    return found


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])

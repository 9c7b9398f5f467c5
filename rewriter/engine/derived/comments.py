"""Comment lines the fix edits, carried as text (issue 40 item 5).

Comments never reach the ``ast``, so recognition never sees them, and an
edit's lines (:mod:`.regions`) hold only the comments between the statements
it changes and their neighbours. A comment upstream rewrites elsewhere (above
an ``if`` whose body the fix changes, vllm#43846; above a module statement it
keeps, vllm#41006; one it deletes above a call it keeps) is an edit of its
own: ``kind = "comments"``, the blank and comment lines between
two statements the fix keeps in one block (``before_anchor`` and
``after_anchor``; no ``before_anchor``: at the block's start), ``removed``
before the fix and ``inserted`` after it, dedented as a region records them.

Like a docstring, such an edit never counts for recognition: where its unit
has code, it rides along with it; where it does not, it is a documentation
unit of its own (``Unit.documentation_only``). Either way it is carried only
where the target's lines there are the old ones exactly (:func:`action`):
a vendor's comment is never overwritten. Comments at the end of a block
(after its last statement) and comments at the end of a code line are not
carried: derive notes them where they are all a file's change.
"""

from __future__ import annotations

import ast
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deepstack_patch.engine.derived import regions, shapes
from deepstack_patch.engine.derived.match import (
    CompiledEdit,
    ShapeCache,
    neighbours_match,
)
from deepstack_patch.engine.source import SourceFile, code_lines, parsed_from

#: What the rewrite does with the lines: write upstream's comments there.
REPLACE = "replace"


def gap(
    compiled: CompiledEdit, block: Sequence[ast.stmt], shapes_of: ShapeCache
) -> int | str:
    """The index in ``block`` (its docstring included) of the statement the
    comments sit above, found between the edit's anchors exactly once; or
    why not."""
    statements = shapes.without_docstring(block)
    offset = len(block) - len(statements)
    anchors = (compiled.before_anchor, compiled.after_anchor)
    found = [
        at
        for at in range(len(statements))
        if neighbours_match(statements, at, 0, anchors, shapes_of, edges=True)
    ]
    if len(found) != 1:
        return f"the statement they are above is found {len(found)} times, not once"
    return found[0] + offset


def region(
    lines: Sequence[str], block: Sequence[ast.stmt], at: int
) -> regions.Region | str:
    """The blank and comment lines above ``block[at]``, after the statement
    before it (or the block's header)."""
    return regions.between(lines, block, at, at)


def _placed(
    compiled: CompiledEdit,
    block: Sequence[ast.stmt],
    lines: Sequence[str],
    shapes_of: ShapeCache,
) -> tuple[regions.Region, str | None] | str:
    """The edit's lines in the target (recognition and the rewrite find
    them alike) and what to do there: REPLACE where they are the ones the
    fix edits, exactly; ``""`` where they are the fixed ones; None where
    neither. Why not, where they cannot be placed."""
    at = gap(compiled, block, shapes_of)
    found = region(lines, block, at) if isinstance(at, int) else at
    if isinstance(found, str):
        return found
    ours = found.text(lines)
    if ours == regions.split(compiled.edit.inserted):
        return found, ""
    if ours == regions.split(compiled.edit.removed):
        return found, REPLACE
    return found, None


@dataclass(frozen=True)
class Found:
    """A comments edit in the target: what to do (:func:`_placed`; None also
    where the lines cannot be told), the lines they take (1-based), the
    statement they are above, and why not, for None."""

    todo: str | None
    span: tuple[int, int]
    above: str
    why: str = ""


def action(
    compiled: CompiledEdit,
    block: Sequence[ast.stmt],
    lines: Sequence[str] | None,
    shapes_of: ShapeCache,
) -> Found:
    """The comments edit in ``block`` (the target's, as recognition located
    it); ``lines``: the target file's (None: a tree the engine did not
    parse, whose comments cannot be told)."""
    above = f"`{shapes.quoted(compiled.edit.after_anchor.code)}`"  # type: ignore[union-attr]
    if lines is None:
        return Found(None, (1, 1), above, "cannot be read (no source)")
    placed = _placed(compiled, block, lines, shapes_of)
    if isinstance(placed, str):
        return Found(None, (1, 1), above, f"cannot be placed: {placed}")
    found, todo = placed
    span = (found.first + 1, max(found.stop, found.first + 1))
    why = (
        ""
        if todo is not None
        else "are neither the ones the fix edits nor the fixed ones"
    )
    return Found(todo, span, above, why)


def lines_of(tree: ast.Module) -> list[str] | None:
    """The lines of the file ``tree`` was parsed from (None: a tree the
    engine did not parse: its comments cannot be told); read once a tree."""
    if tree in _LINES:
        return _LINES[tree]
    raw = parsed_from(tree)
    lines = None if raw is None else code_lines(SourceFile("", raw).text)
    _LINES[tree] = lines
    return lines


_LINES: weakref.WeakKeyDictionary[ast.Module, list[str] | None] = (
    weakref.WeakKeyDictionary()
)


def details_of(todo: str | None) -> Mapping[str, str]:
    return {"comments": todo} if todo else {}


def rewritten(
    lines: Sequence[str],
    block: Sequence[ast.stmt],
    compiled: CompiledEdit,
    shapes_of: ShapeCache,
    newline: str,
) -> tuple[regions.Region, list[str]] | str:
    """The region of the comments and its lines as the fix writes them; or
    why not (the lines are no longer the ones recognition found)."""
    placed = _placed(compiled, block, lines, shapes_of)
    if isinstance(placed, str):
        return placed
    found, todo = placed
    if todo is None:
        return "the comment lines are not the ones the fix edits"
    if not todo:
        return found, list(lines[found.first : found.stop])
    return found, regions.rewritten(lines, found, compiled.edit.inserted, newline)


# -- at derive time ------------------------------------------------------------


def differ(
    before_lines: Sequence[str],
    after_lines: Sequence[str],
    old_block: Sequence[ast.stmt],
    new_block: Sequence[ast.stmt],
    at: tuple[int, int],
) -> tuple[str, str] | None:
    """The lines above ``old_block[at[0]]`` and ``new_block[at[1]]`` (two
    statements the fix keeps, their blocks' docstrings included in the
    index), recorded, where their comments differ; None where they do not
    (blank lines alone are formatting), or cannot be cut on whole lines."""
    old = region(before_lines, old_block, at[0])
    new = region(after_lines, new_block, at[1])
    if isinstance(old, str) or isinstance(new, str):
        return None
    old_text, new_text = old.text(before_lines), new.text(after_lines)
    if _comments(old_text) == _comments(new_text):
        return None
    return regions.recorded(before_lines, old), regions.recorded(after_lines, new)


def inside_differ(
    before_lines: Sequence[str],
    after_lines: Sequence[str],
    was: ast.stmt,
    now: ast.stmt,
) -> bool:
    """Whether the comment lines inside two statements of the same code
    differ (the lines of their blocks: where upstream rewrote one)."""
    return _comments(_own_lines(before_lines, was)) != _comments(
        _own_lines(after_lines, now)
    )


def _own_lines(lines: Sequence[str], node: ast.stmt) -> list[str]:
    return list(lines[regions.first_line(node) - 1 : node.end_lineno or node.lineno])


def _comments(lines: Sequence[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip().startswith("#")]

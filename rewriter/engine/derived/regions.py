"""The lines an edit replaces, as text: derive records them, the rewrite
writes them (docs/derive.md, "every untouched byte kept").

An edit's *region* is the run of lines between the statements it keeps
around it in its block: the statements it removes (none for an insertion)
and the blank and comment lines between them and its neighbours. At the
block's edge the region starts after the block's header (after its
docstring, where it has one: that is a neighbour) and ends with its last
statement. Derive records a region's lines before and after the fix
(``removed``, ``inserted``); the rewrite finds the same region in the target
by its statements (the one locator, :mod:`.match`) and changes only the lines
the fix changes there (:func:`merged`): every other line stays the target's,
and the new lines are upstream's, re-indented to the target's block.

Lines are recorded *dedented*: the block's indentation is cut from each line
that has it, and lines inside a multi-line string stay as they are (their
indentation is the string's value). An ``elif`` (an ``if`` in its parent's
``else`` block) is recorded as the ``if`` it is, and written back as an
``elif`` where the target has one there.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def first_line(node: ast.stmt) -> int:
    """A statement's first line (1-based), its decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def is_gap(line: str) -> bool:
    """A blank or comment-only line: one no statement owns."""
    text = line.strip()
    return not text or text.startswith("#")


def is_elif(lines: Sequence[str], node: ast.stmt) -> bool:
    """Whether ``node`` is an ``if`` written as its parent's ``elif``."""
    if not isinstance(node, ast.If):
        return False
    line = lines[node.lineno - 1]
    return line[node.col_offset : node.col_offset + 4] == "elif"


def string_lines(nodes: Iterable[ast.AST]) -> set[int]:
    """The 0-based indices of the lines that continue a string of ``nodes``
    (a multi-line string's second line to its last)."""
    found: set[int] = set()
    for root in nodes:
        for node in ast.walk(root):
            match node:
                case ast.Constant(value=str() | bytes()) | ast.JoinedStr():
                    last = node.end_lineno or node.lineno
                    found.update(range(node.lineno, last))
    return found


def indentation(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t\f"))]


@dataclass(frozen=True)
class Region:
    """Lines ``first`` to ``stop`` (0-based, ``stop`` excluded) of a file:
    a block's lines at ``indent``; ``elif_line`` is the line of an ``elif``
    the region holds (-1: none), ``raw`` the lines inside strings."""

    first: int
    stop: int
    indent: str
    elif_line: int = -1
    raw: frozenset[int] = frozenset()
    #: A header's region whose last line holds the block too
    #: (``class A(B): ...``).
    holds_block: bool = False

    def text(self, lines: Sequence[str]) -> list[str]:
        """The region's lines, dedented, without their ends."""
        return [self.dedented(lines, index) for index in range(self.first, self.stop)]

    def dedented(self, lines: Sequence[str], index: int) -> str:
        line = lines[index].rstrip("\r\n")
        if index in self.raw or not line.strip():
            return line
        if line.startswith(self.indent):
            line = line[len(self.indent) :]
        if index == self.elif_line and line.startswith("elif"):
            line = line[2:]
        return line


def between(
    lines: Sequence[str], block: Sequence[ast.stmt], start: int, end: int
) -> Region | str:
    """The region of ``block[start:end]`` (the statements an edit removes;
    ``start == end``: where it inserts) between its neighbours; or why it
    cannot be cut out on whole lines."""
    if not block:
        return "the block is empty"
    if not _starts_its_line(lines, block[0]):
        return "the block is on the line of its header; the fix needs it indented"
    if _shares_a_line(block, start, end):
        return "the fix splits a line that holds several statements"
    if start > 0:
        first = block[start - 1].end_lineno or block[start - 1].lineno
    else:  # after the block's header: the blank and comment lines are its
        first = first_line(block[0]) - 1
        while first > 0 and is_gap(lines[first - 1]):
            first -= 1
    if end < len(block):
        stop = first_line(block[end]) - 1
    elif end > start:
        stop = block[end - 1].end_lineno or block[end - 1].lineno
    else:
        stop = first
    return _region(lines, block, start, end, first, stop)


def statements(
    lines: Sequence[str],
    block: Sequence[ast.stmt],
    start: int,
    end: int,
    insertion: bool,
) -> Region | str:
    """The region of the module's imports ``block[start:end]``: their own
    lines; for an ``insertion`` (after ``block[start - 1]``) the lines from
    that statement on, and the blank ones after them. (The statement after
    the leading imports may be left out of the module the rewrite is
    given: the region stops at the first line that is not blank.)"""
    if not block or (insertion and start == 0):
        return "no statement before it"
    if _shares_a_line(block, start, end):
        return "the fix splits a line that holds several statements"
    if not insertion:
        first = first_line(block[start]) - 1
        stop = block[end - 1].end_lineno or block[end - 1].lineno
        return _region(lines, block, start, end, first, stop)
    first = block[start - 1].end_lineno or block[start - 1].lineno
    stop = block[end - 1].end_lineno or first if end > start else first
    while stop < len(lines) and not lines[stop].strip():
        stop += 1
    return _region(lines, block, start, end, first, stop)


def header(lines: Sequence[str], node: ast.stmt) -> Region | str:
    """The region of a compound statement's header: its decorators to the
    colon before its block (an ``elif`` read as an ``if``)."""
    body = node.body  # type: ignore[attr-defined]
    if not _starts_its_line(lines, node):
        return "the block is on the line of its header; the fix needs it indented"
    first = first_line(node) - 1
    stop = first_line(body[0]) - 1
    holds_block = not _starts_its_line(lines, body[0])
    if holds_block and node.end_lineno == body[0].lineno:
        # ``class A(B): ...``: the one line of its block ends the header's
        # last line; the header's lines are the statement's (vllm#30518).
        stop = body[0].lineno
    elif holds_block:
        return "the block is on the line of its header; the fix needs it indented"
    while stop > first + 1 and is_gap(lines[stop - 1]):
        stop -= 1
    elif_line = node.lineno - 1 if is_elif(lines, node) else -1
    raw = frozenset(
        string_lines([*getattr(node, "decorator_list", []), _emptied(node)])
    )
    return Region(first, stop, indentation(lines[first]), elif_line, raw, holds_block)


def _emptied(node: ast.stmt) -> ast.stmt:
    """``node`` without its blocks (only its header's strings count)."""
    import copy

    emptied = copy.copy(node)
    for name in ("body", "orelse", "finalbody", "handlers"):
        if hasattr(emptied, name):
            setattr(emptied, name, [])
    return emptied


def _shares_a_line(block: Sequence[ast.stmt], start: int, end: int) -> bool:
    """Whether a statement at the edges of ``block[start:end]`` (or inside
    it) shares a line with the one next to it (``a; b``)."""
    return any(
        (block[k - 1].end_lineno or block[k - 1].lineno) >= first_line(block[k])
        for k in range(max(start, 1), min(end + 1, len(block)))
    )


def _starts_its_line(lines: Sequence[str], node: ast.stmt) -> bool:
    line = lines[first_line(node) - 1]
    column = node.col_offset if first_line(node) == node.lineno else None
    if column is None:  # a decorator's line: it starts with the `@`
        return line.lstrip().startswith("@")
    return not line[:column].strip()


def _region(
    lines: Sequence[str],
    block: Sequence[ast.stmt],
    start: int,
    end: int,
    first: int,
    stop: int,
) -> Region:
    indent = indentation(lines[first_line(block[0]) - 1])
    elif_line = block[0].lineno - 1
    if (
        len(block) != 1
        or not is_elif(lines, block[0])
        or elif_line not in range(first, stop)
    ):
        elif_line = -1
    raw = frozenset(string_lines(block[start:end]))
    return Region(first, stop, indent, elif_line, raw)


# -- writing a region ---------------------------------------------------------


def recorded(lines: Sequence[str], region: Region) -> str:
    """A region's text as derive records it."""
    return "".join(line + "\n" for line in region.text(lines))


def replaced(
    lines: Sequence[str],
    region: Region,
    before: str,
    after: str,
    newline: str,
    own: Sequence[tuple[int, int]] = (),
    raw: frozenset[int] | None = None,
) -> list[str] | None:
    """The region's lines with the fix's change from ``before`` to ``after``
    (recorded, dedented) made in them; None where the change cannot be
    placed on the target's lines.

    The lines are matched as text first. Where a statement the fix removes
    is laid out otherwise in the target (``own``: the lines, 0-based in the
    file, of the target's statements the fix removes), each of those
    statements counts as one line, matched by its place: the blank and
    comment lines around them are still matched as text. ``raw``: the
    lines of ``after`` inside a string, where ``after`` is not statements
    (a literal's entries, :mod:`.entries`)."""
    old, new = split(before), split(after)
    target = region.text(lines)
    plan = merged(old, new, target)
    if plan is None and own:
        plan = _merged_by_statement(old, new, target, region, own)
    if plan is None:
        return None
    written = written_lines(new, region, newline, raw)
    out = [
        lines[region.first + index] if source == "target" else written[index]
        for source, index in plan
    ]
    return _keep_last_line_end(out, lines, region)


def _merged_by_statement(
    old: list[str],
    new: list[str],
    target: list[str],
    region: Region,
    own: Sequence[tuple[int, int]],
) -> list[tuple[str, int]] | None:
    """:func:`merged` with each removed statement one line (see
    :func:`replaced`)."""
    recorded = _statement_ranges(old)
    if len(recorded) != len(own):
        return None
    old_lines, _ = _one_line_each(old, recorded)
    at = [(first - region.first, stop - region.first) for first, stop in own]
    target_lines, origin = _one_line_each(target, at)
    plan = merged(old_lines, new, target_lines)
    if plan is None:
        return None
    return [
        (source, line)
        for source, index in plan
        for line in (origin[index] if source == "target" else [index])
    ]


def _statement_ranges(code: Sequence[str]) -> list[tuple[int, int]]:
    """The 0-based ``[first, stop)`` lines of each statement of ``code``."""
    return [
        (first_line(node) - 1, min(node.end_lineno or node.lineno, len(code)))
        for node in _parsed(code)
    ]


def _one_line_each(
    code: Sequence[str], ranges: Sequence[tuple[int, int]]
) -> tuple[list[str], list[list[int]]]:
    """``code`` with each range one line of its own (no code line is equal
    to it), and the lines of ``code`` each line of the result stands for."""
    out: list[str] = []
    origin: list[list[int]] = []
    starts = {first: (number, stop) for number, (first, stop) in enumerate(ranges)}
    index = 0
    while index < len(code):
        if index in starts:
            number, stop = starts[index]
            out.append(f"\0statement {number}")
            origin.append(list(range(index, stop)))
            index = max(stop, index + 1)
            continue
        out.append(code[index])
        origin.append([index])
        index += 1
    return out, origin


def rewritten(
    lines: Sequence[str], region: Region, after: str, newline: str
) -> list[str]:
    """The region's lines all replaced by ``after`` (recorded, dedented)."""
    return _keep_last_line_end(
        written_lines(split(after), region, newline), lines, region
    )


def replaced_statements(
    lines: Sequence[str],
    region: Region,
    removed_lines: tuple[int, int],
    after: str,
    newline: str,
) -> list[str]:
    """The region's lines with the lines of the statements the fix removes
    (``removed_lines``, 0-based in the file; an empty range at the region's
    start for an insertion) replaced by the fix's statements, with the
    comment lines right above the first one that the target does not have
    above them already: the way where neither the recorded lines nor the
    blank and comment lines around the statements are the target's."""
    new = split(after)
    parsed = _statement_lines(new)
    start = parsed[0] if parsed else len(new)
    while start > 0 and new[start - 1].strip().startswith("#"):
        start -= 1
    kept_above = {
        lines[index].strip() for index in range(region.first, removed_lines[0])
    }
    chosen = [
        index
        for index in range(start, parsed[-1] + 1 if parsed else len(new))
        if index >= (parsed[0] if parsed else 0) or new[index].strip() not in kept_above
    ]
    written = written_lines(new, region, newline)
    out = [
        *lines[region.first : removed_lines[0]],
        *(written[index] for index in chosen),
        *lines[removed_lines[1] : region.stop],
    ]
    return _keep_last_line_end(out, lines, region)


def merged(
    old: Sequence[str], new: Sequence[str], target: Sequence[str]
) -> list[tuple[str, int]] | None:
    """The change from ``old`` to ``new`` made in ``target``, as the lines
    to write: ``("target", i)`` or ``("new", j)``. Each line the change
    removes must be in ``target`` (found by a line diff of ``old`` and
    ``target``), the lines of one change together; None where one is not.
    Where ``target`` is ``old``, the result is ``new``."""
    at: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(a=old, b=target, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        at.update((a + k, b + k) for k in range(size))
    plan: list[tuple[str, int]] = []
    done = 0  # target lines written so far
    changes = difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
    for tag, a1, a2, b1, b2 in changes:
        if tag == "equal":
            continue
        if a2 > a1:
            found = [at.get(a) for a in range(a1, a2)]
            if None in found:
                return None
            first = found[0]
            assert first is not None
            if found != list(range(first, first + len(found))):
                return None
            start, stop = first, first + len(found)
        else:
            if a1 > 0 and a1 - 1 in at:
                start = at[a1 - 1] + 1
            elif a1 < len(old) and a1 in at:
                start = at[a1]
            elif not old or a1 == 0:
                start = 0 if a1 == 0 else len(target)
            else:
                return None
            stop = start
        if start < done:
            return None
        plan += [("target", i) for i in range(done, start)]
        plan += [("new", j) for j in range(b1, b2)]
        done = stop
    plan += [("target", i) for i in range(done, len(target))]
    return plan


def split(text: str) -> list[str]:
    """Recorded code's lines (only ``\\n`` ends one there)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _parsed(new: Sequence[str]) -> list[ast.stmt]:
    """The statements of ``new`` (dedented code; a header alone is read with
    a placeholder block)."""
    text = "\n".join(new) + "\n"
    for attempt in (text, text + "    ...\n"):
        try:
            return ast.parse(attempt).body
        except SyntaxError:
            continue
    return []


def _statement_lines(new: Sequence[str]) -> list[int]:
    """The 0-based lines of ``new`` (dedented code) that hold a statement."""
    found: list[int] = []
    for node in _parsed(new):
        last = min(node.end_lineno or node.lineno, len(new))
        found.extend(range(first_line(node) - 1, last))
    return found


def written_lines(
    new: Sequence[str],
    region: Region,
    newline: str,
    raw: frozenset[int] | None = None,
) -> list[str]:
    """Each line of ``new`` as it goes into the region: at the region's
    indentation (a line inside a string, ``raw`` where given, and a blank
    line as they are), the first line an ``elif`` where the region's first
    statement was one."""
    body = _parsed(new) if raw is None else []
    if raw is None:
        raw = frozenset(string_lines(body))
    elif_line = first_line(body[0]) - 1 if body and region.elif_line >= 0 else -1
    out = []
    for index, line in enumerate(new):
        if index in raw or not line.strip():
            out.append(line + newline)
            continue
        if index == elif_line and line.startswith("if"):
            line = "el" + line
        out.append(region.indent + line + newline)
    return out


def _keep_last_line_end(
    out: list[str], lines: Sequence[str], region: Region
) -> list[str]:
    """A file without a newline at its end keeps it that way."""
    unended = bool(lines) and not lines[-1].endswith(("\n", "\r"))
    if out and unended and region.stop == len(lines):
        out[-1] = out[-1].rstrip("\r\n")
    return out

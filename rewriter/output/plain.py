"""Text for a pipe or a log, written without rich.

Pipelines read most of this tool's output, and rich (its import and its table
layout) cost about a third of a cold ``status``. Where the output is not a
terminal there is no colour to draw, so the commands print through
:class:`PlainConsole`: the same markup strings, with rich's tags removed by
rich's own rules, and :class:`PlainTable` lays a table out, for a pipe and,
fitted to its width, for a terminal. ``tests/test_output.py`` holds the two
renderers to the same text.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import IO, Any

#: rich's tag syntax (``rich.markup.RE_TAGS``): ``[style]``, ``[/]``, with an
#: even number of backslashes before it; an odd number makes it literal text.
_TAG = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_ESCAPABLE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def escape(text: str) -> str:
    """What ``rich.markup.escape`` returns: ``text`` printed as it is."""
    text = _ESCAPABLE.sub(lambda m: f"{m[1]}{m[1]}\\{m[2]}", text)
    if text.endswith("\\") and not text.endswith("\\\\"):
        return text + "\\"
    return text


def strip_markup(markup: str) -> str:
    """The text rich shows for ``markup``, without its styles."""
    pieces = []
    position = 0
    for match in _TAG.finditer(markup):
        full, backslashes, _tag = match.groups()
        start, end = match.span()
        pieces.append(markup[position:start])
        kept, literal = divmod(len(backslashes), 2)
        pieces.append("\\" * kept)
        if literal:
            pieces.append(full[len(backslashes) :])
        position = end
    pieces.append(markup[position:])
    return "".join(pieces)


#: A space inside one field (``import StageMissingLayer``, a symbol): the
#: table never breaks a line there, and shows it as a space.
FIELD_SPACE = "\u00a0"


#: A field: what lies between spaces (not FIELD_SPACE, which ``\\S`` would
#: take for one).
_FIELD = re.compile(r"[^ \t\n]+")


def one_field(text: str) -> str:
    """``text`` as one field of a table cell: wrapped whole, or not at all."""
    return text.replace(" ", FIELD_SPACE)


class PlainTable:
    """Rows of cells laid out in columns two spaces apart, fitted to a width.

    The one table layout of every command, in a pipe (``width=None``: lines as
    long as they need, never padded at the end) and on a terminal (rich's
    console asks for the table at its width; see ``__rich_console__``). A
    table wider than that breaks only between whole fields: the last column's
    text wraps at spaces; if one of its fields (a long ``path:line`` or
    symbol) is too long to sit beside the other columns, that column goes
    under them, ``STACK`` columns in, for every row (and a field longer than
    the line gets a line of its own); columns that do not fit side by side
    are shown in groups, each with the first column again. ``boxed`` is kept
    for the callers' sake: no box is drawn. Cells are rich markup; a pipe gets
    their text without the styles.
    """

    def __init__(
        self, *, box: Any = "default", show_header: bool = True, **_style: Any
    ) -> None:
        self.show_header = show_header
        self.headers: list[str] = []
        self.rows: list[list[str]] = []

    def add_column(self, header: str = "", **_style: Any) -> None:
        self.headers.append(header)

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))

    def _cells(self) -> list[list[str]]:
        header = [f"[bold]{escape(h)}[/]" for h in self.headers]
        return [header, *self.rows] if self.show_header else list(self.rows)

    def lines(self, width: int | None = None) -> list[str]:
        """The table as plain lines, fitted to ``width`` (None: unbounded)."""
        cells = self._cells()
        plain = [[strip_markup(cell) for cell in row] for row in cells]
        return [
            _place([(x, plain[r][c][a:b]) for x, r, c, a, b in segments]).replace(
                FIELD_SPACE, " "
            )
            for segments in fit(plain, width, len)
        ]

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.cells import cell_len
        from rich.text import Text

        cells = self._cells()
        styled = [
            [Text.from_markup(cell, emoji=False) for cell in row] for row in cells
        ]
        plain = [[text.plain for text in row] for row in styled]
        for segments in fit(plain, options.max_width, cell_len):
            # A field longer than the terminal is wide (a path of 84
            # characters) is on a line of its own: folded there, never cut.
            line = Text(no_wrap=False, overflow="fold", end="\n")
            for x, r, c, start, stop in segments:
                if start == stop:
                    continue
                line.append(" " * max(0, x - cell_len(line.plain)))
                line.append_text(styled[r][c][start:stop])
            line.rstrip()
            line.plain = line.plain.replace(FIELD_SPACE, " ")  # spans keep
            yield line


def _place(pieces: list[tuple[int, str]]) -> str:
    line = ""
    for x, text in pieces:
        if text:
            line = line.ljust(x) + text
    return line.rstrip()


#: Columns are this far apart.
GAP = 2
#: The least width the last column's text is wrapped into before the columns
#: are shown in groups instead.
MIN_LAST = 24

#: How far in a last column goes when it is stacked under the others.
STACK = 4
#: Where a field too long for its column goes on a line of its own.
OWN_LINE = (8, 4, 0)

Segment = tuple[int, int, int, int, int]  # x, row, column, start, stop


def fit(
    cells: list[list[str]], width: int | None, measure: Any = len
) -> list[list[Segment]]:
    """Where each piece of each cell goes: one list of segments per line.

    ``cells`` are plain text (a cell may hold several lines). With ``width``
    None nothing is wrapped; otherwise no line is wider than ``width`` unless
    a single field is.
    """
    if not cells or not cells[0]:
        return []
    columns = len(cells[0])
    widths = [
        max((measure(part) for row in cells for part in row[c].split("\n")), default=0)
        for c in range(columns)
    ]
    if width is None or _span(widths) <= width:
        return _rows(cells, widths, None, list(range(columns)))
    groups = _groups(widths, width)
    out: list[list[Segment]] = []
    for number, group in enumerate(groups):
        if number:
            out.append([])
        flowing = group[-1] == columns - 1
        out += _rows(cells, widths, width if flowing else None, group, measure)
    return out


def _span(widths: list[int]) -> int:
    return sum(widths) + GAP * (len(widths) - 1)


def _groups(widths: list[int], width: int) -> list[list[int]]:
    """Columns shown side by side, each group led by the first column; the
    last column may be narrower than its text (it wraps)."""
    groups: list[list[int]] = []
    current = [0]
    for column in range(1, len(widths)):
        need = widths[column] if column < len(widths) - 1 else MIN_LAST
        trial = [widths[c] for c in current] + [min(widths[column], need)]
        if _span(trial) > width and len(current) > 1:
            groups.append(current)
            current = [0]
        current.append(column)
    groups.append(current)
    return groups


def _rows(
    cells: list[list[str]],
    widths: list[int],
    width: int | None,
    group: list[int],
    measure: Any = len,
) -> list[list[Segment]]:
    """The lines of ``cells`` in the columns ``group``; the last of them wraps
    into what is left of ``width`` (None: it does not)."""
    xs, x = [], 0
    for column in group:
        xs.append(x)
        x += widths[column] + GAP
    if (
        width is not None
        and len(group) > 1
        and _longest_field(cells, group[-1], measure) > width - xs[-1]
    ):
        return _stacked(cells, widths, width, group, measure)
    out: list[list[Segment]] = []
    for r, row in enumerate(cells):
        if len(group) < len(row) and not any(row[c] for c in group[1:]):
            continue  # nothing of this row in this group of columns
        per_column = []
        for i, column in enumerate(group):
            last = i == len(group) - 1
            room = None if width is None or not last else width - xs[i]
            per_column.append(
                _wrap(row[column], xs[i], room, width, measure, r, column)
            )
        for depth in range(max(len(pieces) for pieces in per_column)):
            out.append([pieces[depth] for pieces in per_column if depth < len(pieces)])
    return out


def _longest_field(cells: list[list[str]], column: int, measure: Any) -> int:
    return max(
        (measure(field) for row in cells for field in _FIELD.findall(row[column])),
        default=0,
    )


def _stacked(
    cells: list[list[str]],
    widths: list[int],
    width: int,
    group: list[int],
    measure: Any,
) -> list[list[Segment]]:
    """A last column with a field too long to sit beside the others (a long
    location) goes under them instead, ``STACK`` columns in, every row alike:
    the other columns on a line, then that column's lines. A row that only
    qualifies the one above (its first column empty: a part's state) keeps
    its cells on one line, the last column's text after them."""
    *leading, last = group
    xs, x = [], 0
    for column in leading:
        xs.append(x)
        x += widths[column] + GAP
    out: list[list[Segment]] = []
    for r, row in enumerate(cells):
        if len(group) < len(row) and not any(row[c] for c in group[1:]):
            continue
        beside = _beside(row, leading, last, r, width, measure)
        if beside:
            out += beside
            continue
        if any(row[c] for c in leading):
            per_column = [
                _wrap(row[c], xs[i], None, width, measure, r, c)
                for i, c in enumerate(leading)
            ]
            for depth in range(max(len(pieces) for pieces in per_column)):
                out.append(
                    [pieces[depth] for pieces in per_column if depth < len(pieces)]
                )
        if row[last]:
            out += [
                [piece]
                for piece in _wrap(
                    row[last], STACK, width - STACK, width, measure, r, last
                )
            ]
    return out


def _beside(
    row: list[str],
    leading: list[int],
    last: int,
    r: int,
    width: int,
    measure: Any,
) -> list[list[Segment]]:
    """A stacked row whose first column is empty, on one line at ``STACK``:
    its other cells, then the last column's text wrapped into what is left
    (its own indentation dropped: the cells before it stand in for it).
    Empty where the row is not such a row, or where that leaves too little
    room for the last column (it then goes under them, as every row does)."""
    cells = [c for c in leading[1:] if row[c].strip()]
    if row[leading[0]] or not cells or not row[last].strip() or "\n" in row[last]:
        return []
    out: list[Segment] = []
    x = STACK
    for c in cells:
        start = len(row[c]) - len(row[c].lstrip(" "))
        out.append((x, r, c, start, len(row[c].rstrip(" "))))
        x += measure(row[c].strip()) + GAP
    if width - x < MIN_LAST:
        return []
    indent = len(row[last]) - len(row[last].lstrip(" "))
    text = row[last][indent:]
    pieces = _wrap(text, x, width - x, width, measure, r, last)
    first = [
        *out,
        *((px, pr, pc, a + indent, b + indent) for px, pr, pc, a, b in pieces[:1]),
    ]
    rest = [[(px, pr, pc, a + indent, b + indent)] for px, pr, pc, a, b in pieces[1:]]
    return [first, *rest]


def _wrap(
    text: str,
    x: int,
    room: int | None,
    width: int | None,
    measure: Any,
    r: int,
    c: int,
) -> list[Segment]:
    """One segment per line of a cell: its own lines, each wrapped into
    ``room`` at spaces. A field longer than ``room`` gets a line of its own,
    indented by one of ``OWN_LINE`` (the most that lets it fit)."""
    out: list[Segment] = []
    offset = 0
    for part in text.split("\n"):
        if room is None or measure(part) <= room:
            out.append((x, r, c, offset, offset + len(part)))
            offset += len(part) + 1
            continue
        indent = len(part) - len(part.lstrip(" "))
        fields = [m.span() for m in _FIELD.finditer(part)]
        start = stop = None
        for begin, end in fields:
            if start is not None and measure(part[start:end]) + indent <= room:
                stop = end
                continue
            if start is not None:
                out.append((x + indent, r, c, offset + start, offset + stop))
            start, stop = begin, end
            if measure(part[begin:end]) + indent > room:
                assert width is not None
                size = measure(part[begin:end])
                own = next((i for i in OWN_LINE if i + size <= width), 0)
                out.append((own, r, c, offset + begin, offset + end))
                start = stop = None
        if start is not None:
            out.append((x + indent, r, c, offset + start, offset + stop))
        offset += len(part) + 1
    return out


class _NoStatus:
    def update(self, *_text: Any, **_style: Any) -> None:
        pass


class PlainConsole:
    """The part of ``rich.console.Console`` the commands use, for a pipe."""

    #: ``rich.console.Console.is_terminal``: this console never is one.
    is_terminal = False

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    @contextlib.contextmanager
    def status(self, *_text: Any, **_style: Any) -> Iterator[_NoStatus]:
        """rich's spinner, which draws nothing where the output is not a terminal.

        What a long step is doing reaches a log as lines instead (``note``).
        """
        yield _NoStatus()

    def print(self, *objects: Any, markup: bool = True, **_style: Any) -> None:
        texts = []
        for thing in objects:
            if isinstance(thing, PlainTable):
                texts.append("\n".join(thing.lines()))
            elif markup:
                texts.append(strip_markup(str(thing)))
            else:
                texts.append(str(thing))
        text = " ".join(texts)
        self.stream.write("\n".join(line.rstrip(" ") for line in text.split("\n")))
        self.stream.write("\n")
        self.stream.flush()


def new_table(console: Any, boxed: bool = False) -> PlainTable:
    """A table for ``console``, a terminal's (rich) or a pipe's: the same
    layout, fitted to the terminal's width there (``boxed`` draws nothing)."""
    return PlainTable(box="default" if boxed else None)

"""Text for a pipe or a log, written without rich.

Pipelines read most of this tool's output, and rich (its import and its table
layout) cost about a third of a cold ``status``. Where the output is not a
terminal there is no colour to draw, so the commands print through
:class:`PlainConsole`: the same markup strings, with rich's tags removed by
rich's own rules, and :class:`PlainTable` lays a table out as rich does on a
console too wide to fold. ``tests/test_output.py`` holds the two renderers to
the same text.
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


class PlainTable:
    """Rows of cells laid out as ``rich.table.Table`` lays them out unfolded.

    Two layouts are used here: ``box=None`` (columns two spaces apart) and
    rich's default box with ``show_edge=False`` (``│`` between columns and a
    ``━━╇━━`` rule under the header). Styles are ignored; cells are markup.
    """

    def __init__(
        self, *, box: Any = "default", show_header: bool = True, **_style: Any
    ) -> None:
        self.boxed = box is not None
        self.show_header = show_header
        self.headers: list[str] = []
        self.rows: list[list[str]] = []

    def add_column(self, header: str = "", **_style: Any) -> None:
        self.headers.append(header)

    def add_row(self, *cells: str) -> None:
        self.rows.append([strip_markup(cell) for cell in cells])

    def lines(self) -> list[str]:
        rows = [self.headers] if self.show_header else []
        rows += self.rows
        widths = [
            max((len(line) for row in rows for line in row[i].split("\n")), default=0)
            for i in range(len(self.headers))
        ]
        out = []
        for number, row in enumerate(rows):
            split = [cell.split("\n") for cell in row]
            for depth in range(max(len(cell) for cell in split)):
                texts = [
                    (cell[depth] if depth < len(cell) else "").ljust(width)
                    for cell, width in zip(split, widths, strict=True)
                ]
                bar = "┃" if self.show_header and number == 0 else "│"
                out.append((f" {bar} " if self.boxed else "  ").join(texts).rstrip())
            if self.boxed and self.show_header and number == 0:
                rules = ["━" * (width + 2) for width in widths]
                rules[0] = rules[0][1:]
                rules[-1] = rules[-1][1:]
                out.append("╇".join(rules))
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


def new_table(console: Any, boxed: bool = False) -> Any:
    """A table for ``console``: rich's on a terminal, :class:`PlainTable` elsewhere.

    ``boxed``: rules between columns and under the header (rich's default box,
    no outer edge); otherwise columns two spaces apart and a bold header.
    """
    if isinstance(console, PlainConsole):
        return PlainTable(box="default" if boxed else None)
    from rich.table import Table

    if boxed:
        return Table(show_edge=False, pad_edge=False)
    return Table(show_header=True, header_style="bold", box=None, pad_edge=False)

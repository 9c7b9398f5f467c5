"""Progress and consoles that suit where the output goes.

On a terminal: rich's live progress bars and styled text. In a pipe or a log
(CI): plain lines written without rich, never wrapped, never padded with
trailing spaces, and progress as a line on stderr at most every few seconds,
so a long step is never silent and a log is never flooded.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Literal

from deepstack_patch.output.plain import PlainConsole

if TYPE_CHECKING:  # rich is imported for a terminal only, not at start-up
    from rich.console import Console

#: ``update(done, total, description)``: how far a step has come.
Update = Callable[..., None]

#: Seconds between two plain progress lines for one step.
PLAIN_INTERVAL = 3.0

#: Set for ``--format json``: a machine reads the output, and a document
#: followed by chatter (``2>&1 | jq``) is worse than silence; errors still print.
quiet = False


def is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def console_for(stream: IO[str]) -> Console | PlainConsole:
    """A console for ``stream``: rich on a terminal, plain long lines elsewhere."""
    if not is_terminal(stream):
        return PlainConsole(stream)
    from rich.console import Console

    return Console(file=stream, highlight=False, soft_wrap=False)


def note(text: str) -> None:
    """One plain line on stderr (what a long step is doing)."""
    if quiet:
        return
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def warn(text: str) -> None:
    """A warning on stderr (yellow on a terminal)."""
    from deepstack_patch.output.plain import escape

    console_for(sys.stderr).print(f"[yellow]warning:[/] {escape(text)}")


@contextlib.contextmanager
def progress(
    label: str, unit: Literal["bytes", "items"] = "bytes", after: float = 0.0
) -> Iterator[Update]:
    """Report a long step's progress; yields ``update(done, total, description)``.

    On a terminal this is a transient rich bar on stderr. Otherwise it prints
    ``label ... 45%`` (or ``label ... 2/4``) at most every few seconds and a
    last line when the step ends; with ``after``, nothing before that many
    seconds have passed (a step that is quick as a rule stays silent).
    """
    if quiet:
        yield lambda *args, **kwargs: None
        return
    if is_terminal(sys.stderr):
        with _rich_progress(label, unit, after) as update:
            yield update
        return
    started = time.monotonic()
    # As if a line was shown just so long ago that the next is due once
    # ``after`` seconds have passed (at the first update without it).
    state = {"last": started + after - PLAIN_INTERVAL if after else 0.0, "line": ""}

    def update(done: int, total: int | None = None, description: str = "") -> None:
        line = f"{label} ... {_amount(done, total, unit)}"
        if description:
            line += f" ({description})"
        state["line"] = line
        now = time.monotonic()
        if now - float(state["last"]) >= PLAIN_INTERVAL or (total and done >= total):
            state["last"] = now
            note(line)
            state["line"] = ""

    yield update
    if state["line"] and time.monotonic() - started >= after:
        note(str(state["line"]))


@contextlib.contextmanager
def files_read() -> Iterator[Callable[[str], None]]:
    """A plan's progress (``plan_tree(progress=...)``): each file read is
    counted and named. A first run with dozens of derived patches takes
    seconds; piped, a line every few seconds, none for a quick run."""
    import itertools

    with progress(
        "recognising the patches: files read", unit="items", after=PLAIN_INTERVAL
    ) as update:
        files = itertools.count(1)
        yield lambda relpath: update(next(files), None, relpath)


def _amount(done: int, total: int | None, unit: str) -> str:
    if unit == "items":
        return f"{done}/{total}" if total else str(done)
    if total:
        return f"{100 * done // total}%"
    return f"{done / 1e6:.1f} MB"


@contextlib.contextmanager
def _rich_progress(label: str, unit: str, after: float = 0.0) -> Iterator[Update]:
    """A transient rich bar on stderr, shown from the first update once
    ``after`` seconds have passed (a quick step draws nothing)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    columns = (
        [*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn()]
        if unit == "bytes"
        else [
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
        ]
    )
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        shown: list[tuple[Progress, object]] = []

        def update(done: int, total: int | None = None, description: str = "") -> None:
            if not shown:
                if time.monotonic() - started < after:
                    return
                bar = stack.enter_context(
                    Progress(*columns, console=console, transient=True)
                )
                task = bar.add_task(label if unit == "bytes" else "", total=None)
                shown.append((bar, task))
            bar, task = shown[0]
            fields = {"description": description} if unit == "items" else {}
            bar.update(task, completed=done, total=total, **fields)  # type: ignore[arg-type]

        yield update

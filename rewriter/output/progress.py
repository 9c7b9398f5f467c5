"""One progress display for everything that takes more than a second.

Downloads show bytes and speed; batches of work (the release matrix) show a
bar with done/total and the last item. Both draw on stderr and vanish when
done, so stdout stays clean for pipes and JSON.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class ProgressTask:
    """The handle a ``with progress(...)`` block reports through."""

    def __init__(self, display: Any, task: Any) -> None:
        self._display = display
        self._task = task

    def transferred(self, done: int, total: int | None) -> None:
        """Bytes so far of ``total`` (None: unknown)."""
        self._display.update(self._task, completed=done, total=total)

    def step(self, description: str) -> None:
        """One item done; ``description`` says which, and how it went."""
        self._display.update(self._task, advance=1, description=description)


@contextlib.contextmanager
def progress(
    label: str, *, total: int | None = None, transfer: bool = True
) -> Iterator[ProgressTask]:
    """A transient progress display on stderr.

    ``transfer``: a download named ``label`` (bytes, speed); otherwise a bar
    of ``total`` items headed ``label``.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    if transfer:
        columns = (*Progress.get_default_columns(), DownloadColumn())
        columns += (TransferSpeedColumn(),)
        description = label
    else:
        columns = (TextColumn(label), BarColumn(), MofNCompleteColumn())
        columns += (TimeElapsedColumn(), TextColumn("{task.description}"))
        description = ""
    console = Console(stderr=True, highlight=False)
    with Progress(*columns, console=console, transient=True) as display:
        yield ProgressTask(display, display.add_task(description, total=total))

"""The console entry point: Ctrl-C and a closed pipe are handled before the
command line loads.

``deepstack_patch.cli`` imports click and the command line's own modules
when it is imported, which takes a good part of the first tenth of a second;
a Ctrl-C then would be Python's traceback. This module imports nothing
beyond what Python has already loaded, so all that comes before its handling
is Python's own start-up and loading this module and the package's empty
``__init__`` (well under a millisecond).
"""

from __future__ import annotations

import io
import os
import sys

# Not `from typing import TYPE_CHECKING`: typing takes milliseconds to import,
# all of them before the handling below is in place. Type checkers read this
# name as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

#: Ctrl-C's exit code, as a shell reports a process SIGINT ended; the same
#: as deepstack_patch.cli.common's, which cannot be imported before click is.
EXIT_INTERRUPTED = 130


def interrupted() -> NoReturn:
    """Ctrl-C: one line, and 130 (cli.common.interrupted, said before it loads)."""
    sys.stderr.write("interrupted\n")
    sys.exit(EXIT_INTERRUPTED)


class _UntilTheReaderGoes(io.RawIOBase):
    """Writes to a file descriptor; once its reader has gone (``| head``),
    the descriptor is pointed at the null device and the rest goes there.

    Python ignores SIGPIPE, so a write into a pipe nobody reads raises
    BrokenPipeError wherever it happens: in the middle of a table, or in
    Python's own flush at exit. Caught here, once, under every print, it ends
    nothing: the command finishes as if its output went to /dev/null, with
    the exit code it would have had (an apply that wrote says 0, a status
    that found a drifted target says 2). Processes started later inherit the
    null device, not a broken pipe.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: bytes) -> int:  # type: ignore[override]
        try:
            return os.write(self._fd, data)
        except BrokenPipeError:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._fd)
            os.close(null)
            return len(data)


def _survive_closed_pipe(stream: io.TextIOWrapper) -> io.TextIOWrapper:
    """``stream`` (stdout or stderr), the same but for a reader that goes."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return stream  # not a file descriptor (an embedding program's stream)
    stream.flush()
    return io.TextIOWrapper(
        io.BufferedWriter(_UntilTheReaderGoes(fd)),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=stream.line_buffering,
        write_through=stream.write_through,
    )


def main() -> NoReturn:
    """Load the command line and run it; Ctrl-C at any point ends in 130
    (but after ``apply``'s write, which says so and ends in 0: cli/apply.py),
    and a reader that closes the pipe changes nothing but what is printed."""
    sys.stdout = _survive_closed_pipe(sys.stdout)
    sys.stderr = _survive_closed_pipe(sys.stderr)
    try:
        from deepstack_patch.cli import main as command_line

        command_line()
    except KeyboardInterrupt:
        interrupted()
    finally:
        _skip_the_last_collection()
    # The command line exits by itself (sys.exit), whatever happened.
    sys.exit(0)


def _skip_the_last_collection() -> None:
    """Leave every object alive now out of the collection Python makes on
    its way out. That collection walks every object still held (the trees,
    closures and caches a plan keeps for the process's life) to find the
    few cycles among them: a second of a first ``status`` of 40 derived
    fixes, after its last line was printed. Nothing needs it: files are
    written and closed by then, servers stopped, and ``atexit`` handlers
    and objects freed by reference counting still run as before."""
    import gc  # built in: no import time

    gc.freeze()

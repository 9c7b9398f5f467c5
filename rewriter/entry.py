"""The console entry point: Ctrl-C is handled before the command line loads.

``deepstack_patch.cli`` imports click and the command line's own modules
when it is imported, which takes a good part of the first tenth of a second;
a Ctrl-C then would be Python's traceback. This module imports nothing
beyond what Python has already loaded, so all that comes before its handling
is Python's own start-up and loading this module and the package's empty
``__init__`` (well under a millisecond).
"""

from __future__ import annotations

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


def main() -> NoReturn:
    """Load the command line and run it; Ctrl-C at any point ends in 130."""
    try:
        from deepstack_patch.cli import main as command_line

        command_line()
    except KeyboardInterrupt:
        interrupted()
    # The command line exits by itself (sys.exit), whatever happened.
    sys.exit(0)

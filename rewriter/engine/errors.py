"""Errors a user can meet: each says what was expected, where, and what to do."""

from __future__ import annotations

import errno
from pathlib import Path


class DeepstackError(Exception):
    """An error the command line reports as ``error: ...`` with exit code 2.

    ``hint`` is the fix to try, printed on its own line. ``path`` and
    ``line`` say where, when the error is about a place in a file; the text
    form is then ``error: path:line: message``.
    """

    def __init__(
        self,
        message: str,
        hint: str = "",
        *,
        path: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.path = path
        self.line = line

    @property
    def located(self) -> str:
        """The message with its ``path:line:`` prefix, if it has a place."""
        if self.path is None:
            return self.message
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"

    def __str__(self) -> str:
        return f"{self.located}\nhint: {self.hint}" if self.hint else self.located


def os_error_hint(exc: OSError, folder: Path) -> str:
    """The fix to try for a file-system error met while writing in ``folder``."""
    match exc.errno:
        case errno.ENOSPC | errno.EDQUOT:
            return f"the disk holding {folder} is full: free some space and run again"
        case errno.EROFS:
            return (
                f"{folder} is on a read-only file system: choose another folder, "
                "or remount it writable"
            )
        case errno.EACCES | errno.EPERM:
            return (
                f"{folder} is not writable: chmod u+w {folder}, or choose "
                "another folder"
            )
        case errno.ENOTEMPTY | errno.EEXIST | errno.ENOENT:
            return (
                f"another program changed {folder} during the run; "
                "run again when it is done"
            )
        case _:
            return "check the file system and run again"


def writable_folder_of(path: Path) -> Path:
    """The folder a failed write into ``path`` needed: its first existing one."""
    for candidate in [path, *path.parents]:
        if candidate.is_dir():
            return candidate
    return path

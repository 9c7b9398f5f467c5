"""Errors a user can meet: each says what was expected, where, and what to do."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
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
            return permission_hint(folder, "choose another folder")
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


def reinstall_hint(version: str | None, then: str = "") -> str:
    """Reinstall the release an install says it is (pinned where known)."""
    pinned = f"vllm=={version}" if version and version != "unknown" else "vllm"
    return f"reinstall vllm (pip install --force-reinstall --no-deps {pinned}){then}"


#: The way round a site-packages folder this user may not write that needs
#: nobody's rights at run time: change the install where its image is built.
IMAGE_BUILD = (
    "run it in the image build instead "
    "(e.g. RUN deepstack-patch apply --installed in the Dockerfile)"
)


def permission_hint(
    path: Path | Sequence[Path],
    instead: str,
    *,
    status: os.stat_result | None = None,
    euid: int | None = None,
) -> str:
    """The fix to try when this user may not write ``path`` (or several
    paths, named together; the first one's owner speaks for all); ``instead``
    is the way round it that needs no one's rights (e.g. patch a copy).

    ``chmod u+w`` is advice only for the owner, and for root, who may chmod
    anything: anyone else cannot do it, so is told whose ``path`` is and to
    run as that user. ``status`` and ``euid`` stand in for ``path``'s stat
    and this process's user (tests).
    """
    paths = [path] if isinstance(path, Path) else [*path]
    named = " ".join(map(str, paths))
    # Several paths are listed once, in the command to run.
    subject, is_ = (str(paths[0]), "is") if len(paths) == 1 else ("they", "are")
    if euid is None and hasattr(os, "geteuid"):
        euid = os.geteuid()
    if status is None:
        try:
            status = paths[0].stat()
        except OSError:
            status = None
    if status is None or euid is None:  # whose it is cannot be known
        return (
            f"{subject} {is_} not writable by this user: make "
            f"{'it' if len(paths) == 1 else f'them ({named})'} writable, or {instead}"
        )
    if euid in (0, status.st_uid):
        if len(paths) > 1:
            return f"make them writable: chmod u+w {named}, or {instead}"
        return f"{subject} {is_} not writable: chmod u+w {named}, or {instead}"
    owner = _user_name(status.st_uid)
    match status.st_uid:
        case 0:
            run_as = "sudo deepstack-patch …"
        case uid if owner.startswith("uid "):
            run_as = f"sudo -u '#{uid}' deepstack-patch …"
        case _:
            run_as = f"sudo -u {owner} deepstack-patch …"
    return (
        f"{subject} {'belongs' if len(paths) == 1 else 'belong'} to {owner}, and "
        "deepstack-patch runs as "
        f"{_user_name(euid)}: run it as {owner} ({run_as}), or {instead}"
    )


def _user_name(uid: int) -> str:
    """The user's name, or ``uid N`` where the system has none for it."""
    try:
        import pwd
    except ImportError:  # not a POSIX system
        return f"uid {uid}"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class RewriteRefused(Exception):
    """A patch's rewrite did not produce a shape the engine can accept."""

"""One writer per tree: an exclusive lock held for the length of a write.

``fcntl.flock`` on a file in the user's cache (the tree gains no stray file),
which is what ``filelock`` does on Linux and macOS; taking it directly keeps
``filelock``'s import (about a fifth of a no-op ``apply``'s own work) off the
path every ``apply`` runs. The kernel drops the lock when the process ends,
however it ends. Elsewhere (no ``fcntl``) ``filelock`` takes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError, os_error_hint


@contextlib.contextmanager
def tree_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``root``, or refuse at once if another run does."""
    from deepstack_patch.engine.cache import cache_dir

    locks = cache_dir() / "locks"
    lock_file = locks / _lock_name(root)
    busy = DeepstackError(
        f"another deepstack-patch run is writing to {root}",
        f"wait for it to finish (lock file: {lock_file})",
    )
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        with _filelock(lock_file, busy):
            yield
        return
    try:
        locks.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise DeepstackError(
            f"cannot create the lock file: {exc.strerror}",
            _lock_hint(exc, locks),
            path=str(lock_file),
        ) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy from None
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _lock_name(root: Path) -> str:
    """The tree folder's device and inode: every path to one folder (a
    symlink, another spelling) takes the same lock, and no hash is needed
    (hashlib loads OpenSSL, a few milliseconds of every ``apply``)."""
    try:
        folder = os.stat(root)
    except OSError:
        # Not there (opening the tree reports that): lock by the path's last
        # 32 bytes, in hex, within a file name's length limit.
        return f"{os.fsencode(root).hex()[-64:]}.lock"
    return f"{folder.st_dev:x}-{folder.st_ino:x}.lock"


def _lock_hint(exc: OSError, locks: Path) -> str:
    match exc.errno:
        case errno.ENOSPC | errno.EDQUOT | errno.EROFS | errno.EACCES | errno.EPERM:
            return f"{os_error_hint(exc, locks)}; or set DEEPSTACK_PATCH_CACHE"
    return (
        f"make {locks} a writable folder, or set DEEPSTACK_PATCH_CACHE to one "
        "(the tool keeps its locks, downloads and environments there)"
    )


@contextlib.contextmanager
def _filelock(lock_file: Path, busy: DeepstackError) -> Iterator[None]:
    from filelock import FileLock, Timeout

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise busy from None
    try:
        yield
    finally:
        lock.release()

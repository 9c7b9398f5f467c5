"""All-or-nothing writes of a plan's edits.

Every new file is first staged as a temporary file beside its target (same
directory, so the final rename never crosses a file system), with the
target's permission bits. Only when every file is staged are they renamed into
place, one ``os.replace`` each: a reader, or a process killed midway, sees
each file either entirely old or entirely new. If a rename fails, the files
already replaced get their old bytes back. A rerun finishes an interrupted
run, because states are read from the code.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import FileEdit

#: Test hook: called with each target path just before its rename.
_before_replace = None

_STAGE_SUFFIX = ".deepstack-tmp"


def write_edits(root: Path, edits: Sequence[FileEdit]) -> list[str]:
    """Write every edit or none; return the relative paths written."""
    # Every target is checked before anything is staged, so a refusal leaves
    # no temporary file behind and stale ones are cleared before new ones exist.
    targets = [_checked_target(root, edit) for edit in edits]
    staged: list[tuple[FileEdit, Path, Path]] = []
    try:
        for edit, target in zip(edits, targets, strict=True):
            staged.append((edit, target, _stage(target, edit.new)))
    except BaseException as exc:
        for _, _, temp in staged:
            temp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise DeepstackError(
                f"{edit.relpath}: cannot stage the new content: {exc.strerror}; "
                "nothing was written",
                "check the file system (space, permissions) and run again",
            ) from None
        raise

    replaced: list[tuple[FileEdit, Path]] = []
    try:
        for edit, target, temp in staged:
            if _before_replace is not None:
                _before_replace(target)
            os.replace(temp, target)
            replaced.append((edit, target))
    except BaseException as exc:
        failed = edit.relpath
        done = {target for _, target in replaced}
        for _, target, temp in staged:
            if target not in done:
                temp.unlink(missing_ok=True)
        for edit, target in replaced:
            with contextlib.suppress(OSError):
                os.replace(_stage(target, edit.old), target)
        if isinstance(exc, OSError):
            raise DeepstackError(
                f"{failed}: writing failed: {exc.strerror}; every file was restored",
                "check the file system (space, permissions) and run again",
            ) from None
        raise
    return [edit.relpath for edit, _ in replaced]


def _checked_target(root: Path, edit: FileEdit) -> Path:
    path = root / edit.relpath
    target = path.resolve()
    if not target.is_relative_to(root):
        raise DeepstackError(
            f"{edit.relpath}: is a symlink to {target}, outside the tree {root}",
            "replace the link with a copy of the file before patching",
        )
    try:
        current = target.read_bytes()
    except OSError as exc:
        raise DeepstackError(
            f"{edit.relpath}: cannot read before writing: {exc.strerror}",
            "the tree changed during the run; run again",
        ) from None
    if current != edit.old:
        raise DeepstackError(
            f"{edit.relpath}: changed on disk while the plan was computed",
            "another program is editing the tree; run again when it is done",
        )
    for path, what in ((target.parent, "its folder"), (target, "the file")):
        if not _writable(path):
            raise DeepstackError(
                f"{edit.relpath}: {what} is read-only ({path})",
                f"make it writable (chmod u+w {path}) or patch a copy of the tree",
            )
    _remove_stale_stages(target)
    return target


def _writable(path: Path) -> bool:
    """Whether the user means ``path`` to be written.

    ``os.access`` answers for the kernel, and for root it always says yes, so
    a file someone made read-only (``chmod a-w``) would still be replaced:
    the rename needs only a writable folder. The mode bits say what the owner
    intended, for root too.
    """
    mode = path.stat().st_mode
    return os.access(path, os.W_OK) and bool(mode & _ANY_WRITE)


_ANY_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def _remove_stale_stages(target: Path) -> None:
    """Delete temporary files an interrupted run left beside ``target``.

    A run killed between staging and renaming leaves its staged copies; the
    rerun (under the tree lock, so no other run is staging) removes them so
    the tree ends with no stray file.
    """
    for stale in target.parent.glob(f".{target.name}.*{_STAGE_SUFFIX}"):
        stale.unlink(missing_ok=True)


def _stage(target: Path, content: bytes) -> Path:
    """Write ``content`` to a temporary file beside ``target``, same metadata.

    The rename replaces the file, so everything that belongs to the file
    and not to its bytes is copied onto the new one first: the mode, the
    owner and group (a root run must not leave root-owned files in a user's
    checkout) and the extended attributes (ACLs, labels, user.* tags).
    """
    status = target.stat()
    fd, name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=_STAGE_SUFFIX, dir=target.parent
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        _copy_owner(status, name)
        _copy_xattrs(target, name)
        os.chmod(name, stat.S_IMODE(status.st_mode))
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _copy_owner(status: os.stat_result, name: str) -> None:
    if not hasattr(os, "chown"):
        return
    uid = status.st_uid if os.geteuid() == 0 else -1
    # Without root only the group can change (to one of the user's groups).
    with contextlib.suppress(PermissionError):
        os.chown(name, uid, status.st_gid)


def _copy_xattrs(target: Path, name: str) -> None:
    """Copy every extended attribute the file system lets us read and set."""
    if not hasattr(os, "listxattr"):
        return
    try:
        keys = os.listxattr(target)
    except OSError:  # the file system has no xattr support
        return
    for key in keys:
        # Some attributes are the kernel's to set (security.*, without the
        # capability): keeping the rest beats refusing the whole write.
        with contextlib.suppress(OSError):
            os.setxattr(name, key, os.getxattr(target, key))


@contextlib.contextmanager
def tree_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on a tree for the length of a write.

    The lock file lives in the user's cache, not in the tree, so that the
    tree gains no stray file.
    """
    from deepstack_patch.engine.cache import cache_dir
    from filelock import FileLock, Timeout

    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    lock = FileLock(str(locks / f"{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise DeepstackError(
            f"another deepstack-patch run is writing to {root}",
            f"wait for it to finish (lock file: {lock.lock_file})",
        ) from None
    try:
        yield
    finally:
        lock.release()

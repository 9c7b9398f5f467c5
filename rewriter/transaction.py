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

from .errors import DeepstackError
from .plan import FileEdit

#: Test hook: called with each target path just before its rename.
_before_replace = None


def write_edits(root: Path, edits: Sequence[FileEdit]) -> list[str]:
    """Write every edit or none; return the relative paths written."""
    staged: list[tuple[FileEdit, Path, Path]] = []
    try:
        for edit in edits:
            target = _checked_target(root, edit)
            staged.append((edit, target, _stage(target, edit.new)))
    except BaseException:
        for _, _, temp in staged:
            temp.unlink(missing_ok=True)
        raise

    replaced: list[tuple[FileEdit, Path]] = []
    try:
        for edit, target, temp in staged:
            if _before_replace is not None:
                _before_replace(target)
            os.replace(temp, target)
            replaced.append((edit, target))
    except BaseException as exc:
        done = {target for _, target in replaced}
        for _, target, temp in staged:
            if target not in done:
                temp.unlink(missing_ok=True)
        for edit, target in replaced:
            with contextlib.suppress(OSError):
                os.replace(_stage(target, edit.old), target)
        if isinstance(exc, OSError):
            raise DeepstackError(
                f"writing {target} failed: {exc.strerror}; every file was restored",
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
    if not os.access(target, os.W_OK) or not os.access(target.parent, os.W_OK):
        raise DeepstackError(
            f"{edit.relpath}: is read-only (or its folder is)",
            f"make it writable (chmod u+w {target}) or patch a copy of the tree",
        )
    return target


def _stage(target: Path, content: bytes) -> Path:
    """Write ``content`` to a temporary file beside ``target``, same mode."""
    mode = stat.S_IMODE(target.stat().st_mode)
    fd, name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".deepstack-tmp", dir=target.parent
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(name, mode)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


@contextlib.contextmanager
def tree_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on a tree for the length of a write.

    The lock file lives in the user's cache, not in the tree, so that the
    tree gains no stray file.
    """
    from filelock import FileLock, Timeout
    from platformdirs import user_cache_dir

    locks = Path(user_cache_dir("deepstack-patch")) / "locks"
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

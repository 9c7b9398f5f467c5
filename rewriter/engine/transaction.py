"""All-or-nothing writes of a plan's edits.

Every new file is first staged as a temporary file beside its target (same
directory, so the final rename never crosses a file system), with the
target's permission bits. Only when every file is staged are they renamed into
place, one ``os.replace`` each: a reader, or a process killed midway, sees
each file either entirely old or entirely new. If a rename fails, the files
already replaced get their old bytes back. A rerun finishes an interrupted
run, because states are read from the code.

An installed vLLM also needs files created and removed in the same
transaction (its change record, original bytes, bytecode that cannot be
rebuilt): :class:`ExtraChange`. New files land first and removals last, so a
run killed midway leaves at worst an extra file, never a change without its
record; a failure undoes them with the edits.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.errors import (
    IMAGE_BUILD,
    DeepstackError,
    permission_hint,
)
from deepstack_patch.engine.plan import FileEdit

#: Test hook: called with each target path just before its rename.
_before_replace = None

_STAGE_SUFFIX = ".deepstack-tmp"

#: Who hears that a transaction is complete (every file in place); see
#: :func:`on_commit`.
_commit_listener: contextvars.ContextVar[Callable[[list[str]], None] | None] = (
    contextvars.ContextVar("commit_listener", default=None)
)


@contextlib.contextmanager
def on_commit(listener: Callable[[list[str]], None]) -> Iterator[None]:
    """Call ``listener`` with the paths written when a transaction in this
    block (this thread) is complete.

    Called at the commit point itself, the last step inside the rollback's
    reach: an interrupt before it leaves every file restored, and after it
    every file new. A command that must tell a Ctrl-C after its write from
    one before it (``apply``) listens here; the engine itself does not care.
    """
    token = _commit_listener.set(listener)
    try:
        yield
    finally:
        _commit_listener.reset(token)


@dataclass(frozen=True)
class ExtraChange:
    """A file the transaction creates or removes, beside the edits.

    ``new`` None removes the file (its bytes come back if the transaction
    fails). A created file takes its permission bits from ``mode``, else from
    the file ``like`` (a relative path), and, for root, that file's owner.
    """

    relpath: str
    new: bytes | None
    like: str | None = None
    mode: int | None = None
    #: A file of the plan (a patch adds or deletes it): listed among the
    #: paths written when it is removed too.
    of_plan: bool = False


def write_edits(
    root: Path,
    edits: Sequence[FileEdit],
    extra: Sequence[ExtraChange] = (),
    mtimes: Mapping[str, int] | None = None,
) -> list[str]:
    """Write every edit and extra change or none; return the paths written.

    ``mtimes`` gives some edited files a modification time (nanoseconds),
    set before the rename: bytecode that records its source's mtime is
    compiled for exactly that time.
    """
    # A file a patch adds or deletes is created or removed with the extra
    # changes: new files first, removals last.
    extra = [*_whole_files(root, edits), *extra]
    edits = [edit for edit in edits if edit.action == "change"]
    # Every target is checked before anything is staged, so a refusal leaves
    # no temporary file behind and stale ones are cleared before new ones exist.
    targets = [_checked_target(root, edit) for edit in edits]
    extra_targets = [_checked_extra(root, change) for change in extra]
    _refuse_unwritable(root, targets, extra_targets)
    for target in [*targets, *extra_targets]:
        if target.parent.is_dir():
            _remove_stale_stages(target)
    staged: list[tuple[FileEdit, Path, Path]] = []
    extra_staged: list[_StagedExtra] = []
    try:
        for edit, target in zip(edits, targets, strict=True):
            staged.append((edit, target, _stage(target, edit.new)))
        _set_mtimes(staged, mtimes or {})
        _stage_extras(root, extra, extra_targets, extra_staged)
    except BaseException as exc:
        for _, _, temp in staged:
            temp.unlink(missing_ok=True)
        _discard_extras(extra_staged)
        if isinstance(exc, OSError):
            failed = extra_staged[-1].change.relpath if extra_staged else edit.relpath
            raise DeepstackError(
                f"{failed}: cannot stage the new content: {exc.strerror}; "
                "nothing was written",
                "check the file system (space, permissions) and run again",
            ) from None
        raise

    replaced: list[tuple[FileEdit, Path]] = []
    try:
        # New files first, removals last: a run killed midway leaves at worst
        # an extra file, never a change without its record (inplace.py).
        _commit_extras(extra_staged, creations=True)
        for edit, target, temp in staged:
            if _before_replace is not None:
                _before_replace(target)
            os.replace(temp, target)
            replaced.append((edit, target))
        _commit_extras(extra_staged, creations=False)
        listener = _commit_listener.get()
        if listener is not None:
            listener(_written(replaced, extra_staged))
    except BaseException as exc:
        failed = _failed_step(staged, replaced, extra_staged)
        _undo_extras(extra_staged)
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
    _finish_extras(extra_staged)
    return _written(replaced, extra_staged)


def _whole_files(root: Path, edits: Sequence[FileEdit]) -> list[ExtraChange]:
    """The files the edits add (mode 0644, their folders made as needed) or
    delete (only where the file is still the one the plan read)."""
    changes = []
    for edit in edits:
        if edit.action == "delete":
            _checked_target(root, edit)
        if edit.action != "change":
            new = None if edit.action == "delete" else edit.new
            changes.append(ExtraChange(edit.relpath, new, mode=0o644, of_plan=True))
    return changes


def _written(
    replaced: Sequence[tuple[FileEdit, Path]], extra_staged: Sequence[_StagedExtra]
) -> list[str]:
    """The relative paths a complete transaction wrote: edits, then
    creations, then the plan's files it removed."""
    created = [i.change.relpath for i in extra_staged if i.change.new is not None]
    removed = [
        i.change.relpath
        for i in extra_staged
        if i.change.new is None and i.change.of_plan
    ]
    return [edit.relpath for edit, _ in replaced] + created + removed


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
    return target


def _refuse_unwritable(
    root: Path, targets: Sequence[Path], extra_targets: Sequence[Path]
) -> None:
    """Name every place the run must write and this user may not, at once: a
    read-only tree is made writable in one go, not one path per run. A file
    is replaced by a rename, so its folder must be writable; the file's own
    write bit says whether it is meant to change."""
    places = [p for t in targets for p in (t.parent, t)]
    places += [_existing_ancestor(t.parent) for t in extra_targets]
    unwritable = [p for p in dict.fromkeys(places) if not _writable(p)]
    if not unwritable:
        return
    # No chmod helps on a read-only mount, whoever runs: say what does.
    read_only = next((p for p in unwritable if _on_read_only_mount(p)), None)
    if read_only is not None:
        raise DeepstackError(
            f"{read_only} is on a read-only file system; nothing was written",
            f"remount it writable, or {_way_round(root)}",
        )
    if len(unwritable) == 1:
        (place,) = unwritable
        what = "the folder" if place.is_dir() else "the file"
        message = f"{what} {place} is read-only for this user"
    else:
        names = [_shown(root, place) for place in unwritable]
        message = (
            f"{len(unwritable)} places this run must write are read-only for this "
            f"user (in {root}): {', '.join(names)}"
        )
    raise DeepstackError(
        message + "; nothing was written",
        permission_hint(unwritable, _way_round(root)),
    )


def _shown(root: Path, place: Path) -> str:
    """``place`` relative to ``root`` where it lies inside; a folder ends in /."""
    shown = place.relative_to(root).as_posix() if place.is_relative_to(root) else place
    return f"{shown}/" if place.is_dir() else str(shown)


def _way_round(root: Path) -> str:
    """What works without write access to ``root``: an install (a dist-info
    beside vllm/) is patched where its image is built; a tree, as a copy."""
    if any(root.glob("vllm-*.dist-info")):
        return IMAGE_BUILD
    return "patch a copy of the tree"


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


def _on_read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return False


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


@dataclass
class _StagedExtra:
    change: ExtraChange
    target: Path
    #: The new content beside the target (creation), or the removed file's
    #: bytes moved aside (removal) once committed.
    temp: Path | None = None
    made_dirs: list[Path] | None = None
    committed: bool = False


def _checked_extra(root: Path, change: ExtraChange) -> Path:
    target = root / change.relpath
    if not target.parent.resolve().is_relative_to(root.resolve()):
        raise DeepstackError(
            f"{change.relpath}: lies outside {root} (through a symlink)",
            "replace the link with a real folder before patching",
        )
    exists = target.exists() or target.is_symlink()
    if change.new is not None and exists:
        raise DeepstackError(
            f"{change.relpath}: exists, but this run meant to create it",
            "another program is changing the install; run again when it is done",
        )
    if change.new is None and not exists:
        raise DeepstackError(
            f"{change.relpath}: vanished while the run was planned",
            "another program is changing the install; run again when it is done",
        )
    return target


def _existing_ancestor(folder: Path) -> Path:
    while not folder.exists():
        folder = folder.parent
    return folder


def _stage_extras(
    root: Path,
    extra: Sequence[ExtraChange],
    targets: Sequence[Path],
    staged: list[_StagedExtra],
) -> None:
    for change, target in zip(extra, targets, strict=True):
        item = _StagedExtra(change, target)
        staged.append(item)
        if change.new is None:
            continue
        item.made_dirs = _make_dirs(target.parent)
        fd, name = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=_STAGE_SUFFIX, dir=target.parent
        )
        item.temp = Path(name)
        with os.fdopen(fd, "wb") as handle:
            handle.write(change.new)
            handle.flush()
            os.fsync(handle.fileno())
        like = root / change.like if change.like else None
        mode = change.mode
        if mode is None:
            mode = stat.S_IMODE(like.stat().st_mode) if like else 0o644
        os.chmod(name, mode)
        if like is not None and os.geteuid() == 0:
            info = like.stat()
            os.chown(name, info.st_uid, info.st_gid)


def _make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those made, deepest first."""
    missing: list[Path] = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir()
    return missing


def _set_mtimes(
    staged: Sequence[tuple[FileEdit, Path, Path]], mtimes: Mapping[str, int]
) -> None:
    for edit, _, temp in staged:
        if edit.relpath in mtimes:
            os.utime(temp, ns=(mtimes[edit.relpath], mtimes[edit.relpath]))


def _failed_step(
    staged: Sequence[tuple[FileEdit, Path, Path]],
    replaced: Sequence[tuple[FileEdit, Path]],
    extra: Sequence[_StagedExtra],
) -> str:
    """The path whose commit failed (creations, then edits, then removals)."""
    pending = [i for i in extra if not i.committed]
    created = [i.change.relpath for i in pending if i.change.new is not None]
    if created:
        return created[0]
    if len(replaced) < len(staged):
        return staged[len(replaced)][0].relpath
    return pending[0].change.relpath if pending else "(unknown)"


def _commit_extras(staged: Sequence[_StagedExtra], creations: bool) -> None:
    for item in staged:
        if (item.change.new is not None) != creations:
            continue
        if _before_replace is not None:
            _before_replace(item.target)
        if item.change.new is None:
            fd, name = tempfile.mkstemp(
                prefix=f".{item.target.name}.",
                suffix=_STAGE_SUFFIX,
                dir=item.target.parent,
            )
            os.close(fd)
            item.temp = Path(name)
            os.replace(item.target, item.temp)
        else:
            assert item.temp is not None
            os.replace(item.temp, item.target)
        item.committed = True


def _undo_extras(staged: Sequence[_StagedExtra]) -> None:
    for item in reversed(staged):
        if not item.committed:
            continue
        with contextlib.suppress(OSError):
            if item.change.new is None and item.temp is not None:
                os.replace(item.temp, item.target)
            else:
                item.target.unlink()
            item.committed = False
    _discard_extras(staged)


def _discard_extras(staged: Sequence[_StagedExtra]) -> None:
    """Remove what staging made: temporary files, then the folders made."""
    for item in staged:
        # A removed file whose rollback failed keeps its only copy in temp.
        if item.temp is not None and not item.committed:
            item.temp.unlink(missing_ok=True)
    for item in reversed(staged):
        for folder in item.made_dirs or []:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _finish_extras(staged: Sequence[_StagedExtra]) -> None:
    """Drop the removed files' bytes kept aside for a rollback."""
    for item in staged:
        if item.change.new is None and item.temp is not None:
            item.temp.unlink(missing_ok=True)

"""Release archives: the one tar extractor (whole releases and partial ones).

An extraction is staged in a hidden folder beside its destination and moved
into place only when complete, under a per-destination file lock, so two
runs into one folder never mix their files and a reader never sees half a
tree. A destination that exists already (an empty folder the user chose,
perhaps a mount point) is staged in instead, so that no rename crosses from
one file system to another; its ``vllm`` folder, by which an extraction is
known, moves in last. A killed run leaves its staging folder; the next run
into the same destination (holding the lock, so it cannot be a live run's)
removes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from deepstack_patch.engine.errors import (
    DeepstackError,
    os_error_hint,
    writable_folder_of,
)
from deepstack_patch.engine.tree import ASKED_FOR, VllmTree, detect_version

#: Chooses members by their path inside the release's top folder.
MemberFilter = Callable[[str], bool]

_STAGING = ".deepstack-extract."

T = TypeVar("T")


def extract_release(
    archive: Path,
    version: str,
    out: Path,
    wanted: MemberFilter | None = None,
    asked_for: Sequence[str] = (),
) -> VllmTree:
    """Extract ``archive`` into ``out`` (without its top folder) and open it.

    ``wanted`` limits the extraction to the regular files it accepts; a
    partial extraction lists the globs it was asked for, ``asked_for``, in
    its :data:`~deepstack_patch.engine.tree.ASKED_FOR` file, so that a file
    asked for and not there is known to be missing from the release. An
    ``out`` that already holds an extraction of the same release is reused as
    it is (it may be patched already: states are read from the code). Any
    other non-empty ``out`` is refused.
    """
    _extract_once(archive, out, wanted, lambda: _reusable(out, version), asked_for)
    return VllmTree.open(out)


def extract_part(archive: Path, out: Path, wanted: MemberFilter) -> Path:
    """Extract the files ``wanted`` accepts into ``out`` once; later calls reuse it.

    For extractions that are not trees (e.g. a release's ``tests/`` alone):
    staged beside ``out`` and moved into place whole, so an ``out`` that
    exists is complete.
    """
    _extract_once(archive, out, wanted, out.is_dir)
    return out


def write_once(out: Path, fill: Callable[[Path], None], what: str) -> Path:
    """Fill the folder ``out`` once with ``fill(staging)``; later calls reuse it.

    For trees that come from elsewhere than an archive (a commit's files in
    a git object store): staged and moved into place whole, under ``out``'s
    lock, as an extraction is, so an ``out`` that exists is complete.
    """
    make_folder(out.parent, "the output folder's parent")
    with extraction_lock(out):
        _remove_stale_staging(out)
        if out.is_dir():
            return out
        try:
            staging = Path(
                tempfile.mkdtemp(prefix=f".{out.name}{_STAGING}", dir=out.parent)
            )
            try:
                fill(staging)
                _move_into_place(staging, out)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        except OSError as exc:
            raise DeepstackError(
                f"writing {what} into {out} failed: {exc.strerror or exc}",
                os_error_hint(exc, out.absolute().parent),
            ) from None
    return out


def _extract_once(
    archive: Path,
    out: Path,
    wanted: MemberFilter | None,
    already_there: Callable[[], bool],
    asked_for: Sequence[str] = (),
) -> None:
    """Under ``out``'s lock: unless ``already_there()``, extract into a staging
    folder beside ``out`` (with the list of what it was ``asked_for``, if
    any) and move it into place whole."""
    make_folder(out.parent, "the output folder's parent")
    with extraction_lock(out):
        _remove_stale_staging(out)
        if already_there():
            return
        folder, prefix = _staging_place(out)
        staging = Path(
            _guarded(lambda: tempfile.mkdtemp(prefix=prefix, dir=folder), archive, out)
        )
        try:
            extracted = _extract_into(archive, staging, wanted, out)
            if asked_for:
                listed = "".join(f"{pattern}\n" for pattern in asked_for)
                _guarded(
                    lambda: (extracted / ASKED_FOR).write_text(listed), archive, out
                )
            _guarded(lambda: _move_into_place(extracted, out), archive, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _staging_place(out: Path) -> tuple[Path, str]:
    """The folder to stage ``out``'s extraction in, and the staging name's
    prefix: inside ``out`` where it exists, else beside it."""
    if out.is_dir():
        return out, _STAGING
    return out.parent, f".{out.name}{_STAGING}"


def _staging_name(prefix: str) -> re.Pattern[str]:
    # mkdtemp's suffix has no dot: another destination's folder never matches.
    return re.compile(re.escape(prefix) + r"[A-Za-z0-9_]+\Z")


def _entries(out: Path) -> list[Path]:
    """What ``out`` holds, less the staging folders of runs into it."""
    ours = _staging_name(_STAGING)
    return [child for child in out.iterdir() if not ours.match(child.name)]


def extraction_target(out: Path, version: str) -> bool:
    """Whether ``out`` holds this release's extraction already (True) or can
    take one (False). A folder holding something else, or one this user
    cannot write, is refused before anything is downloaded or said."""
    if _reusable(out, version):
        return True
    folder = writable_folder_of(out.absolute())
    if not os.access(folder, os.W_OK):
        read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
        code = errno.EROFS if read_only else errno.EACCES
        raise DeepstackError(
            f"cannot extract into {out}: {os.strerror(code)} ({folder})",
            os_error_hint(OSError(code, os.strerror(code)), folder),
        )
    try:  # root may write anywhere, yet /proc takes no folder: try one
        os.rmdir(tempfile.mkdtemp(prefix=_STAGING, dir=folder))
    except OSError as exc:
        raise DeepstackError(
            f"cannot extract into {out}: {exc.strerror or exc} ({folder})",
            _mkdir_hint(exc, folder),
        ) from None
    return False


def _reusable(out: Path, version: str) -> bool:
    if not out.exists() or (out.is_dir() and not _entries(out)):
        return False
    existing = out / "vllm" / "__init__.py"
    if out.is_dir() and existing.is_file() and detect_version(out)[0] == version:
        return True
    raise DeepstackError(
        f"{out} exists and is not an extraction of vLLM {version}",
        "choose another folder with --out, or remove this one",
    )


def _extract_into(
    archive: Path, staging: Path, wanted: MemberFilter | None, out: Path
) -> Path:
    def extract() -> Path:
        with tarfile.open(archive, "r:gz") as tar:
            members = [
                m
                for m in tar.getmembers()
                if wanted is None or (m.isfile() and wanted(m.name.partition("/")[2]))
            ]
            tops = {m.name.partition("/")[0] for m in members}
            if len(tops) != 1:
                raise DeepstackError(
                    f"{archive.name}: expected one top-level folder, found {len(tops)}",
                    f"the file is not a vLLM source release; delete {archive} so "
                    "it is downloaded again",
                )
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(staging, members=members, **kwargs)
        return staging / tops.pop()

    return _guarded(extract, archive, out)


def _move_into_place(extracted: Path, out: Path) -> None:
    if out.exists():  # an empty folder the user chose: fill it, vllm/ last
        for child in sorted(extracted.iterdir(), key=lambda c: c.name == "vllm"):
            child.rename(out / child.name)
    else:
        extracted.rename(out)


def _guarded(action: Callable[[], T], archive: Path, out: Path) -> T:
    """Run one extraction step; turn its failure into an error with the right hint."""
    try:
        return action()
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise DeepstackError(
            f"extracting {archive} failed: the archive is corrupt ({exc})",
            f"delete the cached tarball {archive} so it is downloaded again",
        ) from None
    except OSError as exc:
        raise DeepstackError(
            f"extracting {archive.name} into {out} failed: {exc.strerror or exc}",
            os_error_hint(exc, out.absolute().parent),
        ) from None


def make_folder(folder: Path, what: str) -> None:
    """``mkdir -p`` with an error that names the folder that cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DeepstackError(
            f"cannot create {what} {folder}: {exc.strerror or exc}",
            _mkdir_hint(exc, writable_folder_of(folder)),
        ) from None


def _mkdir_hint(exc: OSError, parent: Path) -> str:
    """A folder that exists and still says "no such file" to a new folder in
    it is no disk's folder (/proc, /sys), not one another program changed."""
    if exc.errno == errno.ENOENT and parent.is_dir():
        return (
            f"{parent} takes no new folders (a virtual file system holds only "
            "what the kernel puts there): choose a folder on a disk"
        )
    return os_error_hint(exc, parent)


def extraction_lock_file(out: Path) -> Path:
    """The lock file of ``out``'s extraction (in the cache, not beside it)."""
    from deepstack_patch.fetch.cache import cache_dir

    locks = cache_dir() / "locks"
    locks.mkdir(exist_ok=True)
    key = hashlib.sha256(str(out.absolute()).encode()).hexdigest()[:16]
    return locks / f"extract-{key}.lock"


@contextlib.contextmanager
def extraction_lock(
    out: Path, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Serialise the runs that extract into (and work on) one destination.

    The lock file lives in the cache, not beside ``out``; it is re-entrant
    within a process, so a command may hold it around its whole run.
    """
    from filelock import FileLock, Timeout

    lock = FileLock(str(extraction_lock_file(out)), is_singleton=True)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if on_wait:
            on_wait(f"waiting for another deepstack-patch run using {out}")
        lock.acquire(timeout=1800)
    try:
        yield
    finally:
        lock.release()


def _remove_stale_staging(out: Path) -> None:
    """Remove the staging folders killed runs into ``out`` left behind.

    Called under :func:`extraction_lock`, so no live run into ``out`` is
    staging; the name must match exactly, so another destination's staging
    folder is never taken for ours. Both places are looked in: ``out`` may
    have been created, or emptied, since.
    """
    for folder, prefix in ((out.parent, f".{out.name}{_STAGING}"), (out, _STAGING)):
        pattern = _staging_name(prefix)
        with contextlib.suppress(OSError):
            for candidate in folder.iterdir():
                if pattern.match(candidate.name) and candidate.is_dir():
                    shutil.rmtree(candidate, ignore_errors=True)

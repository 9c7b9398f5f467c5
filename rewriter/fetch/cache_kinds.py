"""What the user cache holds, by kind, and clearing a kind (``cache``).

Every folder directly under the cache (:func:`cache_dir`) is one kind of
thing the tool keeps: verified downloads, extractions, environments, what
earlier runs learned. Everything there is a cache: a cleared entry is made
again when a command needs it, at the cost :data:`KINDS` states (a download,
an extraction, a rebuild). An entry is one direct child of its kind's folder
(a tarball, an extracted tree, an environment).

Clearing takes, for each entry, the lock the commands that make or use it
take (the extraction lock of a tree, the ``.lock`` file beside a download
or an environment), without waiting: an entry another run holds is left,
and said. Lock files themselves are never removed: a command may hold one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.cache import cache_dir
from deepstack_patch.engine.errors import DeepstackError


@dataclass(frozen=True)
class Kind:
    """A folder of the cache: what it holds, and what clearing it costs."""

    name: str
    holds: str
    cost: str
    #: Its entries are trees made under the extraction lock of their path.
    trees: bool = False


KINDS = (
    Kind("sdists", "verified vLLM source tarballs", "downloaded again (network)"),
    Kind("wheels", "verified official vLLM wheels", "downloaded again (network)"),
    Kind(
        "partial-trees",
        "the patches' files of each release (status, matrix, watch)",
        "extracted again from the tarball",
        trees=True,
    ),
    Kind(
        "pristine",
        "whole releases for verify --against-pristine",
        "extracted again from the tarball",
        trees=True,
    ),
    Kind(
        "release-tests",
        "a release's tests for verify --installed",
        "extracted again from the tarball",
        trees=True,
    ),
    Kind(
        "commit-trees",
        "a commit parent's files, read by derive --commit",
        "read again from the clone",
        trees=True,
    ),
    Kind(
        "envs",
        "verify's managed proof environments",
        "rebuilt by verify (minutes; the package index)",
    ),
    Kind("code", "compiled modules of the trees verify ran", "compiled again"),
    Kind("preload", "what verify's fork server preloads", "learned again"),
    Kind("recognised", "recognition results by file content", "recognised again"),
    Kind(
        "runtime-names",
        "a derived patch's runtime names, checked with ty",
        "checked again (seconds per file)",
    ),
    Kind(
        "plans",
        "status plans of series with derived patches, with their tree's manifest",
        "planned again (seconds)",
    ),
    Kind("agreed", "derived data files found in one truth", "checked again"),
    Kind("live", "the live check's results per install", "checked again"),
    Kind("index", "the list of vLLM releases (watch)", "asked of the index again"),
    Kind("locks", "lock files of running commands", "never cleared"),
)

#: What a folder of the cache that no kind names is said to hold.
OTHER = "not known to this version of deepstack-patch"


@dataclass
class KindUsage:
    """One kind in the cache: its size, its entries, and what was cleared."""

    name: str
    holds: str
    cost: str
    bytes: int = 0
    entries: int = 0
    #: Entries older than ``--older-than`` (all of them without it).
    old_bytes: int = 0
    old_entries: int = 0
    cleared: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    #: Entries another run held: left in place.
    in_use: list[str] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "holds": self.holds,
            "cost_of_clearing": self.cost,
            "bytes": self.bytes,
            "entries": self.entries,
            "old_bytes": self.old_bytes,
            "old_entries": self.old_entries,
            "cleared": self.cleared,
            "freed_bytes": self.freed_bytes,
            "in_use": self.in_use,
        }


@dataclass
class CacheReport:
    path: Path
    kinds: list[KindUsage]
    older_than_days: float | None = None
    clearing: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(kind.bytes for kind in self.kinds)

    @property
    def freed_bytes(self) -> int:
        return sum(kind.freed_bytes for kind in self.kinds)


def cache_usage(
    clear: Sequence[str] = (), older_than_days: float | None = None
) -> CacheReport:
    """Every kind's size and entries; with ``clear`` (kind names, or
    ``all``), their entries removed (only those last changed more than
    ``older_than_days`` ago, where it is given)."""
    root = cache_dir()
    known = {kind.name: kind for kind in KINDS}
    present = sorted(p.name for p in root.iterdir() if p.is_dir())
    kinds = [known[name] for name in known if name in present]
    kinds += [Kind(name, OTHER, "unknown") for name in present if name not in known]
    chosen = _chosen(clear, [kind.name for kind in kinds], known)
    cutoff = None if older_than_days is None else time.time() - older_than_days * 86400
    usages = []
    for kind in kinds:
        usage = KindUsage(kind.name, kind.holds, kind.cost)
        for entry in _entries(root / kind.name):
            size = _size(entry)
            usage.bytes += size
            usage.entries += 1
            if cutoff is not None and _changed(entry) >= cutoff:
                continue
            usage.old_bytes += size
            usage.old_entries += 1
            if kind.name in chosen:
                if _remove(entry, kind):
                    usage.cleared.append(entry.name)
                    usage.freed_bytes += size
                else:
                    usage.in_use.append(entry.name)
        usage.bytes -= usage.freed_bytes
        usage.entries -= len(usage.cleared)
        usages.append(usage)
    return CacheReport(root, usages, older_than_days, sorted(chosen))


def _chosen(
    clear: Sequence[str], present: list[str], known: dict[str, Kind]
) -> set[str]:
    """The kinds to clear: the names given (``all``: every kind but locks)."""
    names = set(clear)
    if "all" in names:
        return {name for name in present if name != "locks"}
    if "locks" in names:
        raise DeepstackError(
            "--clear locks: lock files are never cleared (a running command may "
            "hold one; each is empty)",
            "leave locks out",
        )
    unknown = sorted(names - set(present) - set(known))
    if unknown:
        raise DeepstackError(
            f"--clear {unknown[0]}: no such kind of cache entry",
            "one of: all, " + ", ".join(k for k in known if k != "locks"),
        )
    return names & set(present)


#: A download written to in the last hour may be one in progress.
_PARTIAL_QUIET_S = 3600


def _entries(folder: Path) -> Iterator[Path]:
    """The entries of a kind: its children, but lock files, staging folders
    (``.name``), the ``.sha256`` stamp of a download (it goes with the
    download) and a download in progress (a ``.partial`` written to lately)."""
    names = {entry.name for entry in folder.iterdir()}
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if name.endswith(".lock") or name.startswith("."):
            continue
        if name.endswith(".sha256") and name.removesuffix(".sha256") in names:
            continue
        if (
            name.endswith(".partial")
            and time.time() - _changed(entry) < _PARTIAL_QUIET_S
        ):
            continue
        yield entry


def _changed(entry: Path) -> float:
    """When an entry was made or last changed (the newest of it and its
    ``.sha256`` stamp, which a reuse of a download rewrites)."""
    stamp = _stamp(entry)
    times = [entry.lstat().st_mtime]
    if stamp.exists():
        times.append(stamp.lstat().st_mtime)
    return max(times)


def _size(entry: Path) -> int:
    """Bytes of an entry, each file counted once (hard links share theirs)."""
    if not entry.is_dir() or entry.is_symlink():
        stamp = _stamp(entry)
        return entry.lstat().st_size + (stamp.lstat().st_size if stamp.exists() else 0)
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, _dirs, files in os.walk(entry):
        for name in files:
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def _remove(entry: Path, kind: Kind) -> bool:
    """Remove ``entry`` under the lock its makers take; False where another
    run holds that lock (the entry is left as it is)."""
    with _held(entry, kind) as free:
        if not free:
            return False
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, onerror=_writable_then_retry)
        else:
            entry.unlink(missing_ok=True)
        _stamp(entry).unlink(missing_ok=True)
    return True


def _stamp(entry: Path) -> Path:
    """The sha256 a verified download is stamped with (fetch.cache)."""
    return entry.with_name(entry.name + ".sha256")


@contextlib.contextmanager
def _held(entry: Path, kind: Kind) -> Iterator[bool]:
    """The lock of ``entry``, taken without waiting: True when taken (or
    where the entry has no lock)."""
    from deepstack_patch.fetch.archives import extraction_lock_file
    from filelock import FileLock, Timeout

    if kind.trees:
        lock_path = extraction_lock_file(entry)
    else:
        lock_path = entry.with_name(entry.name + ".lock")
        if not lock_path.exists():
            yield True
            return
    lock = FileLock(str(lock_path), is_singleton=True)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def _writable_then_retry(function: Any, path: str, _info: Any) -> None:
    """An extracted tree may be read-only: make the folder writable, retry."""
    parent = os.path.dirname(path)
    os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR | stat.S_IXUSR)
    function(path)

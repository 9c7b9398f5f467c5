"""The files a kept plan could read, as they were when it was made
(:mod:`.plan_memo`): each entry under ``vllm/`` by its ``lstat``, and by
its content's sha256 where that ``lstat`` cannot vouch for it.

A file whose ``lstat`` (size, mtime, ctime, inode) is unchanged is
unchanged, as for git's index, since a write always moves ctime and nothing
can set it back; one whose times fall within :data:`RACY_SECONDS` of when
the manifest was taken, or whose ``lstat`` moved, is compared by content.
A link is compared by where it points and the file there: a write to that
file moves nothing of the link's own ``lstat``.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

#: A file whose mtime or ctime is this close to the manifest's time (or
#: after it) is compared by content, never by its ``lstat`` alone.
RACY_SECONDS = 2.0

#: Larger files are kept by ``lstat`` alone (an installed vLLM's compiled
#: kernels): one that moved is a miss, never read to hash.
LARGEST_HASHED = 8 << 20

#: ``(size, mtime_ns, ctime_ns, inode, kind)``; kind: "f" file, "d" folder,
#: "l" link (where it points and the hash of the file there), "o" other.
Signature = tuple[int, int, int, int, str]


@dataclass(frozen=True)
class Entry:
    signature: Signature
    #: The content's sha256 (a link: its target), "" where not hashed.
    digest: str

    def same_as(self, kept: Entry) -> bool:
        """Whether this is the file ``kept`` recorded: the same bytes (a
        touched file too), or, where not hashed, the same ``lstat``."""
        if self.signature[4] != kept.signature[4]:
            return False
        if self.digest or kept.digest:
            return self.digest == kept.digest
        return self.signature == kept.signature


#: A file the plan asked about that is not there.
ABSENT = Entry((0, 0, 0, 0, "-"), "")


@dataclass
class Manifest:
    """The tree's files a plan could read, as they were when it was taken."""

    taken_at: float
    entries: dict[str, Entry]
    #: The tree's folder (not kept: the key holds it).
    root: Path = Path()
    #: The bytes each file was hashed from when the manifest was taken (not
    #: kept): what its digest says, so the package need not be read again.
    read: dict[str, bytes] = field(default_factory=dict)

    def racy(self, entry: Entry) -> bool:
        _size, mtime_ns, ctime_ns, _inode, _kind = entry.signature
        edge = (self.taken_at - RACY_SECONDS) * 1e9
        return mtime_ns >= edge or ctime_ns >= edge


def walk(root: Path, previous: Manifest | None, rehash: bool = True) -> Manifest:
    """Every entry under ``root/vllm``: by ``lstat``, and by content where
    ``previous`` cannot vouch for it (``rehash=False``: ``lstat`` alone)."""
    taken_at = time.time()
    entries: dict[str, Entry] = {}
    read: dict[str, bytes] = {}
    # Each entry's path less the root's (os.path.relpath: a third of a walk).
    cut = len(os.path.join(root, ""))
    stack = [os.path.join(root, "vllm")]
    while stack:
        folder = stack.pop()
        try:
            scanned = list(os.scandir(folder))
        except OSError:
            continue
        for item in scanned:
            relpath = item.path[cut:].replace(os.sep, "/")
            old = previous.entries.get(relpath) if previous else None
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                entries[relpath] = ABSENT  # gone while walked
                continue
            if rehash:
                entry = entry_of(Path(item.path), previous, old, read, relpath, info)
            else:
                entry = Entry(signature_of(info), old.digest if old else "")
            entries[relpath] = entry
            if entry.signature[4] == "d":
                stack.append(item.path)
    return Manifest(taken_at, entries, root, read)


def entry_of(
    path: Path,
    manifest: Manifest | None,
    old: Entry | None,
    read: dict[str, bytes] | None = None,
    relpath: str = "",
    info: os.stat_result | None = None,
) -> Entry:
    """``path``'s entry (``info``: its ``lstat``, where taken already); its
    content is read only where ``old`` (from ``manifest``) cannot vouch for
    it by ``lstat`` (and then kept in ``read``, under ``relpath``)."""
    if info is None:
        try:
            info = path.lstat()
        except OSError:
            return ABSENT
    signature = signature_of(info)
    kind = signature[4]
    if kind == "l":
        # A read of a link reads the file it points to, and a write there
        # moves nothing of the link's own ``lstat``: never vouched for.
        return Entry(signature, _link_digest(path))
    if (
        old is not None
        and manifest is not None
        and old.signature == signature
        and not manifest.racy(old)
    ):
        return old
    if kind != "f" or info.st_size > LARGEST_HASHED:
        return Entry(signature, "")
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError:
        return Entry(signature, "")
    if read is not None:
        read[relpath] = raw
    return Entry(signature, hashlib.sha256(raw).hexdigest())


def _link_digest(path: Path) -> str:
    """Where a link points, and the sha256 of the file there; "" where it
    points at nothing this hashes (a folder, no file): what a plan read
    through it is not known, and such a plan is not kept."""
    try:
        target = os.readlink(path)
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > LARGEST_HASHED:
            return ""
        return f"{target}\0{hashlib.sha256(path.read_bytes()).hexdigest()}"
    except OSError:
        return ""


def signature_of(info: os.stat_result) -> Signature:
    mode = info.st_mode
    kind = (
        "f"
        if stat.S_ISREG(mode)
        else "d"
        if stat.S_ISDIR(mode)
        else "l"
        if stat.S_ISLNK(mode)
        else "o"
    )
    if kind == "d":  # a folder's entries are walked; its own times say nothing
        return (0, 0, 0, info.st_ino, kind)
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, kind)


def manifest_document(manifest: Manifest) -> dict[str, object]:
    return {
        "taken_at": manifest.taken_at,
        "entries": {
            relpath: [*entry.signature, entry.digest]
            for relpath, entry in sorted(manifest.entries.items())
        },
    }


def manifest_of(document: dict[str, object]) -> Manifest:
    entries = {}
    for relpath, (size, mtime, ctime, inode, kind, digest) in document[
        "entries"
    ].items():  # type: ignore[attr-defined]
        entries[relpath] = Entry((size, mtime, ctime, inode, kind), digest)
    return Manifest(float(document["taken_at"]), entries)  # type: ignore[arg-type]

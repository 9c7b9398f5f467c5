"""A status plan kept whole between runs, for a series that reads the tree.

A derived patch's verdict reads far more than its own files: the modules its
fix imports, the names the whole ``vllm`` package defines, what ty finds in
the modules its file can reach (:mod:`.context`). Each of those is cached by
its own key, yet a warm ``status`` of 40 derived patches still redoes the
plan's Python work (finding every unit, computing each needed fix so that
later patches see it, looking up runtime names): seconds where the per-file
recognition cache gives the built-in series a tenth of one.

So a plan that rewrites nothing (``status``, ``apply --check``) of a series
with a patch that reads the tree is kept whole, under a key of everything
the plan is a function of besides the tree's files: the code and data of
the series (the recognition cache's fingerprint), its order and selection,
the tree's folder, version and kind, the Python and ty that check it. With
it is kept a manifest of the tree's files the plan could read:

- every entry under ``vllm/`` (the package the runtime names are looked up
  in and ty reads), by its ``lstat`` and its content's sha256;
- every other file the plan asked about (:attr:`.context.TreeContext.probed`),
  present or absent, and what each of the series' globs outside ``vllm/``
  matched.

A file whose ``lstat`` (size, mtime, ctime, inode) is unchanged is
unchanged, as for git's index; one written around when the manifest was
taken, or whose ``lstat`` moved, is compared by content (:mod:`.manifest`,
which takes and compares the manifest). A run uses the kept plan where no
entry was added or went, and every file that changed is one the plan did
not depend on (else it plans again, and keeps that plan):

- not one it read by path (``read``): the patches' files, what the checks
  asked the tree's context about, the modules ty reads for a typed check,
  the classes the checks parsed (all in ``TreeContext.probed``);
- not one a search of the whole package looked into: every such search
  tests ``word in raw`` first (``TreeContext.scanned_for``), so a file that
  holds none of its words, before and after, answered none of them; a name
  looked up as defined anywhere (``TreeContext.mentioned``) is vouched for
  instead by a file outside the patches' that defines it, the first the
  plan's own lookup found (:class:`_Searched`): while it stands, the answer
  stands, and where it changed, another that defines it now stands for it.

A plan is kept only where nothing under ``vllm/`` moved while it was made
(the manifest is taken before, and compared after), no other file it read
was written then, and no check failed for a reason that may pass (ty could
not run: :attr:`.context.TreeContext.unsettled`).

Entries live under ``$DEEPSTACK_PATCH_CACHE/plans``; ``DEEPSTACK_PATCH_NO_CACHE=1``
turns this off with the recognition cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch.engine.cache import write_atomically
from deepstack_patch.engine.context import TreeContext
from deepstack_patch.engine.derived import closure, outside
from deepstack_patch.engine.kept_reports import report_document, reports_of
from deepstack_patch.engine.manifest import (
    Manifest,
    entry_of,
    manifest_document,
    manifest_of,
    walk,
)
from deepstack_patch.engine.protocol import Patch, PatchReport
from deepstack_patch.engine.recognition_cache import RecognitionCache
from deepstack_patch.engine.tree import VllmTree, _asked_for

#: Bump when what is stored changes meaning.
_SCHEMA = "2"  # 2: a witness per name, looked for again where it changed

#: How coarse a file system's ctime may be: a file written this long
#: before the plan began may have been written while it read it.
_CTIME_TICK = 0.05


class PlanMemo:
    """One kept plan: its file, and the manifest taken before it was made."""

    def __init__(self, path: Path, tree: VllmTree, patterns: list[str]) -> None:
        self.path = path
        self.tree = tree
        #: The series' globs (those outside ``vllm/`` are matched again).
        self.patterns = patterns
        self.before: Manifest | None = None
        #: What :meth:`prepare` read and looked for, and what the series'
        #: globs matched then, for :meth:`store`.
        self._scans: _Scans | None = None
        self._globbed: dict[str, list[str]] = {}

    @classmethod
    def for_plan(
        cls,
        tree: VllmTree,
        series: Sequence[Patch],
        selected: set[str],
        cache: RecognitionCache,
    ) -> PlanMemo:
        from importlib.metadata import PackageNotFoundError, version

        from deepstack_patch.engine.cache import cache_dir

        try:
            checker = version("ty")
        except PackageNotFoundError:
            checker = "absent"
        asked = tree.root / ".deepstack-asked-for"
        key = hashlib.sha256(cache.fingerprint)
        for piece in (
            _SCHEMA,
            sys.version,
            checker,
            str(tree.root),
            tree.version,
            tree.version_source,
            # A whole tree, or a partial extraction with its list.
            "whole" if _asked_for(tree.root) is None else _read(asked),
            os.environ.get("DEEPSTACK_PATCH_FULL_REWRITE", ""),
            "\n".join(p.id for p in series),
            "\n".join(sorted(selected)),
        ):
            key.update(piece.encode("utf-8", "surrogateescape") + b"\0")
        name = key.hexdigest()
        patterns = sorted({pattern for p in series for pattern in p.paths})
        return cls(cache_dir() / "plans" / f"{name}.json", tree, patterns)

    @property
    def hashed(self) -> Mapping[str, bytes]:
        """The bytes of the files the manifest taken before the plan hashed:
        the plan reads those (``TreeContext.hashed``), not the disk again."""
        return self.before.read if self.before is not None else {}

    # -- a kept plan ----------------------------------------------------------------

    def load(self, series: Sequence[Patch]) -> list[PatchReport] | None:
        """The kept plan's reports, where every file it could read is as it
        was; None otherwise. Takes the manifest a new plan is kept with."""
        try:
            document = json.loads(self.path.read_bytes())
            kept = manifest_of(document["manifest"])
            globbed = document["globbed"]
        except (OSError, ValueError, KeyError, TypeError):
            self.before = walk(self.tree.root, previous=None)
            return None
        now = self.before = walk(self.tree.root, previous=kept)
        try:
            read = set(document["read"])
            words = [word.encode("latin-1") for word in document["words"]]
            changed = self._unread_changes(kept, now, globbed, read, words)
            if changed is None:
                return None
            # A changed file vouches for nothing now (its new bytes may not).
            witnesses = _vouched(
                document["witnesses"], changed, now, set(document["candidates"])
            )
            if witnesses is None:
                return None
            reports = reports_of(document["reports"], series)
        except (ValueError, KeyError, TypeError):
            return None
        document["witnesses"] = witnesses
        if changed or any(
            kept.racy(old) or old.signature != now.entries[relpath].signature
            for relpath, old in kept.entries.items()
            if relpath in now.entries
        ):  # what was hashed now need not be again: keep it with today's lstat
            outside = {p: e for p, e in kept.entries.items() if p not in now.entries}
            document["manifest"] = manifest_document(
                Manifest(now.taken_at, {**now.entries, **outside})
            )
            write_atomically(self.path, json.dumps(document))
        return reports

    def _unread_changes(
        self,
        kept: Manifest,
        now: Manifest,
        globbed: dict[str, list],
        read: set[str],
        words: list[bytes],
    ) -> set[str] | None:
        """The files that changed, where the kept plan is still the plan of
        the tree as it is now (else None): no file added or gone; every file
        the same but one the plan never read (``read``: by path, or in a
        search of the whole package, which looks only at files holding one
        of its ``words``) whose new bytes hold none of those words either
        (so every search answers as it did); the files outside ``vllm/`` as
        they were. (Each name found defined somewhere must still be vouched
        for by a file: :func:`_vouched`.)"""
        package = {p: e for p, e in kept.entries.items() if p.startswith("vllm/")}
        if package.keys() != now.entries.keys():
            return None  # a file added or gone
        changed = {
            relpath
            for relpath, entry in now.entries.items()
            if not entry.same_as(package[relpath])
        }
        for relpath, entry in now.entries.items():
            if relpath not in changed:
                continue
            if relpath in read or not entry.digest or entry.signature[4] != "f":
                return None
            raw = _hashed_bytes(now, relpath)
            if raw is None or any(word in raw for word in words):
                return None
        for relpath, entry in kept.entries.items():
            if relpath not in package:
                here = entry_of(self.tree.root / relpath, kept, entry)
                if not here.same_as(entry):
                    return None
        if any(self.tree.glob([p]) != found for p, found in globbed.items()):
            return None
        return changed

    def prepare(self, context: TreeContext) -> _Scans | None:
        """The part of :meth:`store` its reports do not change, done while
        ty finishes the checks the plan put off (the plan's thread would
        wait for them): the package's bytes read, and the words the plan's
        searches asked for so far looked for in them (a check concluded
        later may ask for more: :meth:`store` looks for those). None where
        a file is no longer the bytes the manifest recorded."""
        if self._scans is not None or self.before is None:
            return self._scans
        package = _package_bytes(self.before)
        if package is None:
            return None
        globbed = {pattern: self.tree.glob([pattern]) for pattern in self.patterns}
        scans = _Scans(package, {f for found in globbed.values() for f in found})
        # The words the searches so far depend on, with the names no file
        # vouches for: found now, not after ty's last answer.
        _Searched.of(scans, context)
        self._scans, self._globbed = scans, globbed
        return scans

    def store(
        self, reports: Sequence[PatchReport], context: TreeContext, started: float
    ) -> None:
        """Keep ``reports`` with the manifest taken before they were made,
        unless the tree moved meanwhile or a check may answer otherwise
        next time; a failure to write is no failure of the run."""
        before = self.before
        if before is None or context.unsettled:
            return
        if any(e.signature[4] == "l" and not e.digest for e in before.entries.values()):
            return  # a link to a folder: what ty read through it is not known
        # Nothing under vllm/ moved while the plan was made.
        after = walk(self.tree.root, previous=before, rehash=False)
        if {p: e.signature for p, e in after.entries.items()} != {
            p: e.signature for p, e in before.entries.items()
        }:
            return
        scans = self._scans or self.prepare(context)
        if scans is None:
            return
        globbed, candidates = self._globbed, scans.candidates  # matched once
        probed = {*context.probed, *closure.files_read(context.closures.values())}
        outside = {
            relpath
            for relpath in {*probed, *candidates}
            if not relpath.startswith("vllm/")
        }
        searched = _Searched.of(scans, context)
        read = _read_by(before, scans, {*probed, *candidates}, searched.words)
        entries = dict(before.entries)
        for relpath in sorted(outside):
            entry = entry_of(self.tree.root / relpath, None, None)
            _size, mtime_ns, ctime_ns, _inode, kind = entry.signature
            if kind == "l":
                return  # its times are the link's, not the file's it read
            if max(mtime_ns, ctime_ns) >= (started - _CTIME_TICK) * 1e9:
                return  # written while the plan read it: which bytes did it?
            entries[relpath] = entry
        try:
            document = {
                "manifest": manifest_document(Manifest(before.taken_at, entries)),
                "globbed": {
                    p: found
                    for p, found in globbed.items()
                    if not p.startswith("vllm/")
                },
                "read": sorted(read),
                "words": sorted(word.decode("latin-1") for word in searched.words),
                "witnesses": {
                    word.decode("latin-1"): files
                    for word, files in searched.witnesses.items()
                },
                "candidates": sorted(scans.candidates),
                "reports": [report_document(r) for r in reports],
            }
            text = json.dumps(document)
            if reports_of(json.loads(text)["reports"], [r.patch for r in reports]) != (
                list(reports)
            ):
                return  # a detail JSON does not carry whole
        except (TypeError, ValueError, KeyError):
            return
        write_atomically(self.path, text)


# -- the manifest ----------------------------------------------------------------------


@dataclass
class _Scans:
    """The package's bytes (of every file the manifest hashed), and what
    was found in them for each word a search of the whole package asked
    for, kept from :meth:`PlanMemo.prepare` to :meth:`PlanMemo.store`."""

    package: dict[str, bytes]
    #: The files the series' globs matched: they vouch for no name.
    candidates: set[str]
    #: A name looked up as defined anywhere: a file outside the candidates,
    #: among those the search reads (``outside.SEARCHED_SUFFIXES``), that
    #: holds its evidence; none where no such file does.
    witnesses: dict[bytes, list[str]] = field(default_factory=dict)
    #: A word: every file that holds it.
    holding: dict[bytes, set[str]] = field(default_factory=dict)
    _in_order: list[tuple[str, bytes]] | None = None

    def look_for(self, context: TreeContext, words: Iterable[bytes]) -> None:
        """Find a witness of each name ``context``'s searches looked up as
        defined anywhere, and the files holding each of ``words``, where not
        found yet (each alone: what one finds depends on no other)."""
        for word, evidence_in in context.mentioned.items():
            if word not in self.witnesses:
                firsts = context.first_mentioned.get(word, set())
                self.witnesses[word] = self._witness(evidence_in, firsts)
        for word in words:
            if word not in self.holding:
                self.holding[word] = {
                    relpath for relpath, raw in self.package.items() if word in raw
                }

    def _witness(
        self, evidence_in: Callable[[bytes], bool], firsts: set[str | None]
    ) -> list[str]:
        """A file outside the candidates that holds a name's evidence: the
        first a lookup of the plan found there (the files outside the
        candidates are the same bytes in every state of the series, those
        the manifest hashed: ``TreeContext.hashed``), none where a lookup
        found it in no file at all, else the first in the order of paths
        (the lookups stopped in a candidate, or the name was looked up in
        other code: the standard library's)."""
        if None in firsts:
            return []
        if found := sorted(f for f in firsts if f not in self.candidates):  # type: ignore[misc]
            return found[:1]
        if self._in_order is None:  # sorted once for every name
            self._in_order = sorted(
                (relpath, raw)
                for relpath, raw in self.package.items()
                if _may_vouch(relpath, self.candidates)
            )
        for relpath, raw in self._in_order:
            if evidence_in(raw):
                return [relpath]
        return []


@dataclass
class _Searched:
    """What the plan's searches of the whole package depend on, on disk.

    A name looked up as defined anywhere (``mentions``) whose evidence a
    file outside the patches' own holds is found in every state of the
    series while that file stands: its ``witnesses`` vouch for it (where
    they all change, another is looked for: :func:`_vouched`), and what any
    other file holds does not matter. The other searches' words (and a
    name found nowhere but in the patches' files) depend on every file that
    holds the word: ``words``."""

    words: set[bytes]
    witnesses: dict[bytes, list[str]]

    @classmethod
    def of(cls, scans: _Scans, context: TreeContext) -> _Searched:
        """What ``context``'s searches depend on in ``scans``'s package."""
        scans.look_for(context, ())
        witnesses = {word: scans.witnesses[word] for word in context.mentioned}
        unwitnessed = {word for word, found in witnesses.items() if not found}
        words = {*context.scanned_for, *unwitnessed}
        scans.look_for(context, words)
        return cls(words, {word: found for word, found in witnesses.items() if found})


def _vouched(
    witnesses: dict[str, list[str]],
    changed: set[str],
    now: Manifest,
    candidates: set[str],
) -> dict[str, list[str]] | None:
    """Each name's witnesses that did not change; where all of them did,
    the first file outside the ``candidates`` that holds its evidence now
    (of the files the search reads, as ``now`` hashed them). None where a
    name has none left: a search of the package may answer otherwise."""
    vouched: dict[str, list[str]] = {}
    for word, files in witnesses.items():
        standing = [f for f in files if f not in changed]
        if not standing:
            found = _witness_now(word.encode("latin-1"), now, candidates)
            if found is None:
                return None
            standing = [found]
        vouched[word] = standing
    return vouched


def _witness_now(word: bytes, now: Manifest, candidates: set[str]) -> str | None:
    """The first file that may vouch for ``word`` and holds its evidence as
    ``now`` hashed it (each read as the search reaches it, and checked
    against its digest only where it holds the word); None where none."""
    evidence_in = outside.evidence_test(word)
    for relpath in sorted(now.entries):
        entry = now.entries[relpath]
        hashed = entry.signature[4] == "f" and entry.digest
        if not hashed or not _may_vouch(relpath, candidates):
            continue
        raw = now.read.get(relpath)
        if raw is None:
            try:
                raw = (now.root / relpath).read_bytes()
            except OSError:
                return None
            if word in raw and hashlib.sha256(raw).hexdigest() != entry.digest:
                return None  # written since the walk
        if evidence_in(raw):
            return relpath
    return None


def _may_vouch(relpath: str, candidates: set[str]) -> bool:
    """Whether a file may vouch for a name found defined: one the lookup
    reads (a JSON key is no witness), outside the patches' own files (their
    bytes change from one state of the series to the next)."""
    return relpath not in candidates and relpath.endswith(outside.SEARCHED_SUFFIXES)


def _package_bytes(manifest: Manifest) -> dict[str, bytes] | None:
    """The bytes of every file the manifest hashed (those it was hashed
    from where the walk read them, the others read now); None where one is
    no longer the bytes it recorded (the plan is not kept). Bytes changed
    on disk since are no matter: the store compares every ``lstat``."""
    package = {}
    for relpath, entry in manifest.entries.items():
        if entry.signature[4] != "f" or not entry.digest:
            continue
        raw = _hashed_bytes(manifest, relpath)
        if raw is None:
            return None
        package[relpath] = raw
    return package


def _hashed_bytes(manifest: Manifest, relpath: str) -> bytes | None:
    """The bytes of a file ``manifest`` hashed: those its walk read, or read
    now where the walk's ``lstat`` vouched for them; None where they cannot
    be read, or are no longer what it recorded."""
    if (raw := manifest.read.get(relpath)) is not None:
        return raw
    try:
        raw = (manifest.root / relpath).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(raw).hexdigest() != manifest.entries[relpath].digest:
        return None  # written since the walk
    return raw


def _read_by(
    manifest: Manifest, scans: _Scans, probed: set[str], words: set[bytes]
) -> set[str]:
    """The files under ``vllm/`` whose bytes the plan depends on: those it
    read by path (``probed``: what the checks asked about, the patches'
    files, what ty reads), those a search of the whole package looked into
    (every such search looks only at files holding one of its ``words``),
    and the files kept by ``lstat`` alone (not in the package)."""
    read = {relpath for relpath in probed if relpath in manifest.entries}
    read.update(
        relpath
        for relpath, entry in manifest.entries.items()
        if entry.signature[4] == "f" and relpath not in scans.package
    )
    for word in words:
        read |= scans.holding[word]
    return read


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="surrogateescape")
    except OSError:
        return ""

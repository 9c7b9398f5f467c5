"""The tree a plan recognises, as the earlier patches of the series leave it.

A derived patch's recognition reads other files of the tree than the one it
is given: the modules its fix imports from (:mod:`.derived.names`), the
whole ``vllm`` package its runtime names are looked up in and type-checked
against (:mod:`.derived.runtime`). Series order means that a patch sees the
code as the patches before it left it, in its own file and in every other:
vllm#50358 imports ``check_shm_free_space``, which vllm#48879 adds to
another file. So those reads go through a :class:`TreeContext`: the tree on
disk with the files the earlier patches of this plan rewrote laid over it
(``overlay``).

:mod:`.plan` fills it (the overlay, the series, how a patch's rewrite is
computed); the derived checks read it, and import nothing above it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from deepstack_patch.engine.tree import _asked_for

if TYPE_CHECKING:
    from deepstack_patch.engine.protocol import Finding, Patch

#: How the plan rewrites one file for one patch: ``(patch, relpath, raw,
#: needed) -> bytes``, raising ``RewriteRefused`` where it refuses
#: (:func:`deepstack_patch.engine.plan.rewritten_bytes`).
Rewrite = Callable[["Patch", str, bytes, "list[Finding]"], bytes]


class Deferred(Protocol):
    """Work a check put off to the end of a pass of the plan."""

    def run(self) -> bool:
        """Do what was put off; True where an answer given meanwhile was
        not what it found (the pass must be made again)."""


@dataclass
class TreeContext:
    """The tree a plan recognises, for a patch whose recognition reads other
    files of it. ``memo`` holds what was read from the tree, by whoever read
    it, for as long as the overlay stays as it is; ``on_disk`` what was read
    from the files on disk alone, for as long as the plan."""

    root: Path
    memo: dict[object, object] = field(default_factory=dict)
    on_disk: dict[object, object] = field(default_factory=dict)
    #: The bytes of each file as the plan hands it to a patch that reads the
    #: tree (after the rewrites of earlier patches in the series): what the
    #: runtime-name check of a derived patch rewrites (:mod:`.derived.runtime`).
    sources: dict[str, bytes] = field(default_factory=dict)
    #: The files the earlier patches of the series rewrote, as they left
    #: them: read in place of the tree's (relative path -> bytes).
    overlay: dict[str, bytes] = field(default_factory=dict)
    #: The series being planned, in order, and the ids selected in it: who
    #: else adds a name a fix needs (:func:`.derived.names.added_by`).
    series: tuple[Patch, ...] = ()
    selected: frozenset[str] = frozenset()
    rewrite: Rewrite | None = None
    #: Whether a check may put its work off to the end of a pass of the
    #: plan (``deferred``): the plan says so, and plans again (:mod:`.plan`).
    defer_checks: bool = False
    #: Work the checks put off, by who put it off: done once for every
    #: patch at a pass's end (ty on all the files that need it, not a run
    #: per patch); its answers meanwhile were provisional.
    deferred: dict[str, Deferred] = field(default_factory=dict)
    #: Every path of the tree asked about here (read, looked for): what a
    #: plan kept whole must find as it was (:mod:`.plan_memo`).
    probed: set[str] = field(default_factory=set)
    #: What ty may read where it checks a file for a typed check (a closure
    #: of modules, :mod:`.derived.closure`), by the closure's id: part of
    #: ``probed``, its files joined once where a kept plan needs them (the
    #: checks of a batch share a few closures of 5,000 modules each).
    closures: dict[int, Mapping[str, str]] = field(default_factory=dict)
    #: The words the checks looked for across the whole package (a file
    #: without any of them answered none of those searches): what lets a
    #: kept plan stand an edit to a file it never read (:mod:`.plan_memo`).
    scanned_for: set[bytes] = field(default_factory=set)
    #: The names looked up as defined or read anywhere in the package, with
    #: the test of one file's text (:func:`.derived.outside.mentions`).
    mentioned: dict[bytes, Callable[[bytes], bool]] = field(default_factory=dict)
    #: For a name looked up in the package's files in the order of their
    #: paths (:func:`.derived.outside.first_mention`), the first file of
    #: each lookup that held it (None: a lookup found it in none).
    first_mentioned: dict[bytes, set[str | None]] = field(default_factory=dict)
    #: The bytes of the package's files as a kept plan's manifest hashed
    #: them as the plan began (relative path -> bytes; :mod:`.plan_memo`):
    #: read in place of the disk's, so that what the plan read is what the
    #: manifest says.
    hashed: Mapping[str, bytes] = field(default_factory=dict)
    #: A check could not give its answer this time (ty could not run), and
    #: may give another next time: the plan is not kept whole.
    unsettled: bool = False
    #: What the checks started and the plan's end stops (ty's servers).
    closing: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def read(self, relpath: str) -> bytes:
        """The file as the earlier patches leave it (OSError where absent)."""
        self.probed.add(relpath)
        found = self.overlay.get(relpath)
        return found if found is not None else (self.root / relpath).read_bytes()

    def is_file(self, relpath: str) -> bool:
        self.probed.add(relpath)
        return relpath in self.overlay or (self.root / relpath).is_file()

    def is_dir(self, relpath: str) -> bool:
        """Whether the tree has the folder ``relpath`` (on disk)."""
        self.probed.add(relpath)
        return (self.root / relpath).is_dir()

    def lay_over(self, files: Mapping[str, bytes]) -> None:
        """Lay ``files`` (as a patch left them) over the tree: what was read
        before may differ now, so the memo starts again."""
        changed = {r: raw for r, raw in files.items() if self.overlay.get(r) != raw}
        if changed:
            self.overlay.update(changed)
            self.memo.clear()

    def start_again(self) -> None:
        """The tree as it is, for another pass of the plan over the series:
        what the disk holds stays known, and so does the deferred work."""
        self.overlay.clear()
        self.memo.clear()
        self.sources.clear()

    def lacks(self, relpath: str) -> bool:
        """Whether the release lacks the file ``relpath``: it is not here, and
        the tree is whole, or a partial extraction that was asked for it. A
        file a partial extraction was not asked for is unknown: False."""
        self.probed.add(relpath)
        if relpath in self.overlay or (self.root / relpath).exists():
            return False
        key = ("asked for", self.root)
        if key not in self.on_disk:
            self.on_disk[key] = _asked_for(self.root)
        asked = self.on_disk[key]
        return asked is None or asked(relpath)  # type: ignore[operator]

    def added_by(self, patch_id: str, name: str, adds: Callable[[Patch], bool]) -> str:
        """The last words of a drift reason where ``patch_id`` needs ``name``
        and another patch of the series adds it (``adds`` says whether one
        does): which, and in what order they apply; empty where none does."""
        ids = [patch.id for patch in self.series]
        here = ids.index(patch_id) if patch_id in ids else len(ids)
        for there, other in enumerate(self.series):
            if other.id == patch_id or not adds(other):
                continue
            if there > here:
                return (
                    f"; {other.id} adds `{name}`, and comes after {patch_id} in "
                    f"the series: apply {other.id} first (`requires = "
                    f'["{other.id}"]` in {patch_id}\'s data file orders them)'
                )
            if other.id not in self.selected:
                return (
                    f"; {other.id}, earlier in the series, adds `{name}`: "
                    f"select {other.id} too"
                )
            return (
                f"; {other.id}, earlier in the series, adds `{name}`, but has "
                "not added it here (see its state)"
            )
        return ""


_RECOGNISING: ContextVar[TreeContext | None] = ContextVar("recognising", default=None)


@contextlib.contextmanager
def recognising_in(
    root: Path,
    series: Sequence[Patch] = (),
    selected: Sequence[str] | set[str] = (),
    rewrite: Rewrite | None = None,
) -> Iterator[TreeContext]:
    """Make ``root`` the tree being recognised (see :func:`tree_context`)."""
    context = TreeContext(
        root, series=tuple(series), selected=frozenset(selected), rewrite=rewrite
    )
    token = _RECOGNISING.set(context)
    try:
        with context.closing:
            yield context
    finally:
        _RECOGNISING.reset(token)


def note_source(relpath: str, raw: bytes) -> None:
    """Record the bytes ``relpath`` is recognised from (see ``sources``)."""
    context = _RECOGNISING.get()
    if context is not None:
        context.sources[relpath] = raw


def tree_context() -> TreeContext | None:
    """The tree being recognised, or None where recognition has only the
    file (``rewrite_text``, a patch's examples)."""
    return _RECOGNISING.get()

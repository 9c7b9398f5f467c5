"""The type checker a derived patch's runtime names are checked with: ty
(pinned in pyproject.toml; vLLM configures it, ``[tool.ty]``), run on a
file as it is and as the fix leaves it, in the tree.

:mod:`.runtime` decides what a new diagnostic means; this module only runs
ty. What :mod:`.runtime` concluded is kept by :mod:`.verdicts`, under a
digest of everything the verdict depends on, so it can never go stale.

A plan's checks run as one batch (:func:`diagnostics_of`): each check's two
states join the first run of ty whose files agree with theirs wherever
either's diagnostics depend on them, so a run checks many files at once and
gives each what a run of its own would. Where a file a check reads differs
between two states only inside function bodies no other module can see
(:mod:`.interface`), the states agree on it. The runs are states told to a
few ``ty server`` processes in turn (:mod:`.tyserver`), which keep what
they inferred from one state to the next; a state that holds a file the
tree lacks (a module a fix adds) runs ``ty check`` in a folder of links
(:mod:`.tyfolders`).

A plan does not wait for its pass's end, though: each check it puts off
goes at once to a server that checks it while the plan goes on
(:class:`ChecksAhead`), joined as above to the states that wait there; the
batch takes only what it could not (a module a fix adds, a server that
failed).

The file as it is is checked only where its check asks, once its file as
fixed is answered (``Check.needs_before``): :mod:`.runtime` reads the old
diagnostics only to excuse a new "cannot run" one on the fix's lines, and
most fixed files hold none. That is about half the files ty checks, and a
quarter of its work, on a first ``status`` of 40 derived fixes. So a
server checks the file as fixed as its outline first (the bodies the fix
did not write left out, :func:`.interface.outline`), and the whole file
only where that answer asks for it as it is (``Check.written``): ty's work
on that batch fell by a third.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.derived import tyserver
from deepstack_patch.engine.derived.interface import outline, same_interface
from deepstack_patch.engine.derived.tyfolders import RUNS_AT_ONCE, RunFailed, run_all

#: The Python version the target is checked for (vLLM's oldest supported).
PYTHON_VERSION = "3.10"

#: How long ty may take on one file before the check gives up (refusing).
TIMEOUT_S = 120


@dataclass(frozen=True)
class Diagnostic:
    line: int
    rule: str
    message: str


class CheckerFailed(Exception):
    """ty could not check the file (missing, failed, too slow)."""


def diagnostics(
    root: Path,
    path: str,
    raw: bytes,
    fixed: bytes,
    others: Mapping[str, bytes] | None = None,
    added: Mapping[str, bytes] | None = None,
) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """ty on ``path`` as it is and as fixed, each in a folder of links to
    the tree's ``vllm`` package (the fixed file in place of its own, and
    ``others``, the files earlier patches of the series rewrote, in place of
    theirs), run side by side; ``added``: the other files the fix adds
    (relative path -> text), there in the fixed run."""
    check = Check(
        path,
        {**(others or {}), path: raw},
        {**(others or {}), **(added or {}), path: fixed},
        lambda _relpath, _appears: True,
    )
    (found,) = diagnostics_of(root, [check])
    if isinstance(found, CheckerFailed):
        raise found
    return found


@dataclass(frozen=True)
class Check:
    """One file for ty to check as it is and as fixed: ``path``, and the
    files each run reads in place of the tree's (relative path -> bytes,
    ``path`` among them). ``reads(relpath, appears)`` says whether ty's
    diagnostics on ``path`` may depend on the file ``relpath`` (its bytes;
    with ``appears``, whether it exists): where not, a run may hold it as
    another check needs it."""

    path: str
    before: Mapping[str, bytes]
    after: Mapping[str, bytes]
    reads: Callable[[str, bool], bool]
    #: Whether the file as it is needs checking, given its diagnostics as
    #: fixed: a verdict that reads the file's old diagnostics only to excuse
    #: new ones on the fix's lines needs none where there are none (about
    #: half the files a batch checks). None: always. Where it says no, the
    #: check's diagnostics before are ``[]``, not checked.
    needs_before: Callable[[list[Diagnostic]], bool] | None = None
    #: The 1-based lines of the fixed file the fix wrote, where the check's
    #: verdict reads its diagnostics as fixed only there as long as
    #: ``needs_before`` says no (runtime.py): a server then checks the
    #: file's :func:`.interface.outline` (the other functions' bodies left
    #: out), and the whole file only where that answer asks for the file
    #: as it is. None: the whole file.
    written: frozenset[int] | None = None

    def asks_before(self, after: list[Diagnostic] | CheckerFailed) -> bool:
        """Whether the file as it is is checked, given the answer as fixed
        (where ty could not check that, the check fails anyway)."""
        if isinstance(after, CheckerFailed):
            return False
        return self.needs_before is None or self.needs_before(after)


#: A check's diagnostics on its file as it is and as fixed, or why ty could
#: not give them.
Checked = tuple[list[Diagnostic], list[Diagnostic]] | CheckerFailed


def diagnostics_of(root: Path, checks: Sequence[Check]) -> list[Checked]:
    """ty on every check's file as it is and as fixed, in as few runs of ty
    as the checks allow, run side by side: one run checks every file whose
    diagnostics do not depend on what another file of the run holds for
    another check (:func:`_views`), and gives each the diagnostics a run of
    its own would (a verdict is keyed by what ty reads, closure.py: never
    by what else was checked beside it). With checks whose files read no
    other check's changes, one run of every file as fixed, and one of the
    files as they are that their checks ask for (``Check.needs_before``)."""
    if not checks:
        return []
    binary = _ty_binary()
    disk = _Disk(root)
    found: dict[tuple[int, str], list[Diagnostic] | CheckerFailed] = {}
    with tempfile.TemporaryDirectory(prefix="deepstack-runtime-") as scratch:

        def check(sides: list[_Side]) -> None:
            if not sides:
                return
            work = Path(tempfile.mkdtemp(dir=scratch))  # a folder per round
            settings = _settings(work)
            if SERVED:
                servable = [side for side in sides if _servable(side, disk)]
                found.update(_served(binary, root, work, settings, servable, disk))
            left = [side for side in sides if (side.check, side.state) not in found]
            found.update(_run(binary, work, _views(left, disk), root))

        # Every file as fixed, and as it is where a check always asks; then
        # as it is where a check asks it of its answer as fixed.
        sides = _sides(checks)
        always = {n for n, one in enumerate(checks) if not one.needs_before}
        check([s for s in sides if s.state == "after" or s.check in always])
        check(
            [
                side
                for side in sides
                if side.state == "before"
                and side.check not in always
                and checks[side.check].asks_before(found[side.check, "after"])
            ]
        )
    results: list[Checked] = []
    for number in range(len(checks)):
        before = found.get((number, "before"), [])  # not asked: not checked
        after = found[number, "after"]
        if isinstance(before, CheckerFailed) or isinstance(after, CheckerFailed):
            results.append(before if isinstance(before, CheckerFailed) else after)  # type: ignore[arg-type]
        else:
            results.append((before, after))
    return results


class ChecksAhead:
    """Checks told to a ``ty server`` as soon as they are known, checked on
    another core while the plan goes on (:class:`.tyserver.Ahead`): a state
    asked while the server is busy joins a waiting one where a run can give
    both what a run of its own would (:func:`_joined`). A check that holds
    a file the tree lacks, or one that is not UTF-8, is not taken (it goes
    to :func:`diagnostics_of`), nor is one whose server failed."""

    def __init__(self, root: Path, binary: str) -> None:
        self._disk = _Disk(root)
        self._count = 0
        self._checks: dict[int, Check] = {}
        #: The checks asked for their file as it is of their answer as fixed.
        self._asked_before: set[int] = set()
        #: The checks whose file as fixed was checked as its outline first.
        self._outlined: set[int] = set()
        work = Path(tempfile.mkdtemp(prefix="deepstack-runtime-"))
        try:
            self._servers = tyserver.Ahead(
                binary,
                root,
                work,
                _settings(work),
                _SERVERS_AHEAD,
                self._disk,  # type: ignore[arg-type]
                self._join,
                self._answered,
            )
        except BaseException:  # an interrupt as it starts: no folder left
            shutil.rmtree(work, ignore_errors=True)
            raise

    @classmethod
    def start(cls, root: Path) -> ChecksAhead | None:
        """Servers on ``root``, starting; None where ty is not there (the
        checks say so when they run)."""
        try:
            return cls(root, _ty_binary())
        except CheckerFailed:
            return None

    def ask(self, check: Check) -> int | None:
        """Have ``check`` checked; its number for :meth:`answers`, or None
        where it is not taken."""
        sides = _sides([check])
        if not all(_servable(side, self._disk) for side in sides):
            return None
        number, self._count = self._count, self._count + 1
        self._checks[number] = check
        # One server: the state as it is (where the check always asks for
        # it), then as fixed (its outline, where the check allows one).
        server = None
        for side in sides:
            if side.state == "after" or not check.needs_before:
                shown = self._outline(number) if side.state == "after" else None
                server = self._servers.ask(
                    (number, side.state), side.files, side.path, server, shown
                )
        return number

    def _outline(self, number: int) -> bytes | None:
        """The text the server checks for ``number``'s file as fixed in
        place of the whole (:attr:`Check.written`), or None: the whole."""
        check = self._checks[number]
        if check.written is None or check.needs_before is None:
            return None
        fixed = check.after[check.path]
        shown = outline(fixed, check.written)
        if shown is None or shown == fixed:
            return None
        self._outlined.add(number)
        return shown

    def _join(self, run: tyserver._Run, job: tyserver._Job) -> dict[str, bytes] | None:
        """The files of ``run`` with ``job``'s state joined (:func:`_joined`)."""
        view = _View(run.files, [self._side(each) for each in run.jobs])
        return _joined(view, self._side(job), self._disk)

    def _side(self, job: tyserver._Job) -> _Side:
        number, state = job.name  # type: ignore[misc]
        check = self._checks[number]
        return _Side(number, state, check.path, job.files, check.reads)

    def _answered(self, job: Hashable, found: list[tuple[int, str, str]]) -> None:
        """A check that asks for its file as it is only of its answer as
        fixed is asked it as that answer comes, before it is given (on the
        server's thread): it joins what waits there, where the plan's end
        would have found the server idle and asked it alone."""
        number, state = job  # type: ignore[misc]
        check = self._checks[number]
        if (
            state == "after"
            and check.needs_before
            and check.asks_before([Diagnostic(*each) for each in found])
        ):
            # The verdict then weighs every diagnostic of the file as fixed
            # against those as it is: an outline's are not all of them.
            self._asked_before.add(number)
            if number in self._outlined:
                self._servers.ask((number, "whole"), check.after, check.path)
            self._servers.ask((number, "before"), check.before, check.path)

    def answers(
        self, numbers: Sequence[int]
    ) -> dict[int, tuple[list[Diagnostic], list[Diagnostic]]]:
        """The diagnostics of each check asked as ``numbers`` (before, after),
        once checked; none where its server failed."""
        upfront = {n for n in numbers if not self._checks[n].needs_before}
        found = self._servers.answers(
            (number, state)
            for number in numbers
            for state in ("before", "after")
            if state == "after" or number in upfront
        )
        # Asked as each answer as fixed came (:meth:`_answered`), before it.
        later = [number for number in numbers if number in self._asked_before]
        whole = {number for number in later if number in self._outlined}
        found.update(
            self._servers.answers(
                (number, state)
                for number in later
                for state in ("before", "whole")
                if state == "before" or number in whole
            )
        )
        asked_before = upfront.union(later)
        return {
            number: (
                [Diagnostic(*each) for each in found.get((number, "before"), [])],
                [
                    Diagnostic(*each)
                    for each in found[number, "whole" if number in whole else "after"]
                ],
            )
            for number in numbers
            if (number, "after") in found
            and (number not in asked_before or (number, "before") in found)
            and (number not in whole or (number, "whole") in found)
        }

    def close(self, at_once: bool = False) -> None:
        """Stop the servers (``at_once``: killed, the plan is abandoned)."""
        self._servers.close(at_once)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(at_once=kind is not None)


def _settings(work: Path) -> str:
    """ty's settings for a check, written to ``work``'s ``ty.toml`` (not the
    tree's ``[tool.ty]``): Python 3.10 and an environment without any
    third-party package (their types are unknown, never errors)."""
    (work / "env" / "lib" / f"python{PYTHON_VERSION}" / "site-packages").mkdir(
        parents=True
    )
    settings = (
        f"[environment]\npython = {json.dumps(str(work / 'env'))}\n"
        f'python-version = "{PYTHON_VERSION}"\n'
    )
    (work / "ty.toml").write_text(settings)
    return settings


#: How many servers check ahead. One: each server infers the modules the
#: checks share once more, and a second state joined to a run costs a server
#: less than a run of its own. On a first ``status`` of 40 derived fixes on
#: 0.20.2 (2 cores), one server that joins the states waiting for it used
#: 1.2 s less CPU than two (9.0 s against 10.2 s) and ended 0.4 s sooner;
#: two that join ended no sooner than two that did not.
_SERVERS_AHEAD = 1


#: Whether the checks go through ``ty server`` (:mod:`.tyserver`) where
#: they can; off, every check runs ``ty check`` (a test compares the two).
SERVED = True


class _Disk:
    """The tree's bytes of a file (None where it has none), each read once;
    and whether bytes are UTF-8, each decoded once (a state lays every file
    the earlier fixes rewrote: 50 for the last of a batch of 40, each
    decoded again for each state)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._read: dict[str, bytes | None] = {}
        self._utf8: dict[bytes, bool] = {}

    def utf8(self, raw: bytes | None) -> bool:
        if raw is None:
            return False
        known = self._utf8.get(raw)
        if known is None:
            known = self._utf8[raw] = _utf8(raw)
        return known

    def __call__(self, relpath: str) -> bytes | None:
        if relpath not in self._read:
            try:
                self._read[relpath] = (self.root / relpath).read_bytes()
            except OSError:
                self._read[relpath] = None
        return self._read[relpath]


def _sides(checks: Sequence[Check]) -> list[_Side]:
    return [
        _Side(number, state, check.path, files, check.reads)
        for number, check in enumerate(checks)
        for state, files in (("before", check.before), ("after", check.after))
    ]


def _servable(side: _Side, disk: _Disk) -> bool:
    """Whether a server can be told the side's state: every file it lays is
    one the tree has (a server cannot be told of a module the tree lacks),
    and it and the tree's file are UTF-8 (the protocol's text is)."""
    return all(
        disk.utf8(raw) and disk.utf8(disk(relpath))
        for relpath, raw in side.files.items()
    )


def _utf8(raw: bytes | None) -> bool:
    if raw is None:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _served(
    binary: str,
    root: Path,
    work: Path,
    settings: str,
    sides: Sequence[_Side],
    disk: _Disk,
) -> dict[tuple[int, str], list[Diagnostic]]:
    """The sides' diagnostics from ``ty server``s, each told the files of
    the runs the sides would take (:func:`_views`) in turn and asked about
    their files at once; none where a server failed (they run ``ty check``).
    The runs are cut into as many stretches as there are servers, one
    server each, so consecutive runs (of patches in series order, laying
    almost the same files) stay with one server."""
    views = _views(sides, disk)
    if not views:
        return {}
    count = min(RUNS_AT_ONCE, len(views))
    stretches = [
        views[len(views) * n // count : len(views) * (n + 1) // count]
        for n in range(count)
    ]
    found: dict[tuple[int, str], list[Diagnostic]] = {}
    failed: list[tyserver.ServerFailed] = []

    def serve(number: int, stretch: list[_View]) -> None:
        try:
            with tyserver.served(
                binary, root, work / f"served{number}", settings, TIMEOUT_S
            ) as server:
                for view in stretch:
                    server.lay(view.files, disk)  # type: ignore[arg-type]
                    paths = {side.path for side in view.sides}
                    held = {
                        path: view.files[path] if path in view.files else disk(path)
                        for path in paths
                    }
                    by_path = server.diagnostics(held, TIMEOUT_S)  # type: ignore[arg-type]
                    for side in view.sides:
                        found[side.check, side.state] = [
                            Diagnostic(*diagnostic) for diagnostic in by_path[side.path]
                        ]
        except tyserver.ServerFailed as exc:
            failed.append(exc)

    threads = [  # daemons: an interrupt is never held up by a server
        threading.Thread(target=serve, args=(number, stretch), daemon=True)
        for number, stretch in enumerate(stretches)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {} if failed else found


def _run(
    binary: str, work: Path, views: list[_View], root: Path
) -> dict[tuple[int, str], list[Diagnostic] | CheckerFailed]:
    """The views' diagnostics, each view one run of ``ty check``, run side
    by side (:func:`.tyfolders.run_all`)."""
    found: dict[tuple[int, str], list[Diagnostic] | CheckerFailed] = {}
    runs = [(view.files, sorted({side.path for side in view.sides})) for view in views]
    outputs = run_all(binary, work / "ty.toml", root, work, runs, TIMEOUT_S)
    for view, output in zip(views, outputs, strict=True):
        if isinstance(output, RunFailed):
            for side in view.sides:
                found[side.check, side.state] = CheckerFailed(str(output))
            continue
        by_path = _parsed(output)
        for side in view.sides:
            found[side.check, side.state] = by_path.get(side.path, [])
    return found


@dataclass(frozen=True)
class _Side:
    """One state of one check's file: ``check``'s index, ``state`` (before,
    after), and the files that state lays over the tree."""

    check: int
    state: str
    path: str
    files: Mapping[str, bytes]
    reads: Callable[[str, bool], bool]


@dataclass
class _View:
    """One run of ty: the files it lays over the tree, and what it checks."""

    files: dict[str, bytes]
    sides: list[_Side]


def _views(sides: Sequence[_Side], disk: _Disk) -> list[_View]:
    """The runs of ty the sides need: each side (a check's file as it is,
    or as fixed) joins the first run whose files it agrees with wherever it
    or a side already there reads (:func:`_joined`); a new run where none."""
    views: list[_View] = []
    for side in sides:
        for view in views:
            joined = _joined(view, side, disk)
            if joined is not None:
                view.files, view.sides = joined, [*view.sides, side]
                break
        else:
            views.append(_View(dict(side.files), [side]))
    return views


def _joined(
    view: _View, side: _Side, disk: Callable[[str], bytes | None]
) -> dict[str, bytes] | None:
    """The files of ``view`` with ``side`` in it, or None where a file they
    hold apart is one the side and a side of the view both depend on (its
    checked file, or one it reads): no run can give both what they read.

    Another file's check sees only a module's interface: where the two
    versions agree on it, a side that reads the file takes either. That
    parses both versions, the dearest step of a join, so it is taken last:
    only where nothing cheaper already refuses the join."""
    joined = dict(view.files)
    alike_needed: list[tuple[str, bytes, bytes, bool]] = []
    for relpath in side.files.keys() | view.files.keys():
        mine = side.files.get(relpath, disk(relpath))
        theirs = view.files.get(relpath, disk(relpath))
        if mine == theirs:
            continue
        appears = mine is None or theirs is None
        own = relpath == side.path
        if not own and not side.reads(relpath, appears):
            continue  # the run's bytes stand
        checked = any(relpath == other.path for other in view.sides)
        if not checked and not any(
            other.reads(relpath, appears) for other in view.sides
        ):
            if mine is None:
                return None  # a run cannot lay an absence over the tree
            joined[relpath] = mine  # nothing else in the run depends on it
            continue
        if appears or (own and checked):
            return None
        alike_needed.append((relpath, mine, theirs, own))  # type: ignore[arg-type]
    for relpath, mine, theirs, own in alike_needed:
        if not same_interface(mine, theirs):
            return None
        if own:  # the side's own file as it checks it; the others see alike
            joined[relpath] = mine
    return joined


def _parsed(output: str) -> dict[str, list[Diagnostic]]:
    """A run's diagnostics, by the file they are on."""
    found: dict[str, list[Diagnostic]] = {}
    for line in output.splitlines():
        if m := _DIAGNOSTIC.fullmatch(line):
            found.setdefault(m["path"], []).append(
                Diagnostic(int(m["line"]), m["rule"], m["message"])
            )
    return found


#: A diagnostic as ty's concise output gives it.
_DIAGNOSTIC = re.compile(
    r"(?P<path>[^:]+\.pyi?):(?P<line>\d+):\d+: \w+\[(?P<rule>[\w-]+)\] (?P<message>.*)"
)


def _ty_binary() -> str:
    try:
        from ty import find_ty_bin
    except ImportError:
        raise CheckerFailed(
            "ty is not installed (pip install deepstack-patch brings it)"
        ) from None
    try:
        return os.fsdecode(find_ty_bin())
    except FileNotFoundError as exc:
        raise CheckerFailed(f"ty's binary is missing: {exc}") from None

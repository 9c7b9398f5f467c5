"""The release's own tests of what a patch changes, before and after the fix.

For each patch, verify with a pristine tree selects the tests of the
release's ``tests/`` that exercise the units the patch changes
(``impact.py``: by import, then by name; a built-in patch's units are the
functions and methods it was found at, beside its own proof) and
runs them with pytest in the proof environment on the pristine tree and on
the tree, at once: every patch's tests in one run per tree, within the sum
of their time budgets. Each selected test
(each parametrization, as pytest reports it) then reads:

- **pass-to-pass**: it passes before and after;
- **fail-to-pass**: it fails before and passes after (the fix shows);
- **pass-to-fail**: it passes before and fails after: a regression, which
  fails verify;
- **fails on both**: it fails the same way before and after, for a reason
  that is not the fix's (counted apart, never as a failure of the fix);
- **could not run**, with the reason: it skipped (it needs CUDA, say), the
  proof environment lacks a package or the network (``failures.py``), it
  needs a fixture of the tree's ``conftest.py`` (not loaded on the CPU:
  ``tree_tests.py``; ``rounds.py`` runs those tests once more with it
  loaded), or the budget ran out before it ran.

A patch whose pristine state is ``applied`` (upstream already has the fix)
runs nothing: both trees hold the same code. Nothing here names a fix.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deepstack_patch.proof.envs import ProofEnv, subprocess_env
from deepstack_patch.proof.executed import parts_of, watch_options, watched_lines
from deepstack_patch.proof.failures import environment_cause, failure_summary
from deepstack_patch.proof.forkserver import Spawn, run_subprocess
from deepstack_patch.proof.impact import ChangedUnit, Selection, select
from deepstack_patch.proof.pytest_results import LIMIT_OPTION, SELECT_OPTION
from deepstack_patch.proof.results import TestCase
from deepstack_patch.proof.tree_tests import NO_CONFTEST, TestRun, run_pytest

#: Seconds each patch's tests may take on each tree (they run side by side):
#: importing vLLM's tested modules takes 10-20 s on 2 cores, a parser's
#: tests a few more.
DEFAULT_BUDGET_S = 120.0

CONTINUE = "--continue-on-collection-errors"
_MISSING_FIXTURE = re.compile(r"fixture '([\w]+)' not found")
#: Why a test that needs a fixture of the tree's conftest.py could not run
#: (``rounds.py`` runs it again with the file loaded).
NEEDS_CONFTEST = "which verify does not load on the CPU (the tree's conftest.py)"
_TIMED_OUT = re.compile(r"timed out after ([\d.]+) s")
_FAILED = ("failed", "error")


@dataclass(frozen=True)
class TestOutcome:
    """One test's outcomes on the two trees, and what they say."""

    __test__ = False

    nodeid: str
    before: str  # passed, failed, error, skipped, "" (not reported)
    after: str
    #: Why it could not run, or how it failed ("" for a pass).
    reason: str = ""
    #: False where the patched tree's run watched the lines of the changed
    #: units the test reaches, and it executed none of them (executed.py).
    reached: bool = True
    #: True where it ran with the tree's conftest.py loaded (with_conftest).
    conftest: bool = False

    def json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "before": self.before or None,
            "after": self.after or None,
            "reason": self.reason,
        }


@dataclass
class ReleaseTests:
    """One patch's run of the release's tests of what it changes."""

    selection: Selection
    budget_s: float
    pass_to_pass: list[TestOutcome] = field(default_factory=list)
    fail_to_pass: list[TestOutcome] = field(default_factory=list)
    pass_to_fail: list[TestOutcome] = field(default_factory=list)
    fails_on_both: list[TestOutcome] = field(default_factory=list)
    could_not_run: list[TestOutcome] = field(default_factory=list)
    #: Passed on both trees without executing the changed code: no evidence.
    not_reached: list[TestOutcome] = field(default_factory=list)
    #: Why nothing was run ("" when the tests ran).
    not_run: str = ""
    seconds: float = 0.0

    @property
    def ran(self) -> int:
        """Tests that ran to an outcome on both trees."""
        return (
            sum(map(len, (self.pass_to_pass, self.fail_to_pass, self.pass_to_fail)))
            + len(self.fails_on_both)
            + len(self.not_reached)
        )

    @property
    def problem(self) -> str:
        """A regression; ``""`` where there is none."""
        if not self.pass_to_fail:
            return ""
        first = self.pass_to_fail[0]
        return (
            f"release tests: {len(self.pass_to_fail)} pass on the pristine tree "
            f"and fail after the fix (pass-to-fail), e.g. {first.nodeid}: "
            f"{first.reason}"
        )

    @property
    def summary(self) -> str:
        """The counts in a few words."""
        if self.not_run:
            return f"none run: {self.not_run}"
        counts = [
            (len(self.pass_to_pass), "pass-to-pass"),
            (len(self.fail_to_pass), "fail-to-pass"),
            (len(self.pass_to_fail), "pass-to-fail"),
            (len(self.fails_on_both), "fail on both"),
            (len(self.not_reached), "pass without running the changed code"),
            (len(self.could_not_run), "could not run"),
        ]
        return ", ".join(f"{n} {label}" for n, label in counts if n) or "none run"

    def reasons(self) -> dict[str, int]:
        """Why tests could not run (and fail on both), each with its count."""
        found: dict[str, int] = {}
        for outcome in [*self.could_not_run, *self.fails_on_both]:
            found[outcome.reason] = found.get(outcome.reason, 0) + 1
        return found

    def json(self) -> dict[str, Any]:
        return {
            "selected": sorted(self.selection.tests),
            "importers": self.selection.importers,
            "through": self.selection.through,
            "coarse": self.selection.coarse,
            "unreached": self.selection.unreached,
            "not_run": self.not_run,
            "budget_s": self.budget_s,
            "seconds": self.seconds,
            "pass_to_pass": [o.nodeid for o in self.pass_to_pass],
            "fail_to_pass": [o.nodeid for o in self.fail_to_pass],
            "pass_to_fail": [o.json() for o in self.pass_to_fail],
            "fails_on_both": [o.json() for o in self.fails_on_both],
            "could_not_run": [o.json() for o in self.could_not_run],
            "not_reached": [o.nodeid for o in self.not_reached],
        }


@dataclass
class Pending:
    """A patch's selection, and its runs on the pristine tree and the tree
    (None: nothing to run)."""

    selection: Selection
    runs: tuple[Future[TestRun], Future[TestRun]] | None = None
    #: The changed units whose lines the tree's run watched (executed.py).
    watched: frozenset[str] = frozenset()


def submit(
    pool: ThreadPoolExecutor,
    env: ProofEnv,
    tree: Path,
    pristine: Path,
    units: list[ChangedUnit],
    budget_s: float,
    spawn: Spawn = run_subprocess,
    again: ReleaseTests | None = None,
) -> Pending:
    """One patch's :func:`submit_together`."""
    earlier = {"": again} if again is not None else {}
    return submit_together(
        pool, env, tree, pristine, {"": units}, budget_s, spawn, earlier
    )[""]


def submit_together(
    pool: ThreadPoolExecutor,
    env: ProofEnv,
    tree: Path,
    pristine: Path,
    units: Mapping[str, list[ChangedUnit]],
    budget_s: float,
    spawn: Spawn = run_subprocess,
    again: Mapping[str, ReleaseTests] | None = None,
    conftest: bool = False,
) -> dict[str, Pending]:
    """Select each patch's tests (``units``: patch -> its changed units)
    and start them: every patch's in one pytest run per tree, within the
    sum of their budgets. ``again``: a patch's earlier run, whose tests that
    could not run are the only ones run now (:func:`kept_with` keeps the
    others' outcomes). ``conftest``: with the tree's conftest.py loaded.

    One run per tree, not one per patch: each run imports torch and vLLM
    before its first test (10-20 s on 2 cores), and the patches of a batch
    are all applied to the same two trees. vLLM's own CI runs its tests
    many to a process too; the results are written after each test, so a
    run that crashes or runs out of time still tells what finished."""
    selections = {}
    for key, changed in units.items():
        selection = select(tree, changed)
        if again and key in again:
            selection = replace(selection, tests=_could_not_run(selection, again[key]))
        selections[key] = selection
    chosen = [selection for selection in selections.values() if selection.tests]
    if not chosen:
        return {key: Pending(selection) for key, selection in selections.items()}
    merged: dict[str, list[str]] = {}
    for selection in chosen:
        for nodeid, parts in selection.tests.items():
            merged.setdefault(nodeid, []).extend(parts)
    timeout = budget_s * len(chosen)
    # What the fixed code is: the patched tree's lines (executed.py).
    watch = watched_lines(tree, (u for key in units for u in units[key]))
    # One test may take its patch's budget, no more: one that hangs would
    # take the time of every patch after it.
    runs = (
        pool.submit(run_selected, env, pristine, merged, timeout, spawn, budget_s, None,
                    conftest),
        pool.submit(run_selected, env, tree, merged, timeout, spawn, budget_s, watch,
                    conftest),
    )  # fmt: skip
    watched = frozenset(parts_of(watch))
    return {
        key: Pending(selection, runs if selection.tests else None, watched)
        for key, selection in selections.items()
    }


def say_together(runs: dict[str, Pending], progress: Callable[[str], None]) -> None:
    """Tell that the patches' selected tests run at once, one run per tree."""
    chosen = [pending for pending in runs.values() if pending.runs is not None]
    if len(chosen) > 1:
        tests = {nodeid for pending in chosen for nodeid in pending.selection.tests}
        progress(
            f"release tests: {len(tests)} of {len(chosen)} patches, "
            "in one pytest run on each tree"
        )


def _could_not_run(selection: Selection, earlier: ReleaseTests) -> dict[str, list[str]]:
    """The selected tests that could not run in ``earlier``: by node id
    (each parametrization's test), or all of a file that did not import."""
    nodeids = {o.nodeid for o in earlier.could_not_run}
    files = {nodeid for nodeid in nodeids if "::" not in nodeid}
    tests = {nodeid.split("[")[0] for nodeid in nodeids}
    return {
        nodeid: parts
        for nodeid, parts in selection.tests.items()
        if nodeid in tests or nodeid.split("::")[0] in files
    }


def run_selected(
    env: ProofEnv,
    tree: Path,
    tests: Mapping[str, list[str]],
    budget_s: float,
    spawn: Spawn,
    limit: float,
    watch: Mapping[str, list[tuple[int, int, str]]] | None = None,
    conftest: bool = False,
) -> TestRun:
    # pytest is given the files, and our plugin keeps the selected tests: a
    # test file that cannot import (a package it lacks) then stops none of
    # the others, where a node id of it would end the session.
    files = {nodeid.split("::")[0]: [] for nodeid in tests}
    with tempfile.TemporaryDirectory(prefix="deepstack-select-") as scratch:
        wanted = Path(scratch) / "selected.json"
        wanted.write_text(json.dumps(sorted(tests)))
        options = [
            CONTINUE, f"{SELECT_OPTION}={wanted}", f"{LIMIT_OPTION}={limit:g}",
            *watch_options(watch or {}, Path(scratch)),
        ]  # fmt: skip
        return run_pytest(
            env.python, tree, files, [], env=subprocess_env(tree),
            timeout=budget_s, spawn=spawn, options=options, conftest=conftest,
        )  # fmt: skip


def collect(pending: Pending, budget_s: float) -> ReleaseTests:
    """The outcome of :func:`submit`'s runs, each test compared."""
    selection = pending.selection
    if pending.runs is None:
        return ReleaseTests(selection, budget_s, not_run=selection.reason)
    before, after = (future.result() for future in pending.runs)
    result = ReleaseTests(selection, budget_s)
    outcomes, seconds = _compared(selection, before, after, budget_s, pending.watched)
    result.seconds = seconds
    for outcome in outcomes:
        _bucket(result, outcome).append(outcome)
    return result


def kept_with(earlier: ReleaseTests, later: ReleaseTests) -> ReleaseTests:
    """A later round's run (with added packages) over an earlier one's: each
    test that ran to an outcome on both trees keeps it, and only what could
    not run takes the later round's outcome. An added package can break a
    test's import (a compiled extension built for another torch did, every
    test that loaded transformers with it); it must never take away what
    the earlier round showed."""
    ran = {
        outcome.nodeid: outcome
        for outcome in [
            *earlier.pass_to_pass, *earlier.fail_to_pass,
            *earlier.pass_to_fail, *earlier.fails_on_both, *earlier.not_reached,
        ]
    }  # fmt: skip
    if earlier.not_run:
        return later
    if not ran:  # the earlier round's selection: the later one ran part of it
        return (
            later
            if earlier.selection is None
            else replace(later, selection=earlier.selection)
        )
    result = ReleaseTests(earlier.selection, later.budget_s)
    result.seconds = round(earlier.seconds + later.seconds, 1)
    redone = {o.nodeid for o in _outcomes(later)}
    for outcome in [
        *ran.values(),
        *(o for o in _outcomes(later) if o.nodeid not in ran),
        *(o for o in earlier.could_not_run if o.nodeid not in redone),
    ]:
        _bucket(result, outcome).append(outcome)
    return result


#: The fields of ReleaseTests that hold compared tests.
BUCKETS = (
    "pass_to_pass", "fail_to_pass", "pass_to_fail", "fails_on_both",
    "could_not_run", "not_reached",
)  # fmt: skip


def _outcomes(result: ReleaseTests) -> list[TestOutcome]:
    return [outcome for bucket in BUCKETS for outcome in getattr(result, bucket)]


def _bucket(result: ReleaseTests, outcome: TestOutcome) -> list[TestOutcome]:
    """The count a compared test goes to. What the environment lacked on
    either tree decides first: a test that needed the network on one side
    shows nothing about the fix, whatever the other side says."""
    match outcome.before, outcome.after, outcome.reason:
        case _, _, reason if reason.startswith(CANNOT_RUN):
            return result.could_not_run
        case "passed", "passed", _:
            return result.pass_to_pass if outcome.reached else result.not_reached
        case (("failed" | "error"), "passed", _):
            return result.fail_to_pass
        case "passed", ("failed" | "error"), _:
            return result.pass_to_fail
        case (("failed" | "error"), ("failed" | "error"), _):
            return result.fails_on_both
    return result.could_not_run


#: How a reason that is no failure of the code starts.
CANNOT_RUN = "could not run: "


def compare(
    selection: Selection, before: TestRun, after: TestRun, budget_s: float
) -> list[TestOutcome]:
    """Each selected test (each parametrization) on both trees."""
    return _compared(selection, before, after, budget_s)[0]


def _compared(
    selection: Selection,
    before: TestRun,
    after: TestRun,
    budget_s: float,
    watched: frozenset[str] = frozenset(),
) -> tuple[list[TestOutcome], float]:
    """:func:`compare`, and the seconds the selected tests took on the
    slower tree (pytest's durations: a run holds other patches' tests too).
    ``watched``: the changed units whose lines the tree's run watched."""
    sides = [_by_test(selection, run) for run in (before, after)]
    mine = {part for parts in selection.tests.values() for part in parts}
    mine |= {*selection.unreached}
    outcomes = []
    for nodeid in sorted({*sides[0], *sides[1]}):
        cases = [side.get(nodeid) for side in sides]
        outcome = [case.outcome if case else "" for case in cases]
        reason = _cannot_run(cases, [before, after], budget_s)
        if not reason and outcome[1] in _FAILED:
            reason = failure_summary(cases[1].message if cases[1] else "")
        elif not reason and outcome[0] in _FAILED:
            reason = failure_summary(cases[0].message if cases[0] else "")
        reached = _reached(selection, nodeid, cases[1], mine, watched)
        outcomes.append(TestOutcome(nodeid, outcome[0], outcome[1], reason, reached))
    seconds = max(
        sum(case.seconds for case in side.values() if case is not None)
        for side in sides
    )
    return outcomes, round(seconds, 1)


def _by_test(selection: Selection, run: TestRun) -> dict[str, TestCase | None]:
    """A run's case of each selected test: by its own node id (with its
    parameters), a file's error for a file that did not import, None for
    a selected test the run did not report."""
    found: dict[str, TestCase | None] = {}
    in_file: dict[str, list[TestCase]] = {}
    for case in run.cases:
        in_file.setdefault(case.nodeid.split("::")[0], []).append(case)
    for nodeid in selection.tests:
        file = nodeid.split("::")[0]
        mine = [c for c in in_file.get(file, ()) if _is_case_of(c.nodeid, nodeid)]
        for case in mine:
            found[case.nodeid] = case
        if not mine:
            errors = [c for c in in_file.get(file, ()) if c.nodeid == file]
            found[nodeid] = errors[0] if errors else None
    return found


def _reached(
    selection: Selection,
    nodeid: str,
    case: TestCase | None,
    mine: set[str],
    watched: frozenset[str],
) -> bool:
    """Whether the test executed a changed unit of its patch on the tree, as
    far as the run can tell: True where it did, or where a unit it reaches
    (as selected) runs at import or was not watched."""
    if case is None or case.reached is None:
        return True
    static = {
        part
        for key, parts in selection.tests.items()
        if _is_case_of(nodeid, key)
        for part in parts
    }
    if not static or not static <= watched:
        return True
    return bool(mine & set(case.reached))


def _is_case_of(case: str, nodeid: str) -> bool:
    return case == nodeid or case.startswith((nodeid + "[", nodeid + "::"))


def _cannot_run(
    cases: list[TestCase | None], runs: list[TestRun], budget_s: float
) -> str:
    """Why a test could not run on one of the trees (``""``: it ran on both)."""
    for case, run in zip(cases, runs, strict=True):
        if case is None:
            if run.error and (spent := _TIMED_OUT.search(run.error)):
                why = f"the time budget ({budget_s:.0f} s) ran out before it ran"
                if (whole := float(spent[1])) > budget_s:
                    why = (
                        f"the time budget ({budget_s:.0f} s a patch, {whole:.0f} s "
                        f"for the {whole / budget_s:.0f} patches whose tests ran "
                        "together) ran out before it ran"
                    )
            else:
                why = "pytest did not report it"
            return CANNOT_RUN + why
    for case in cases:
        assert case is not None
        if case.outcome == "skipped":
            return CANNOT_RUN + f"skipped ({case.message or 'no reason given'})"
        cause = environment_cause(case.message)
        if case.outcome in _FAILED and cause:
            return CANNOT_RUN + cause
    for case, run in zip(cases, runs, strict=True):
        missing = _MISSING_FIXTURE.search(case.message) if case else None
        if case and case.outcome == "error" and missing:
            why = (
                NEEDS_CONFTEST
                if NO_CONFTEST in run.command
                else "which neither the test file nor the tree's conftest.py defines"
            )
            return f"{CANNOT_RUN}it needs the fixture {missing[1]!r}, {why}"
    return ""

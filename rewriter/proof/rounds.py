"""The later rounds of verify's tests, after the first run of every patch's
recorded and selected tests (``verify.py``):

- **added packages** (:func:`extras_rounds`): where a recorded or selected
  test could not run for a package the proof environment lacks, that
  package at the release's pin in an overlay of the environment
  (``extras.py``), and those patches' tests run again with it, round after
  round, for what a round's runs still lack;
- **the tree's conftest.py**: the tests that could not run for one of its
  fixtures (not loaded on the CPU: ``tree_tests.py``) run once more with
  it loaded; where it does not import for a package the environment
  lacks, that package is added as a test's would be (``extras.py``);
- **a difference run again**: a test that passed on one tree and failed on
  the other ran beside every other selected test, with both trees' runs at
  once; it runs again alone, one tree after the other, before it counts
  as a regression or as a fix shown.

Each keeps what the earlier runs showed (``release_tests.kept_with``) and
only moves what the new run says (recorded tests that ran on both trees
keep what they showed). Nothing here names a fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.proof.envs import ProofEnv
from deepstack_patch.proof.extras import Extras, missing_packages, provide
from deepstack_patch.proof.forkserver import Spawn, run_subprocess
from deepstack_patch.proof.impact import ChangedUnit, units_of
from deepstack_patch.proof.proofs import COULD_NOT_RUN, ProofResult
from deepstack_patch.proof.recorded_tests import recorded_proof
from deepstack_patch.proof.release_tests import (
    BUCKETS,
    CANNOT_RUN,
    NEEDS_CONFTEST,
    Pending,
    ReleaseTests,
    TestOutcome,
    collect,
    kept_with,
    run_selected,
    say_together,
    submit_together,
)
from deepstack_patch.proof.verdicts import PatchVerdict, recorded_tests_trees

Progress = Callable[[str], None]

_CONFTEST_IMPORT = re.compile(
    r"ImportError while loading conftest '([^']+)'.*?^E\s+(\S.*?)$",
    re.MULTILINE | re.DOTALL,
)
_MISSING_MODULE = re.compile(r"No module named '([\w]+)")


#: Rounds of added packages after the first run of the tests, at most: a
#: package can show only once another is in (0.20.2's tests asked for
#: ``uvicorn`` once ``anthropic`` was added, then for ``watchfiles``), so
#: each round asks again for what the last one's runs still lack, until
#: nothing new is asked for.
EXTRA_ROUNDS = 4


def extras_rounds(
    env: ProofEnv,
    tree: VllmTree,
    pristine: VllmTree | None,
    verdicts: list[PatchVerdict],
    scratch: Path,
    budget: float,
    jobs: int,
    progress: Progress,
) -> Extras | None:
    """Where a recorded or selected test could not run for a package the
    proof environment lacks: that package at the release's pin, in an
    overlay of the environment (``extras.py``), and those patches' tests run
    again with it, round after round (at most EXTRA_ROUNDS); what could not
    be given says why."""

    def reasons(verdict: PatchVerdict) -> list[str]:
        found = [
            proof.message
            for proof in (verdict.proof, verdict.pristine_proof)
            if proof is not None and proof.status == COULD_NOT_RUN
        ]
        if verdict.release_tests is not None:
            found += [o.reason for o in verdict.release_tests.could_not_run]
        return found

    extras: Extras | None = None
    asked: set[str] = set()
    for _ in range(EXTRA_ROUNDS):
        wanting = {v.patch.id: missing_packages(reasons(v)) for v in verdicts}
        new = list(
            dict.fromkeys(
                m for found in wanting.values() for m in found if m not in asked
            )
        )
        if not new:
            break
        asked.update(new)
        progress(f"tests could not run without: {', '.join(new)}")
        # The overlay holds what the earlier rounds added as well (a test
        # that needed those still needs them), as they decided it.
        extras = provide(env, tree.root, new, progress, earlier=extras)
        for module in new:
            if module in extras.refused:
                progress(f"{module}: not added: {extras.refused[module]}")
            if module in extras.unpinned:
                progress(
                    f"{module}: added at its newest version beside the "
                    f"environment: {extras.unpinned[module]}"
                )
        if extras.env is None:
            break
        added = set(new) & set(extras.installed)
        again = [v for v in verdicts if set(wanting[v.patch.id]) & added]
        for verdict in again:
            progress(f"{verdict.patch.id}: its tests again, with "
                     f"{', '.join(extras.installed.values())}")  # fmt: skip
        # Every patch's runs at once, as in the first round.
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            finish = _rerun(
                pool, extras.env, tree, pristine, again, scratch, budget, progress
            )
            finish()
    if extras is not None:
        _say_refused(verdicts, extras)
    return extras


def _rerun(
    pool: ThreadPoolExecutor,
    env: ProofEnv,
    tree: VllmTree,
    pristine: VllmTree | None,
    verdicts: list[PatchVerdict],
    scratch: Path,
    budget: float,
    progress: Progress,
) -> Callable[[], None]:
    """The patches' recorded tests and release tests once more, in ``env``,
    started in ``pool`` (the release tests of all of them in one run per
    tree); what sets their results on the verdicts."""
    release: dict[str, Pending] = {}
    earlier = {v.patch.id: v for v in verdicts if v.release_tests is not None}
    if pristine is not None and earlier:
        release = submit_together(
            pool, env, tree.root, pristine.root,
            {
                patch_id: units_of(v.patch, v.changed_files, v.changed_symbols)
                for patch_id, v in earlier.items()
            },
            budget,
            again={patch_id: v.release_tests for patch_id, v in earlier.items()},
        )  # fmt: skip
        say_together(release, progress)
    # patch -> {is_pristine: its recorded tests' run on that tree}
    proofs: dict[str, dict[bool, Future[dict[str, ProofResult]]]] = {}
    for verdict in verdicts:
        patch = verdict.patch
        # Recorded tests that ran on both trees keep what they showed (see
        # kept_with): only those that could not run on one run again.
        ran = all(
            proof is not None and proof.status != COULD_NOT_RUN
            for proof in (verdict.proof, verdict.pristine_proof)
        )
        trees = [] if ran else recorded_tests_trees(verdict, tree, pristine)
        proofs[patch.id] = {
            is_pristine: pool.submit(
                recorded_proof, env, on.root, patch, scratch, pristine=is_pristine
            )
            for on, is_pristine in trees
        }

    def finish() -> None:
        for verdict in verdicts:
            runs = proofs[verdict.patch.id]
            if False in runs:
                verdict.proof = runs[False].result()[verdict.patch.id]
            if True in runs:
                verdict.pristine_proof = runs[True].result()[verdict.patch.id]
            if verdict.patch.id in release:
                later = collect(release[verdict.patch.id], budget)
                first = verdict.release_tests
                verdict.release_tests = (
                    later if first is None else kept_with(first, later)
                )

    return finish


def _say_refused(verdicts: list[PatchVerdict], extras: Extras) -> None:
    """Each test still short of a package says why it was not added."""
    if not extras.refused:
        return
    for verdict in verdicts:
        for proof in (verdict.proof, verdict.pristine_proof):
            if proof is not None and proof.status == COULD_NOT_RUN:
                proof.message += "".join(
                    f"\n{module}: not added: {why}"
                    for module, why in _refused_in(proof.message, extras.refused)
                )
        if verdict.release_tests is not None:
            verdict.release_tests.could_not_run = [
                _with_note(o, extras.refused)
                for o in verdict.release_tests.could_not_run
            ]


def _refused_in(text: str, refused: Mapping[str, str]) -> list[tuple[str, str]]:
    """The refused packages ``text`` says a test lacks, each with why it was
    not added, in ``refused``'s order."""
    named = set(missing_packages([text]))
    return [(module, why) for module, why in refused.items() if module in named]


def _with_note(outcome: TestOutcome, refused: Mapping[str, str]) -> TestOutcome:
    found = _refused_in(outcome.reason, refused)
    return (
        replace(outcome, reason=f"{outcome.reason} ({found[0][1]})")
        if found
        else outcome
    )


@dataclass
class ConftestRound:
    """The round of :func:`with_conftest`: each patch's release tests with
    it, or what kept the conftest from loading."""

    #: patch -> its release tests, the round's outcomes kept with the earlier.
    results: dict[str, ReleaseTests] = field(default_factory=dict)
    #: Why the tree's conftest.py did not import ("" where it did).
    error: str = ""

    @property
    def missing(self) -> str:
        """The top-level module it lacked, where that was why ("" else)."""
        found = _MISSING_MODULE.search(self.error)
        return found[1] if found else ""


def needs_conftest(result: ReleaseTests | None) -> bool:
    """Whether a test of ``result`` could not run for a fixture of the tree's
    conftest.py, not loaded."""
    return result is not None and any(
        NEEDS_CONFTEST in outcome.reason for outcome in result.could_not_run
    )


def with_conftest(
    pool: ThreadPoolExecutor,
    env: ProofEnv,
    tree: Path,
    pristine: Path,
    units: Mapping[str, list[ChangedUnit]],
    earlier: Mapping[str, ReleaseTests],
    budget_s: float,
    spawn: Spawn = run_subprocess,
) -> ConftestRound:
    """The tests of ``earlier`` (patch -> its release tests) that could not
    run for a fixture of the tree's conftest.py, once more with it loaded:
    vLLM's ``default_vllm_config`` only sets a default ``VllmConfig``, and
    on 0.20.2 the whole file imports on the CPU. Only those tests run, and
    ``kept_with`` keeps every other outcome. Where the file does not
    import here, nothing changes and the round says why."""
    only = {
        key: replace(result, could_not_run=[
            o for o in result.could_not_run if NEEDS_CONFTEST in o.reason
        ])
        for key, result in earlier.items()
        if needs_conftest(result)
    }  # fmt: skip
    if not only:
        return ConftestRound()
    pending = submit_together(
        pool, env, tree, pristine, {key: units[key] for key in only}, budget_s,
        spawn, again=only, conftest=True,
    )  # fmt: skip
    # One run per tree for every patch: where one reported nothing, the
    # conftest did not load, and no patch's tests ran.
    shared = next((one.runs for one in pending.values() if one.runs), ())
    for run in (future.result() for future in shared):
        if not run.cases:
            failed = _CONFTEST_IMPORT.search(run.error)
            why = (
                f"{failed[2]} (at {failed[1]})" if failed else run.error.split("\n")[0]
            )
            return ConftestRound(error=why)
    return ConftestRound({
        key: kept_with(earlier[key], _outcomes_mapped(
            collect(pending[key], budget_s), lambda o: replace(o, conftest=True)
        ))
        for key in only
    })  # fmt: skip


def confirmed(
    env: ProofEnv,
    tree: Path,
    pristine: Path,
    results: Mapping[str, ReleaseTests],
    budget_s: float,
    spawn: Spawn = run_subprocess,
) -> dict[str, ReleaseTests]:
    """``results`` (patch -> its release tests), each test that passed on one
    tree and failed on the other run again before it counts: alone, with
    the other such tests only, on the pristine tree and then on the tree,
    one after the other. The first runs share a process with every other
    selected test, and the two trees' runs go at once: two copies of a
    distributed test share ``/dev/shm`` and the ports, and an earlier test
    can leave state behind (vllm#48879's shared-memory tests passed on
    0.20.2 and failed with the fix beside the batch, and do the same on
    both trees alone). A test whose outcomes are not the same again is
    neither a regression nor a fix shown: it could not run, and says both."""
    differing = {
        outcome.nodeid: outcome
        for result in results.values()
        for outcome in [*result.pass_to_fail, *result.fail_to_pass]
    }
    if not differing:
        return dict(results)
    timeout = budget_s * len({key for key, r in results.items() if _differs(r)})
    again: dict[str, tuple[str, ...]] = {}
    # As they ran: with the tree's conftest.py loaded, or not.
    for conftest in (False, True):
        tests = {n: [] for n, o in differing.items() if o.conftest == conftest}
        if not tests:
            continue
        # One tree after the other: the first runs went at once.
        runs = [
            run_selected(env, root, tests, timeout, spawn, budget_s, None, conftest)
            for root in (pristine, tree)
        ]
        for nodeid in tests:
            again[nodeid] = tuple(
                next((c.outcome for c in run.cases if c.nodeid == nodeid), "")
                for run in runs
            )
    unsteady = {
        nodeid: outcome
        for nodeid, outcome in differing.items()
        if [o == "passed" for o in again[nodeid]]
        != [outcome.before == "passed", outcome.after == "passed"]
    }
    return {
        key: _without_unsteady(result, unsteady, again)
        for key, result in results.items()
    }


def _outcomes_mapped(
    result: ReleaseTests, change: Callable[[TestOutcome], TestOutcome]
) -> ReleaseTests:
    """``result`` with ``change`` made to each of its tests' outcomes."""
    return replace(result, **{
        bucket: [change(outcome) for outcome in getattr(result, bucket)]
        for bucket in BUCKETS
    })  # fmt: skip


def _differs(result: ReleaseTests) -> bool:
    return bool(result.pass_to_fail or result.fail_to_pass)


def _without_unsteady(
    result: ReleaseTests,
    unsteady: Mapping[str, TestOutcome],
    again: Mapping[str, tuple[str, ...]],
) -> ReleaseTests:
    """``result`` with each test of ``unsteady`` moved to could not run."""
    if not any(o.nodeid in unsteady for o in result.pass_to_fail + result.fail_to_pass):
        return result
    moved = [
        replace(outcome, reason=(
            f"{CANNOT_RUN}beside the other tests it {outcome.before or 'did not run'} "
            f"on the pristine tree and {outcome.after or 'did not run'} after the "
            f"fix; run again alone, {again[outcome.nodeid][0] or 'not reported'} "
            f"and {again[outcome.nodeid][1] or 'not reported'}: its outcome "
            "depends on what runs beside it"
        ))
        for outcome in result.pass_to_fail + result.fail_to_pass
        if outcome.nodeid in unsteady
    ]  # fmt: skip
    return replace(
        result,
        pass_to_fail=[o for o in result.pass_to_fail if o.nodeid not in unsteady],
        fail_to_pass=[o for o in result.fail_to_pass if o.nodeid not in unsteady],
        could_not_run=[*result.could_not_run, *moved],
    )


def conftest_round(
    env: ProofEnv,
    tree: VllmTree,
    pristine: VllmTree | None,
    verdicts: list[PatchVerdict],
    extras: Extras | None,
    budget: float,
    jobs: int,
    progress: Progress,
) -> Extras | None:
    """The release tests that could not run for a fixture of the tree's
    conftest.py, once more with it loaded (:func:`with_conftest`), in
    the environment the rounds of packages left; where the file does not
    import for a package that environment lacks, that package is added as
    a test's would be (extras.py) and they run once again. Where it still
    does not import, each of those tests says why."""
    wanting = [v for v in verdicts if needs_conftest(v.release_tests)]
    if pristine is None or not wanting:
        return extras
    units = {
        v.patch.id: units_of(v.patch, v.changed_files, v.changed_symbols)
        for v in wanting
    }
    earlier = {v.patch.id: v.release_tests for v in wanting if v.release_tests}
    for _ in range(2):
        progress(
            f"{', '.join(earlier)}: the tests that need the tree's conftest.py "
            "again, with it loaded"
        )
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            found = with_conftest(
                pool, _tests_env(env, extras), tree.root, pristine.root, units,
                earlier, budget,
            )  # fmt: skip
        if not found.error:
            for verdict in wanting:
                verdict.release_tests = found.results[verdict.patch.id]
            return extras
        progress(f"the tree's conftest.py does not import here: {found.error}")
        if not found.missing or (extras and found.missing in extras.refused):
            break
        extras = provide(env, tree.root, [found.missing], progress, earlier=extras)
        if found.missing not in extras.installed:
            break
    for verdict in wanting:
        stage = verdict.release_tests
        assert stage is not None
        stage.could_not_run = [
            _conftest_note(outcome, found.error) for outcome in stage.could_not_run
        ]
    return extras


def confirm_differing(
    env: ProofEnv,
    tree: VllmTree,
    pristine: VllmTree | None,
    verdicts: list[PatchVerdict],
    extras: Extras | None,
    budget: float,
    progress: Progress,
) -> None:
    """The release tests that passed on one tree and failed on the other,
    run again alone before they count (:func:`confirmed`), in the
    environment the rounds of packages left."""
    results = {v.patch.id: v.release_tests for v in verdicts if v.release_tests}
    differing = sum(len(r.pass_to_fail) + len(r.fail_to_pass) for r in results.values())
    if pristine is None or not differing:
        return
    progress(
        f"release tests: {differing} that passed on one tree and failed on the "
        "other, again alone, one tree after the other"
    )
    checked = confirmed(
        _tests_env(env, extras), tree.root, pristine.root, results, budget
    )
    for verdict in verdicts:
        if verdict.patch.id in checked:
            verdict.release_tests = checked[verdict.patch.id]


def _tests_env(env: ProofEnv, extras: Extras | None) -> ProofEnv:
    """Where the later rounds run: the overlay the rounds of packages built,
    else the proof environment."""
    return extras.env if extras is not None and extras.env else env


def _conftest_note(outcome: TestOutcome, error: str) -> TestOutcome:
    if NEEDS_CONFTEST not in outcome.reason:
        return outcome
    why = f" of the tree's conftest.py, which does not import here: {error}"
    return replace(outcome, reason=outcome.reason.replace(f", {NEEDS_CONFTEST}", why))

"""Prove the fixes in a tree: each patch's proof, the tree's own tests, GPU tests.

Every check runs in a subprocess of a proof environment (see ``envs.py``)
with the tree first on ``sys.path`` and vLLM's CPU platform selected by
deepstack-patch's platform plugin:

- the proofs of all selected patches, in one process per tree (importing
  vLLM takes seconds): ``proofs.py`` and ``runner.py``;
- the tree's ``cpu_tests`` from targets.toml, with pytest reporting through
  a plugin of ours (``tree_tests.py``, ``results.py``), never its stdout;
- with a pristine tree, the proofs again on it: fail-to-pass. A companion
  (``Patch.companions``) repairs what its fix breaks, so its bug is latent on
  the pristine tree wherever the fix is needed: its pristine proof runs on
  the pristine tree with the fixes that name it applied alone
  (:func:`companion_baselines`);
- with ``--gpu``, the tree's ``gpu_tests`` under the official wheel's compiled
  extensions, or a skip with the reason when there is no GPU (``gpu.py``).

Independent subprocesses run in parallel, each forked from one process that
has imported torch and the third-party modules every job of the last run on
this release imported (``forkserver.py``; never a tree's module); the trees'
modules are compiled once, cached by content (``code_cache.py``). Nothing
here names a fix.
:func:`verify` is the plumbing the ``verify`` command and ``matrix --verify``
call; :func:`verify_tree` runs the checks with an environment at hand.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.installed import InstalledTree
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.series import patch_sources
from deepstack_patch.engine.targets import Targets
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.proof.baselines import pristine_runs, proven_on_baselines
from deepstack_patch.proof.envs import ProofEnv, subprocess_env
from deepstack_patch.proof.extras import Extras
from deepstack_patch.proof.forkserver import ForkServer
from deepstack_patch.proof.gpu import GpuStage, gpu_stage
from deepstack_patch.proof.imports import changed_modules, import_stage, run_imports
from deepstack_patch.proof.proofs import (
    ProofResult,
    has_proof,
    run_proofs,
)
from deepstack_patch.proof.recorded_tests import (
    fit_to_release,
    no_proof_reason,
    proven_by_recorded_tests,
    recorded_proof,
)
from deepstack_patch.proof.release_tests import DEFAULT_BUDGET_S, Pending, say_together
from deepstack_patch.proof.release_tests import collect as collect_release_tests
from deepstack_patch.proof.rounds import (
    confirm_differing,
    conftest_round,
    extras_rounds,
)
from deepstack_patch.proof.runtime_stage import runtime_stages
from deepstack_patch.proof.tree_tests import TestRun, run_pytest, select_tests
from deepstack_patch.proof.verdicts import (
    ChangedUnitTests,
    PatchVerdict,
    proof_runs_on,
    recorded_tests_trees,
)

Progress = Callable[[str], None]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_DRIFTED = 2


@dataclass
class VerifyReport:
    tree: VllmTree
    env: ProofEnv
    verdicts: list[PatchVerdict]
    cpu_tests: TestRun
    gpu: GpuStage
    pristine: VllmTree | None = None
    seconds: float = 0.0
    #: Packages added for tests that needed them, and those refused (extras.py).
    extras: Extras | None = None

    @property
    def ok(self) -> bool:
        return (
            all(not v.problems for v in self.verdicts)
            and self.cpu_tests.ok
            and self.gpu.ok
        )

    @property
    def drifted(self) -> bool:
        return any(v.state is PatchState.DRIFTED for v in self.verdicts)

    @property
    def exit_code(self) -> int:
        """2 a selected patch is drifted; 0 every check passed; 1 one failed."""
        return EXIT_DRIFTED if self.drifted else EXIT_OK if self.ok else EXIT_FAILED


def verify(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    targets: Targets,
    *,
    pristine: VllmTree | None = None,
    python: Path | None = None,
    gpu: bool = False,
    jobs: int = 3,
    test_budget: float = DEFAULT_BUDGET_S,
    progress: Progress = lambda line: None,
    building: Progress | None = None,
) -> VerifyReport:
    """Everything ``deepstack-patch verify`` does short of printing.

    The proof environment is ``python`` (checked), or the managed one, built
    on first use (its pip output goes to ``building``, else ``progress``).
    An installed vLLM is verified in its own interpreter (``installed_tests``).
    """
    from deepstack_patch.proof.envs import CPU_REQUIREMENTS, check_python, ensure_env

    if isinstance(tree, InstalledTree):
        return verify_installed(tree, series, selected, targets, gpu, jobs, progress)
    if python is not None:
        env = check_python(python)
    else:
        env = ensure_env("cpu", CPU_REQUIREMENTS, building or progress)
        built = " (built now)" if env.built_now else ""
        progress(f"proof environment: {env.root}{built}")
    return verify_tree(
        tree,
        series,
        selected,
        env,
        targets,
        pristine=pristine,
        gpu=gpu,
        jobs=jobs,
        test_budget=test_budget,
        progress=progress,
    )


def pristine_for(
    tree: VllmTree,
    against_pristine: bool,
    path: Path | None,
    progress: Progress = lambda line: None,
) -> VllmTree | None:
    """``--against-pristine [--pristine PATH]``: the tree to compare with, if any."""
    if path is not None and not against_pristine:
        raise DeepstackError(
            "--pristine goes with --against-pristine", "add --against-pristine"
        )
    if against_pristine and isinstance(tree, InstalledTree):
        raise DeepstackError(
            "--against-pristine compares two source trees in one environment; "
            f"an installed vLLM ({tree.root}) runs in its own interpreter",
            f"run `verify --installed` before and after `apply --installed` (the "
            f"proofs fail, then pass), or `verify --release {tree.version} "
            "--against-pristine` for the release's source",
        )
    return pristine_tree(tree, path, progress) if against_pristine else None


def pristine_tree(
    tree: VllmTree, path: Path | None, progress: Progress = lambda line: None
) -> VllmTree:
    """The unpatched tree: given, or the cached release of the tree's version."""
    if path is not None:
        return VllmTree.open(path)
    if tree.version_source not in ("PKG-INFO", "vllm/_version.py") or (
        "dev" in tree.version or "+" in tree.version
    ):
        raise DeepstackError(
            f"{tree.root} is vLLM {tree.version} (from {tree.version_source}), not "
            "a release on the package index, so there is no pristine copy to fetch",
            "give the unpatched tree with --pristine PATH (e.g. a `git worktree "
            "add` of the commit before your backports)",
        )
    from deepstack_patch.engine.cache import cache_dir
    from deepstack_patch.fetch.releases import fetch_release
    from deepstack_patch.output.progress import progress as download_progress

    # A cache folder only verify writes: it is never patched.
    out = cache_dir() / "pristine" / f"vllm-{tree.version}"
    with download_progress(f"vllm-{tree.version}.tar.gz") as update:
        pristine = fetch_release(tree.version, out, update)
    progress(f"vLLM {tree.version} source at {pristine.root}")
    return pristine


def _verdicts(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    pristine: VllmTree | None,
) -> list[PatchVerdict]:
    """Each selected patch's state here (and on the pristine tree), before proofs."""
    plan = plan_tree(tree, series, selected, rewrite=False)
    verdicts = [
        PatchVerdict(
            r.patch,
            r.state,
            r.reason,
            changed_files=_changed_files(r),
            changed_symbols=_changed_symbols(r),
        )
        for r in plan.reports
        if r.selected
    ]
    if pristine is not None:
        before = plan_tree(pristine, series, selected, rewrite=False)
        for verdict in verdicts:
            report = before.report(verdict.patch.id)
            verdict.pristine_state = report.state
            verdict.changed_files = sorted(
                {*verdict.changed_files, *_changed_files(report)}
            )
            verdict.changed_symbols = sorted(
                {*verdict.changed_symbols, *_changed_symbols(report)}
            )
    for verdict in verdicts:
        patch = verdict.patch
        proven = has_proof(patch) or proven_by_recorded_tests(patch)
        if proof_runs_on(verdict.state) and not proven:
            verdict.proof = ProofResult(patch.id, "missing", no_proof_reason(patch))
    return verdicts


def _set_runtime_stages(
    tree: VllmTree,
    series: Sequence[Patch],
    verdicts: list[PatchVerdict],
    pristine: VllmTree | None,
    progress: Progress,
) -> None:
    """The runtime-names stage of each derived patch needed or applied here,
    judged on the release before the fix (``runtime_stage.py``)."""
    derived = [
        v
        for v in verdicts
        if getattr(v.patch, "reads_tree", False) and proof_runs_on(v.state)
    ]
    if not derived:
        return
    base: VllmTree | str
    try:
        base = pristine or pristine_tree(tree, None, progress)
    except DeepstackError as exc:  # not a release: nothing to judge on
        base = "; ".join(filter(None, [exc.located, exc.hint]))
    stages = runtime_stages(base, series, [v.patch for v in derived])
    for verdict in derived:
        verdict.runtime = stages[verdict.patch.id]


def _changed_files(report: Any) -> list[str]:
    """The files where the patch is needed or applied: the ones it changes."""
    return sorted({loc.path for loc in report.locations if proof_runs_on(loc.state)})


def _changed_symbols(report: Any) -> list[tuple[str, str]]:
    """Where the patch is needed or applied, by file and the function or
    method found there (``Sampler.gather_logprobs``)."""
    return sorted(
        {
            (loc.path, loc.finding.symbol)
            for loc in report.locations
            if proof_runs_on(loc.state)
        }
    )


def verify_tree(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    env: ProofEnv,
    targets: Targets,
    *,
    pristine: VllmTree | None = None,
    gpu: bool = False,
    jobs: int = 3,
    test_budget: float = DEFAULT_BUDGET_S,
    progress: Progress = lambda line: None,
) -> VerifyReport:
    """Run every selected check on ``tree`` (and its pristine release);
    ``test_budget``: the seconds each patch's release tests may take on
    each tree (``release_tests.py``; 0: none run)."""
    started = time.monotonic()
    # Every check is forked from one process that imports torch and what the
    # checks import from the environment (forkserver.py), started first so
    # that it does while the trees are planned here.
    learned = learned_preload(env, tree.version)
    with contextlib.ExitStack() as stack:
        forks = stack.enter_context(
            ForkServer(env.python, subprocess_env(tree.root), learned)
        )
        verdicts = _verdicts(tree, series, selected, pristine)
        _set_runtime_stages(tree, series, verdicts, pristine, progress)
        to_prove, before_ids = _proofs_to_run(verdicts)
        sources = patch_sources(series)  # patches from elsewhere: their files
        prove = functools.partial(run_proofs, spawn=forks.run, sources=sources)
        applicable = [v.patch.id for v in verdicts if proof_runs_on(v.state)]
        tests, absent = select_tests(
            tree.root, targets, applicable, "cpu", tree.version
        )

        scratch = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="deepstack-baseline-")
        )
        baselines, before_ids = proven_on_baselines(
            pristine, series, verdicts, Path(scratch), before_ids
        )
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            imports = _import_runs(pool, env, tree, pristine, verdicts, forks.run)
            progress(f"proofs on {tree.root}: {', '.join(to_prove) or 'none'}")
            after = pool.submit(prove, env, tree.root, to_prove)
            before_futures = [
                pool.submit(prove, env, root, ids)
                for root, ids in pristine_runs(
                    pristine, before_ids, baselines, progress
                )
            ]
            recorded = _recorded_runs(
                pool, env, tree, pristine, verdicts, Path(scratch), forks.run, progress
            )
            if tests:
                progress(f"{len(tests)} tree test selection(s) with pytest")
            release = _release_test_runs(
                pool, env, tree, pristine, verdicts, test_budget, forks.run, progress
            )
            test_future = pool.submit(
                run_pytest, env.python, tree.root, tests, absent,
                env=subprocess_env(tree.root), spawn=forks.run,
            )  # fmt: skip
            proofs = _results([after, *recorded[False]])
            proofs_before = _results([*before_futures, *recorded[True]])
            cpu_run = test_future.result()
            _set_import_stages(verdicts, *imports)
            for verdict in verdicts:
                if verdict.patch.id in release:
                    runs = release[verdict.patch.id]
                    verdict.release_tests = collect_release_tests(runs, test_budget)

        for verdict in verdicts:
            verdict.proof = proofs.get(verdict.patch.id, verdict.proof)
            verdict.pristine_proof = proofs_before.get(verdict.patch.id)
            verdict.tests = cpu_run.cases_of(verdict.patch.id)
        extras = extras_rounds(
            env, tree, pristine, verdicts, Path(scratch), test_budget, jobs, progress
        )
        extras = conftest_round(
            env, tree, pristine, verdicts, extras, test_budget, jobs, progress
        )
        confirm_differing(env, tree, pristine, verdicts, extras, test_budget, progress)
    for verdict in verdicts:
        if verdict.proof and verdict.proof.cases:
            # A recorded test written for a later release: not the fix's.
            verdict.proof, verdict.pristine_proof = fit_to_release(
                verdict.patch, verdict.proof, verdict.pristine_proof
            )
        if verdict.release_tests is not None and not verdict.release_tests.not_run:
            verdict.unit_tests = ChangedUnitTests.of(verdict.release_tests)

    stage = gpu_stage(tree, targets, applicable, progress) if gpu else GpuStage(False)
    return VerifyReport(
        tree=tree,
        env=env,
        verdicts=verdicts,
        cpu_tests=cpu_run,
        gpu=stage,
        pristine=pristine,
        seconds=round(time.monotonic() - started, 1),
        extras=extras,
    )


def _recorded_runs(
    pool: ThreadPoolExecutor,
    env: ProofEnv,
    tree: VllmTree,
    pristine: VllmTree | None,
    verdicts: list[PatchVerdict],
    scratch: Path,
    spawn: Any,
    progress: Progress,
) -> dict[bool, list[Future[dict[str, ProofResult]]]]:
    """The recorded tests of the patches proven by them (``recorded_tests.py``)
    on the tree (key False) and on the pristine tree (True), each a future of
    ``{patch id: ProofResult}`` as :func:`run_proofs` gives."""
    runs: dict[bool, list[Future[dict[str, ProofResult]]]] = {False: [], True: []}
    for verdict in verdicts:
        patch = verdict.patch
        for on, is_pristine in recorded_tests_trees(verdict, tree, pristine):
            where = "pristine " if is_pristine else ""
            progress(f"recorded tests of {patch.id} on {where}{on.root}")
            runs[is_pristine].append(
                pool.submit(
                    recorded_proof, env, on.root, patch, scratch,
                    pristine=is_pristine, spawn=spawn,
                )
            )  # fmt: skip
    return runs


def _release_test_runs(
    pool: ThreadPoolExecutor,
    env: ProofEnv,
    tree: VllmTree,
    pristine: VllmTree | None,
    verdicts: list[PatchVerdict],
    budget: float,
    spawn: Any,
    progress: Progress,
) -> dict[str, Pending]:
    """The release's tests of what each patch changes (a built-in one's
    beside its proof), started on both trees (``release_tests.py``): only
    where there is a pristine tree where the patch is needed (where it is
    applied there too, both trees hold the same code), and a budget."""
    from deepstack_patch.proof.impact import units_of
    from deepstack_patch.proof.release_tests import submit_together

    if pristine is None or budget <= 0:
        return {}
    units = {
        verdict.patch.id: units_of(
            verdict.patch, verdict.changed_files, verdict.changed_symbols
        )
        for verdict in verdicts
        if proof_runs_on(verdict.state) and verdict.pristine_state is PatchState.NEEDED
    }
    runs = submit_together(pool, env, tree.root, pristine.root, units, budget, spawn)
    for patch_id, pending in runs.items():
        progress(
            f"release tests of {patch_id}: {len(pending.selection.tests)} selected"
        )
    say_together(runs, progress)
    return runs


def _import_stage_of(verdict: PatchVerdict) -> list[tuple[str, str]]:
    """The modules a patch without a proof of its own changes (its import
    stage, ``imports.py``); none for a patch with one, or not here."""
    if has_proof(verdict.patch) or not proof_runs_on(verdict.state):
        return []
    return changed_modules(verdict.changed_files)


def _import_runs(
    pool: ThreadPoolExecutor,
    env: ProofEnv,
    tree: VllmTree,
    pristine: VllmTree | None,
    verdicts: list[PatchVerdict],
    spawn: Any,
) -> tuple[Future[dict[str, str]] | None, Future[dict[str, str]] | None]:
    """Every changed module imported on the tree, and on the pristine tree:
    one process each, beside the proofs."""
    modules = sorted({m for v in verdicts for m, _ in _import_stage_of(v)})
    if not modules:
        return None, None
    trees = [tree.root, *([pristine.root] if pristine is not None else [])]
    futures = [
        pool.submit(run_imports, env, root, modules, spawn=spawn) for root in trees
    ]
    return futures[0], futures[1] if len(futures) > 1 else None


def _set_import_stages(
    verdicts: list[PatchVerdict],
    after: Future[dict[str, str]] | None,
    before: Future[dict[str, str]] | None,
) -> None:
    """Each patch's import stage, from the runs of :func:`_import_runs`."""
    if after is None:
        return
    on_tree, on_pristine = after.result(), before.result() if before else None
    for verdict in verdicts:
        modules = _import_stage_of(verdict)
        if modules:
            verdict.imports = import_stage(modules, on_tree, on_pristine)


def _results(futures: list[Future[dict[str, ProofResult]]]) -> dict[str, ProofResult]:
    return {i: r for future in futures for i, r in future.result().items()}


def _proofs_to_run(verdicts: list[PatchVerdict]) -> tuple[list[str], list[str]]:
    """The patches whose proof runs on the tree, and on its pristine release."""
    return [
        v.patch.id for v in verdicts if proof_runs_on(v.state) and has_proof(v.patch)
    ], [
        v.patch.id
        for v in verdicts
        if proof_runs_on(v.pristine_state) and has_proof(v.patch)
    ]


def learned_preload(env: ProofEnv, version: str) -> Path | None:
    """Where the fork server keeps what the jobs on this release import
    (``forkserver.py``): one file per interpreter, release and tool version."""
    import hashlib

    from deepstack_patch import __version__
    from deepstack_patch.engine.cache import cache_dir

    key = hashlib.sha256(f"{env.python}\0{version}\0{__version__}".encode())
    try:
        return cache_dir() / "preload" / f"{key.hexdigest()[:16]}.json"
    except DeepstackError:
        return None  # no cache folder: preload torch alone


def verify_installed(
    tree: InstalledTree,
    series: Sequence[Patch],
    selected: set[str],
    targets: Targets,
    gpu: bool = False,
    jobs: int = 2,
    progress: Progress = lambda line: None,
) -> VerifyReport:
    """An installed vLLM: in its own interpreter, with the release's tests."""
    from deepstack_patch.proof.installed_tests import installed_env, prove_installed

    assert tree.installed is not None
    started = time.monotonic()
    env = installed_env(tree.installed)
    progress(f"environment: {env.python} (the interpreter of the installed vLLM)")
    verdicts = _verdicts(tree, series, selected, None)
    for verdict in verdicts:
        verdict.apply_command = (
            f"deepstack-patch apply --installed --python {tree.installed.python}"
        )
        if proof_runs_on(verdict.state) and proven_by_recorded_tests(verdict.patch):
            verdict.proof = ProofResult(
                verdict.patch.id,
                "missing",
                "no proof: recorded tests run in a copy of a source tree, not "
                f"in an installed vLLM: verify --release {tree.version} "
                "--against-pristine runs them",
            )
    provable = [v.patch for v in verdicts if proof_runs_on(v.state)]
    cpu_run, stage = prove_installed(
        tree.installed, env, verdicts, provable, targets,
        gpu=gpu, jobs=jobs, progress=progress,
    )  # fmt: skip
    return VerifyReport(
        tree=tree,
        env=env,
        verdicts=verdicts,
        cpu_tests=cpu_run,
        gpu=stage,
        seconds=round(time.monotonic() - started, 1),
    )

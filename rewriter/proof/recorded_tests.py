"""A patch's recorded tests as its proof (a derived patch's diff's test files).

A patch whose class does not override ``Patch.prove`` and that has
``recorded_tests`` is proven by them. They are written into a hard-link copy
of the tree (the tree itself is never written; a recorded file that replaces
one of the tree's is a new file in the copy, never a write into the shared
one) and run there with pytest in the proof environment, through the same
machinery as the tree's own tests (``tree_tests.py``): on the CPU, without
the tree's conftest.py.

The verdict reads like a proof's:

- on the tree verified: ``passed`` when at least one recorded test passed
  and none failed; ``failed`` when one failed; where none could run there (an
  import fails, every test is skipped: it needs CUDA, a model), ``missing``
  with "no proof: ..." and why, never a pass;
- on the pristine tree (``--against-pristine``): ``failed`` when a test
  failed or could not import what the fix adds (the bug shows), ``passed``
  when they all passed, ``missing`` when none ran.

Fail-to-pass is then the proof's: failing on the pristine tree, passing after
``apply``. Nothing here names a fix.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.engine.tree import link_copy
from deepstack_patch.proof.envs import ProofEnv, subprocess_env
from deepstack_patch.proof.forkserver import Spawn, run_subprocess
from deepstack_patch.proof.proofs import ProofResult, has_proof
from deepstack_patch.proof.tree_tests import TestRun, run_pytest

#: The outcomes a case may have (results.py); "error" is a collection or a
#: fixture error: the test did not run.
_RAN = ("passed", "failed")


def proven_by_recorded_tests(patch: Patch) -> bool:
    """The patch has no ``prove`` of its own, and tests that came with it."""
    return not has_proof(patch) and bool(patch.recorded_tests)


def no_proof_reason(patch: Patch) -> str:
    """Why ``patch`` has no proof, and what gives it one (a ``hint:`` line)."""
    from deepstack_patch.output.upstream import derived_base

    if derived_base(patch):
        why = left_out(patch).removeprefix("; ") or (
            "the diff it was derived from changed no test file"
        )
        return (
            f"no proof: {patch.id} is a derived patch ({patch.origin}) with no "
            f"recorded tests: {why}\n"
            "hint: derive it again from the pull request's whole diff on the "
            "release it was made against, its tests included "
            "(https://github.com/OWNER/REPO/pull/N.diff): verify runs them; or "
            f"verify the others with --skip {patch.id}"
        )
    return (
        f"no proof: {type(patch).__name__} ({patch.origin}) has no prove() "
        "method and no recorded tests" + left_out(patch) + "\n"
        "hint: give the patch a prove(tree) method, or recorded_tests "
        "(docs/adding-a-patch.md)"
    )


def left_out(patch: Patch) -> str:
    """The diff's test files ``derive`` left out of the proof, and why (a
    derived patch's ``skipped_tests``); ``""`` where there are none."""
    skipped = getattr(patch, "skipped_tests", ())
    if not skipped:
        return ""
    return "; left out of the proof: " + "; ".join(
        f"{test.path}: {test.reason}" for test in skipped
    )


def with_recorded_tests(tree: Path, patch: Patch, scratch: Path) -> Path:
    """A hard-link copy of ``tree`` in ``scratch`` with ``patch``'s recorded
    tests written into it (replacing the tree's file of the same path)."""
    copy = link_copy(tree, scratch / f"recorded-{uuid.uuid4().hex[:8]}")
    for test in patch.recorded_tests:
        target = copy / test.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)  # a hard link: never write into it
        target.write_text(test.content, encoding="utf-8")
    return copy


def run_recorded_tests(
    env: ProofEnv,
    tree: Path,
    patch: Patch,
    scratch: Path,
    *,
    pristine: bool = False,
    spawn: Spawn = run_subprocess,
) -> ProofResult:
    """Run ``patch``'s recorded tests on a copy of ``tree`` (see the module
    docstring for the verdicts; ``pristine``: the tree before the fix)."""
    copy = with_recorded_tests(tree, patch, scratch)
    selected = {test.path: [patch.id] for test in patch.recorded_tests}
    run = run_pytest(
        env.python, copy, selected, [], env=subprocess_env(copy), spawn=spawn
    )
    result = verdict(run, patch.id, pristine)
    result.message += left_out(patch)
    result.seconds = run.seconds
    return result


def verdict(run: TestRun, patch_id: str, pristine: bool = False) -> ProofResult:
    """The proof result of one run of a patch's recorded tests."""
    failed = [c for c in run.cases if c.outcome == "failed"]
    broken = [c for c in run.cases if c.outcome == "error"]
    passed = [c for c in run.cases if c.outcome == "passed"]
    skipped = [c for c in run.cases if c.outcome == "skipped"]
    summary = ", ".join(
        f"{len(cases)} {name}"
        for name, cases in (
            ("passed", passed),
            ("failed", failed),
            ("could not run", broken),
            ("skipped", skipped),
        )
        if cases
    )
    details = "\n".join(
        f"{case.nodeid}: {case.outcome}: {last_line(case.message)}"
        for case in [*failed, *broken, *skipped]
    )
    message = f"recorded tests: {summary or 'none ran'}" + (
        f"\n{details}" if details else ""
    )
    if failed or (pristine and broken):
        return ProofResult(patch_id, "failed", message)
    if passed and not broken:
        return ProofResult(patch_id, "passed", message)
    why = (
        "they cannot run in the CPU proof environment"
        if broken or skipped
        else "pytest ran none of them"
    )
    error = f"\n{run.error}" if run.error and not run.cases else ""
    return ProofResult(patch_id, "missing", f"no proof: {why}; {message}{error}")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""

"""A patch's recorded tests as its proof (a derived patch's diff's test files).

A patch whose class does not override ``Patch.prove`` and that has
``recorded_tests`` is proven by them. They are written into a hard-link copy
of the tree (the tree itself is never written; a recorded file that replaces
one of the tree's is a new file in the copy, never a write into the shared
one) and run there with pytest in the proof environment, through the same
machinery as the tree's own tests (``tree_tests.py``): on the CPU, without
the tree's conftest.py.

Only the tests the pull request added or changed run, where the data file
names them (``RecordedTest.names``); a file without names runs whole.

The verdict reads like a proof's:

- on the tree verified: ``passed`` when at least one recorded test passed
  and none failed; ``failed`` when one failed; where none could run there,
  ``could-not-run`` with "could not run here: ..." and why (the proof
  environment has no network, lacks a package or a GPU: ``failures.py``
  tells these from a failure of the code; a test cannot import vLLM's code;
  every test skipped), never a pass and never a failure of the fix;
- on the pristine tree (``--against-pristine``): ``failed`` when a test
  failed or could not import what the fix adds (the bug shows), ``passed``
  when they all passed, ``could-not-run`` when none could run.

A recorded test that fails on an argument, an attribute or a name the
release's own code lacks, which the fix does not change, was written for a
later release: it *does not fit this release* (:func:`fit_to_release`) and
counts on neither tree, as a test that could not run.

Fail-to-pass is then the proof's: failing on the pristine tree, passing after
``apply``. Nothing here names a fix.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.engine.tree import link_copy
from deepstack_patch.proof.envs import ProofEnv, subprocess_env
from deepstack_patch.proof.executed import parts_of, watch_options, watched_lines
from deepstack_patch.proof.failures import (
    environment_cause,
    failure_summary,
    release_lacks,
    same_failure,
)
from deepstack_patch.proof.forkserver import Spawn, run_subprocess
from deepstack_patch.proof.impact import units_of
from deepstack_patch.proof.proofs import COULD_NOT_RUN, ProofResult, has_proof
from deepstack_patch.proof.results import TestCase
from deepstack_patch.proof.tree_tests import TestRun, run_pytest


def proven_by_recorded_tests(patch: Patch) -> bool:
    """The patch has no ``prove`` of its own, and tests that came with it."""
    return not has_proof(patch) and bool(patch.recorded_tests)


def no_proof_reason(patch: Patch) -> str:
    """Why ``patch`` has no proof, and what gives it one (a ``hint:`` line)."""
    from deepstack_patch.output.upstream import derived_base

    if derived_base(patch):
        return _derived_without_tests(patch)
    return (
        f"no proof: {type(patch).__name__} ({patch.origin}) has no prove() "
        "method and no recorded tests" + left_out(patch) + "\n"
        "hint: give the patch a prove(tree) method, or recorded_tests "
        "(docs/adding-a-patch.md)"
    )


def _derived_without_tests(patch: Patch) -> str:
    """A derived patch with no recorded tests: from a pull request's diff
    that left its tests out, deriving again from the whole diff (this
    patch's own address) gives them; from the merged commit, which is the
    whole change, nothing more is upstream's to give."""
    commit = str(getattr(patch, "commit", ""))
    source = f"the merged commit {commit[:12]}" if commit else "the diff"
    why = left_out(patch).removeprefix("; ") or (
        f"{source} it was derived from changed no test file"
    )
    others = f"verify the others with --skip {patch.id}"
    if commit:
        hint = (
            "give it a proof of its own (a patch module with prove(), "
            f"docs/adding-a-patch.md), or {others}"
        )
    else:
        hint = (
            "derive it again from the pull request's whole diff on the "
            f"release it was made against, its tests included "
            f"({_whole_diff(patch.upstream_url)}): verify runs them; or {others}"
        )
    return (
        f"no proof: {patch.id} is a derived patch ({patch.origin}) with no "
        f"recorded tests: {why}\nhint: {hint}"
    )


def _whole_diff(upstream_url: str) -> str:
    """The address of a pull request's whole diff, from the patch's own
    pull request; where it names none, the form such an address takes."""
    match upstream_url.rstrip("/").split("/"):
        case ["https:", "", "github.com", _, _, "pull", number] if number.isdigit():
            return upstream_url.rstrip("/") + ".diff"
    return "https://github.com/OWNER/REPO/pull/N.diff"


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
    # Only the tests the pull request added or changed, where it names them.
    selected = {
        nodeid: [patch.id] for test in patch.recorded_tests for nodeid in test.nodeids
    }
    # On the fixed tree, whether each test ran the fix's code (executed.py).
    watch = {} if pristine else watched_lines(copy, units_of(patch, ()))
    run = run_pytest(
        env.python, copy, selected, [], env=subprocess_env(copy), spawn=spawn,
        options=watch_options(watch, copy),
    )  # fmt: skip
    result = verdict(run, patch.id, pristine)
    result.message += left_out(patch)
    result.seconds = run.seconds
    result.watched = frozenset(parts_of(watch))
    return result


def recorded_proof(*args: Any, **kwargs: Any) -> dict[str, ProofResult]:
    """:func:`run_recorded_tests` as ``proofs.run_proofs`` answers: the
    result by its patch's id."""
    result = run_recorded_tests(*args, **kwargs)
    return {result.patch_id: result}


def verdict(
    run: TestRun,
    patch_id: str,
    pristine: bool = False,
    misfits: Mapping[str, str] | None = None,
) -> ProofResult:
    """The proof result of one run of a patch's recorded tests; ``misfits``:
    the tests that do not fit this release, and why (:func:`misfits_of`)."""
    sorted_cases = sort_cases(run.cases, pristine, misfits or {})
    summary = ", ".join(
        f"{len(cases)} {label}" for label, cases in sorted_cases.items() if cases
    )
    details = "\n".join(
        f"{case.nodeid}: {label}: {failure_summary(case.message)}"
        for label, cases in sorted_cases.items()
        if label != "passed"
        for case in cases
    )
    message = f"recorded tests: {summary or 'none ran'}" + (
        f"\n{details}" if details else ""
    )
    failed = sorted_cases["failed"] + sorted_cases[_FAILED_AT_IMPORT]
    passed, broken = sorted_cases["passed"], sorted_cases[_NOT_IMPORTED]
    if failed:
        return ProofResult(patch_id, "failed", message, cases=run.cases)
    if passed and not broken:
        return ProofResult(patch_id, "passed", message, cases=run.cases)
    error = f"\n{run.error}" if run.error and not run.cases else ""
    why = could_not_run_reason(sorted_cases, misfits or {})
    return ProofResult(
        patch_id,
        COULD_NOT_RUN,
        f"could not run here: {why}; {message}{error}",
        cases=run.cases,
    )


#: A recorded test that fails on something the release's own code lacks and
#: the fix does not change: written for a later release, it shows nothing
#: about the fix on this one, either way.
DOES_NOT_FIT = "does not fit this release"


def misfits_of(
    patch: Patch, after: ProofResult, before: ProofResult | None = None
) -> dict[str, str]:
    """The recorded tests that do not fit this release, each with why: on the
    patched tree (``after``) a test fails on an argument, an attribute or a
    name the release's code lacks (``failures.release_lacks``), and the fix
    does not change it: none of the patch's edits names it (a derived patch),
    or, for a patch that does not say what it changes, the test fails the
    same way on the pristine tree (``before``)."""
    edited = _edited_text(patch)
    on_pristine = {case.nodeid: case for case in before.cases} if before else {}
    found = {}
    for case in after.cases:
        if case.outcome not in ("failed", "error") or environment_cause(case.message):
            continue
        lacks = release_lacks(failure_summary(case.message))
        if lacks is None:
            continue
        kind, name = lacks
        what = f"{kind} ({name!r}) the release's own code lacks"
        other = on_pristine.get(case.nodeid)
        if edited is not None and not re.search(rf"\b{re.escape(name)}\b", edited):
            found[case.nodeid] = f"{what} and the fix does not change"
        elif edited is None and other and same_failure(case.message, other.message):
            found[case.nodeid] = f"{what}, failing the same way before the fix"
    return found


def _edited_text(patch: Patch) -> str | None:
    """Everything a derived patch's edits remove and insert (statements and
    headers); None for a patch that does not say what it changes."""
    units = getattr(patch, "units", None)
    if units is None:
        return None
    return "\n".join(
        text
        for unit in units
        for edit in unit.edits
        for text in (
            edit.removed,
            edit.inserted,
            edit.header_before,
            edit.header_after,
        )
    )


def fit_to_release(
    patch: Patch, after: ProofResult, before: ProofResult | None
) -> tuple[ProofResult, ProofResult | None]:
    """The recorded tests' results on the tree (and the pristine tree)
    judged again without the tests that do not fit this release
    (:func:`misfits_of`): neither a failure of the fix nor the bug shown on
    the pristine tree."""
    misfits = misfits_of(patch, after, before)
    if not misfits:
        return after, before

    def again(result: ProofResult, pristine: bool) -> ProofResult:
        judged = verdict(TestRun([], cases=result.cases), patch.id, pristine, misfits)
        judged.message += left_out(patch)
        judged.seconds = result.seconds
        judged.watched = result.watched
        return judged

    return again(after, False), again(before, True) if before else None


#: On the pristine tree: a test that cannot import the tree's code it tests
#: (what the fix adds is absent), which shows the bug as a failure does.
_FAILED_AT_IMPORT = "failed at import"
#: On the fixed tree: a test that cannot import the tree's code.
_NOT_IMPORTED = "could not import vLLM's code"


def sort_cases(
    cases: list[TestCase], pristine: bool, misfits: Mapping[str, str]
) -> dict[str, list[TestCase]]:
    """The cases by what they say about the fix, in the order they are told."""
    labels = ("passed", "failed", _FAILED_AT_IMPORT, _NOT_IMPORTED)
    found: dict[str, list[TestCase]] = {label: [] for label in labels}
    found["could not run"], found["skipped"], found[DOES_NOT_FIT] = [], [], []
    for case in cases:
        cause = environment_cause(case.message)
        match case.outcome:
            case _ if case.nodeid in misfits:
                found[DOES_NOT_FIT].append(case)
            case "passed" | "skipped":
                found[case.outcome].append(case)
            case "failed" | "error" if cause:
                found["could not run"].append(case)
            case "failed":
                found["failed"].append(case)
            case _:  # "error": the module or a fixture did not load
                found[_FAILED_AT_IMPORT if pristine else _NOT_IMPORTED].append(case)
    return found


def could_not_run_reason(
    sorted_cases: dict[str, list[TestCase]], misfits: Mapping[str, str]
) -> str:
    """Why none of the recorded tests could run here, in a few words."""
    causes = dict.fromkeys(
        environment_cause(case.message) for case in sorted_cases["could not run"]
    )
    for case in sorted_cases[DOES_NOT_FIT]:
        causes[f"{DOES_NOT_FIT} (it uses {misfits[case.nodeid]})"] = None
    if sorted_cases[_NOT_IMPORTED]:
        causes["a test cannot import vLLM's code"] = None
    if sorted_cases["skipped"]:
        causes["skipped in the CPU proof environment"] = None
    return "; ".join(causes) or "pytest ran none of them"

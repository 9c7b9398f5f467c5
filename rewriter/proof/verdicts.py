"""A patch's verdict: its state, its proofs, its tree tests, and what failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.proof.imports import ImportStage
from deepstack_patch.proof.proofs import COULD_NOT_RUN, ProofResult
from deepstack_patch.proof.release_tests import ReleaseTests
from deepstack_patch.proof.results import TestCase
from deepstack_patch.proof.runtime_stage import RuntimeStage


def status_words(status: str) -> str:
    """A proof's status in a sentence: ``could-not-run`` as words."""
    return status.replace("-", " ") if status == COULD_NOT_RUN else status


@dataclass
class PatchVerdict:
    patch: Patch
    state: PatchState
    reason: str
    proof: ProofResult | None = None
    pristine_state: PatchState | None = None
    pristine_proof: ProofResult | None = None
    #: The fixes applied to the pristine tree before ``pristine_proof`` ran
    #: (this patch is their companion); empty: the pristine tree as released.
    pristine_baseline: tuple[str, ...] = ()
    tests: list[TestCase] = field(default_factory=list)
    #: What applies the patch to this tree (an installed vLLM needs --installed).
    apply_command: str = "deepstack-patch apply"
    #: The files the patch changes (needed or applied there), on either tree.
    changed_files: list[str] = field(default_factory=list)
    #: The import stage of a patch without a proof of its own (imports.py).
    imports: ImportStage | None = None
    #: A derived patch's runtime names, judged before the fix (runtime_stage.py).
    runtime: RuntimeStage | None = None
    #: The release's tests of the units it changes, before and after the
    #: fix (release_tests.py); None: not run (a proof of its own, no
    #: pristine tree, or the fix is upstream's already).
    release_tests: ReleaseTests | None = None

    @property
    def fail_to_pass(self) -> str:
        """``proven``, ``fixed-upstream``, ``not-proven``, ``could-not-run``
        (the proof could not run on one of the trees, and did not fail on
        the other: nothing was shown either way) or ``""`` (not asked)."""
        if self.pristine_state is None or self.state is PatchState.NOT_APPLICABLE:
            return ""
        if self.runtime is not None and self.runtime.status == "failed":
            return "not-proven"  # its tests pass on a stub of what it reads
        after = self.proof.status if self.proof else ""
        before = self.pristine_proof.status if self.pristine_proof else ""
        if self.pristine_state is PatchState.APPLIED and (before, after) == (
            "passed",
            "passed",
        ):
            return "fixed-upstream"
        if self.pristine_state is PatchState.NEEDED and (before, after) == (
            "failed",
            "passed",
        ):
            return "proven"
        if after != "failed" and COULD_NOT_RUN in (before, after):
            return COULD_NOT_RUN
        return "not-proven"

    @property
    def problems(self) -> list[str]:
        """Why this patch's checks did not pass; empty when they all did."""
        if self.state is PatchState.NOT_APPLICABLE:
            return []
        found = []
        if self.state is PatchState.DRIFTED:
            found.append(f"drifted: {self.reason}")
        elif self.state is PatchState.NEEDED:
            found.append(f"not applied to this tree: run `{self.apply_command}` first")
        if self.imports is not None and self.imports.problem:
            found.append(self.imports.problem)
        if self.runtime is not None and self.runtime.problem:
            found.append(self.runtime.problem)
        if self.proof is None or self.proof.status != "passed":
            status = self.proof.status if self.proof else "not run"
            found.append(f"proof {status_words(status)}")
        if self.fail_to_pass in ("not-proven", COULD_NOT_RUN):
            before = self.pristine_proof.status if self.pristine_proof else "not run"
            found.append(
                f"fail-to-pass not shown (pristine proof {status_words(before)})"
            )
        if self.release_tests is not None and self.release_tests.problem:
            found.append(self.release_tests.problem)
        bad = [t for t in self.tests if t.outcome in ("failed", "error")]
        if bad:
            found.append(f"{len(bad)} tree test(s) failed")
        return found

    def json(self) -> dict[str, Any]:
        return {
            "id": self.patch.id,
            "title": self.patch.title,
            "state": self.state.value,
            "reason": self.reason,
            "proof": self.proof.json() if self.proof else None,
            "pristine_state": self.pristine_state.value
            if self.pristine_state
            else None,
            "pristine_proof": self.pristine_proof.json()
            if self.pristine_proof
            else None,
            "pristine_baseline": list(self.pristine_baseline),
            "imports": self.imports.json() if self.imports else None,
            "runtime_names": self.runtime.json() if self.runtime else None,
            "release_tests": self.release_tests.json() if self.release_tests else None,
            "fail_to_pass": self.fail_to_pass or None,
            "tree_tests": [t.nodeid for t in self.tests],
            "ok": not self.problems,
            "problems": self.problems,
        }

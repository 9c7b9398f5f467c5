"""A patch's verdict: its state, its proofs, its tree tests, and what failed.

Each patch gets one verdict, in words that say what the evidence is (the
same words in the text, in JSON and in JUnit; :class:`Verdict`):

- ``proven``: the fix's own tests fail on the pristine tree and pass after
  it, and, for recorded tests, a test of every file the fix changes passed;
- ``fixed upstream``: the release already carries the fix, and its tests pass
  on both trees;
- ``passed``: the fix's own tests pass; nothing ran before the fix (no
  ``--against-pristine``);
- ``no regression``: the tree's own tests of the units the fix changes pass
  before and after it (:class:`ChangedUnitTests`), and no test of its own ran;
- ``partly proven``: its tests passed, but some of the files it changes were
  not exercised by one that passed (``exercised.py``), with the counts;
- ``not verified``: nothing of the fix ran (no test, none could run, it is
  not applied, drifted), with why;
- ``failed``: a check failed (a proof, fail-to-pass, an import, a tree test,
  a regression);
- ``not applicable``: the release has no code for the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.proof.exercised import ChangedFile, changed_files_exercised
from deepstack_patch.proof.imports import ImportStage
from deepstack_patch.proof.proofs import COULD_NOT_RUN, ProofResult
from deepstack_patch.proof.recorded_tests import (
    misfits_of,
    proven_by_recorded_tests,
    sort_cases,
)
from deepstack_patch.proof.release_tests import ReleaseTests
from deepstack_patch.proof.results import TestCase
from deepstack_patch.proof.runtime_stage import RuntimeStage

PROVEN = "proven"
FIXED_UPSTREAM = "fixed upstream"
PASSED = "passed"
NO_REGRESSION = "no regression"
PARTLY_PROVEN = "partly proven"
NOT_VERIFIED = "not verified"
FAILED = "failed"
NOT_APPLICABLE = "not applicable"
#: Every word a verdict can say, the ones verify passes with first.
WORDS = (
    PROVEN,
    FIXED_UPSTREAM,
    PASSED,
    NO_REGRESSION,
    NOT_APPLICABLE,
    PARTLY_PROVEN,
    NOT_VERIFIED,
    FAILED,
)
PASSING = WORDS[:5]


def status_words(status: str) -> str:
    """A proof's status in a sentence: ``could-not-run`` as words."""
    return status.replace("-", " ") if status == COULD_NOT_RUN else status


def proof_runs_on(state: PatchState | None) -> bool:
    """Whether a patch in ``state`` on a tree has its proof and tests run
    there: where it is needed (the pristine tree) or applied."""
    return state in (PatchState.NEEDED, PatchState.APPLIED)


def recorded_tests_trees(
    verdict: PatchVerdict, tree: VllmTree, pristine: VllmTree | None
) -> list[tuple[VllmTree, bool]]:
    """The trees a patch proven by its recorded tests has them run on, each
    with whether it is the pristine one: the tree and the pristine tree,
    each where the patch's state there lets it run (:func:`proof_runs_on`);
    none for another patch."""
    if not proven_by_recorded_tests(verdict.patch):
        return []
    trees = [(tree, False)] if proof_runs_on(verdict.state) else []
    if pristine is not None and proof_runs_on(verdict.pristine_state):
        trees.append((pristine, True))
    return trees


@dataclass(frozen=True)
class ChangedUnitTests:
    """The tree's own tests of the units a patch changes, each run on the
    pristine tree and on the patched one: their outcomes, counted. A stage
    that selects and runs them reports here (``PatchVerdict.unit_tests``)."""

    pass_to_pass: int = 0
    fail_to_pass: int = 0
    #: Regressions: a test that passed before the fix and fails after it.
    pass_to_fail: int = 0
    #: Failing before and after alike (for a reason not the fix's, such as
    #: an argument the release's own code lacks): no failure of the fix.
    fail_to_fail: int = 0
    could_not_run: int = 0
    #: Why the ones that could not run could not, each once.
    reasons: tuple[str, ...] = ()
    #: Passed before and after without executing the changed code (the run
    #: watched its lines): no evidence for the fix, either way.
    not_reached: int = 0

    @property
    def words(self) -> str:
        """``12 pass before and after, 1 could not run (no GPU)``."""
        counts = (
            (self.pass_to_pass, "pass before and after"),
            (self.fail_to_pass, "fail before and pass after"),
            (self.pass_to_fail, "pass before and fail after"),
            (self.fail_to_fail, "fail the same way before and after"),
            (self.not_reached, "pass without running the changed code"),
            (self.could_not_run, "could not run"),
        )
        told = ", ".join(f"{n} {what}" for n, what in counts if n)
        if self.could_not_run and self.reasons:
            told += f" ({'; '.join(self.reasons)})"
        return told or "none ran"

    @classmethod
    def of(cls, release: ReleaseTests) -> ChangedUnitTests:
        """The release-tests stage's outcomes, counted (release_tests.py)."""
        return cls(
            pass_to_pass=len(release.pass_to_pass),
            fail_to_pass=len(release.fail_to_pass),
            pass_to_fail=len(release.pass_to_fail),
            fail_to_fail=len(release.fails_on_both),
            could_not_run=len(release.could_not_run),
            reasons=tuple(release.reasons()),
            not_reached=len(release.not_reached),
        )

    def json(self) -> dict[str, Any]:
        return {
            "pass_to_pass": self.pass_to_pass,
            "fail_to_pass": self.fail_to_pass,
            "pass_to_fail": self.pass_to_fail,
            "fail_to_fail": self.fail_to_fail,
            "could_not_run": self.could_not_run,
            "reasons": list(self.reasons),
            "not_reached": self.not_reached,
        }


@dataclass(frozen=True)
class Verdict:
    """One patch's verdict: a word of :data:`WORDS` and why, with the counts
    it rests on."""

    word: str
    why: str = ""
    #: The files the patch changes and what its recorded tests said of each;
    #: empty where it is not judged file by file (a proof of its own).
    files: tuple[ChangedFile, ...] = ()
    #: Its recorded tests on the patched tree, counted by the proof's words.
    recorded_tests: tuple[tuple[str, int], ...] = ()
    unit_tests: ChangedUnitTests | None = None

    @property
    def ok(self) -> bool:
        return self.word in PASSING

    @property
    def partial(self) -> bool:
        """Nothing failed, and some of the fix was not shown."""
        return self.word == PARTLY_PROVEN

    @property
    def text(self) -> str:
        return f"{self.word}: {self.why}" if self.why else self.word

    def json(self) -> dict[str, Any]:
        return {
            "word": self.word,
            "text": self.text,
            "files": [changed.json() for changed in self.files],
            "recorded_tests": dict(self.recorded_tests),
            "changed_unit_tests": self.unit_tests.json() if self.unit_tests else None,
        }


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
    #: The functions and methods it changes there, by file (its findings).
    changed_symbols: list[tuple[str, str]] = field(default_factory=list)
    #: The import stage of a patch without a proof of its own (imports.py).
    imports: ImportStage | None = None
    #: A derived patch's runtime names, judged before the fix (runtime_stage.py).
    runtime: RuntimeStage | None = None
    #: The tree's own tests of the units the patch changes, before and after.
    unit_tests: ChangedUnitTests | None = None
    #: The release's tests of the units it changes, before and after the
    #: fix (release_tests.py); None: not run (a proof of its own, no
    #: pristine tree, or the fix is upstream's already).
    release_tests: ReleaseTests | None = None

    @property
    def changed(self) -> list[ChangedFile]:
        """Each changed file with what the recorded tests said of it, for a
        patch proven by them whose tests ran here; else empty."""
        if not proven_by_recorded_tests(self.patch) or self.proof is None:
            return []
        misfits = misfits_of(self.patch, self.proof, self.pristine_proof)
        return changed_files_exercised(
            self.changed_files,
            self.patch.recorded_tests,
            self.proof.cases,
            misfits,
            self.proof.watched,
        )

    @property
    def unexercised(self) -> list[ChangedFile]:
        """The changed files no recorded test that passed here exercised,
        where the recorded tests passed (else the proof says what is wrong)."""
        if self.proof is None or self.proof.status != "passed":
            return []
        return [changed for changed in self.changed if not changed.exercised]

    @property
    def fail_to_pass(self) -> str:
        """``proven``, ``partly-proven`` (proven where some changed file was
        not exercised), ``fixed-upstream``, ``not-proven``, ``could-not-run``
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
            return "partly-proven" if self.unexercised else "proven"
        if after != "failed" and COULD_NOT_RUN in (before, after):
            return COULD_NOT_RUN
        return "not-proven"

    @property
    def _no_regression(self) -> bool:
        """The tree's tests of the changed units pass before and after, and
        none of them regressed: evidence where no test of its own ran."""
        tests = self.unit_tests
        return tests is not None and tests.pass_to_pass > 0 and not tests.pass_to_fail

    @property
    def _nothing_of_its_own_ran(self) -> bool:
        return self.proof is not None and self.proof.status in (
            "missing",
            COULD_NOT_RUN,
        )

    @property
    def problems(self) -> list[str]:
        """Why this patch's checks did not pass; empty when they all did."""
        return [text for _, text in self._problems()]

    def _problems(self) -> list[tuple[str, str]]:
        """Each problem with its kind: ``state`` (not applied, drifted),
        ``unshown`` (nothing was shown either way), ``partial`` (changed
        files not exercised) or ``failure``."""
        if self.state is PatchState.NOT_APPLICABLE:
            return []
        found = []
        if self.state is PatchState.DRIFTED:
            found.append(("state", f"drifted: {self.reason}"))
        elif self.state is PatchState.NEEDED:
            found.append(
                (
                    "state",
                    f"not applied to this tree: run `{self.apply_command}` first",
                )
            )
        if self.imports is not None and self.imports.problem:
            kind = "failure" if self.imports.status == "failed" else "unshown"
            found.append((kind, self.imports.problem))
        if self.runtime is not None and self.runtime.problem:
            found.append(("failure", self.runtime.problem))
        # A patch whose own tests did not run and whose changed units' tests
        # pass before and after is verified by those: no regression.
        covered = self._nothing_of_its_own_ran and self._no_regression
        if (self.proof is None or self.proof.status != "passed") and not covered:
            status = self.proof.status if self.proof else "not run"
            kind = "unshown" if self._nothing_of_its_own_ran else "failure"
            found.append((kind, f"proof {status_words(status)}"))
        if self.fail_to_pass in ("not-proven", COULD_NOT_RUN) and not covered:
            before = self.pristine_proof.status if self.pristine_proof else "not run"
            shown = (
                self.fail_to_pass == "not-proven" and not self._nothing_of_its_own_ran
            )
            kind = "failure" if shown else "unshown"
            found.append(
                (
                    kind,
                    f"fail-to-pass not shown (pristine proof {status_words(before)})",
                )
            )
        unexercised = self.unexercised
        if unexercised:
            found.append(
                (
                    "partial",
                    f"{len(unexercised)} of {len(self.changed)} changed files not "
                    "exercised by a recorded test that passed: "
                    + "; ".join(changed.words for changed in unexercised),
                )
            )
        if self.release_tests is not None and self.release_tests.problem:
            found.append(("failure", self.release_tests.problem))
        bad = [t for t in self.tests if t.outcome in ("failed", "error")]
        if bad:
            found.append(("failure", f"{len(bad)} tree test(s) failed"))
        regressed = self.release_tests is not None and self.release_tests.problem
        if (
            self.unit_tests is not None
            and self.unit_tests.pass_to_fail
            and not regressed
        ):
            found.append(
                (
                    "failure",
                    f"{self.unit_tests.pass_to_fail} test(s) of the changed units "
                    "pass before the fix and fail after it",
                )
            )
        return found

    @property
    def verdict(self) -> Verdict:
        """The one verdict of this patch (see the module docstring)."""
        problems = self._problems()
        kinds = {kind for kind, _ in problems}
        cases = self.proof.cases if self.proof else []
        misfits = (
            misfits_of(self.patch, self.proof, self.pristine_proof)
            if self.proof
            else {}
        )
        recorded = tuple(
            (label, len(told))
            for label, told in sort_cases(cases, False, misfits).items()
            if told
        )
        files = tuple(self.changed)

        def said(word: str, why: str = "") -> Verdict:
            return Verdict(word, why, files, recorded, self.unit_tests)

        every = "; ".join(text for _, text in problems)
        if self.state is PatchState.NOT_APPLICABLE:
            return said(NOT_APPLICABLE)
        if "state" in kinds:
            return said(NOT_VERIFIED, every)
        if "failure" in kinds:
            return said(FAILED, every)
        if "partial" in kinds:
            exercised = sum(changed.exercised for changed in files)
            counts = ", ".join(f"{n} {label}" for label, n in recorded)
            not_exercised = "; ".join(c.words for c in files if not c.exercised)
            return said(
                PARTLY_PROVEN,
                f"{exercised} of {len(files)} changed files exercised (recorded "
                f"tests: {counts}); not exercised: {not_exercised}",
            )
        if "unshown" in kinds:
            # Why its own tests did not run, in the proof's first line.
            ran = not self._nothing_of_its_own_ran or not self.proof.message
            why = every if ran else self.proof.message.split("\n")[0]
            if self.unit_tests is not None and self.unit_tests.words != "none ran":
                # Why the release's tests are no evidence either.
                why += f"; tests of the changed units: {self.unit_tests.words}"
            return said(NOT_VERIFIED, why)
        if self._nothing_of_its_own_ran and self._no_regression:
            assert self.unit_tests is not None
            return said(
                NO_REGRESSION,
                f"tests of the changed units: {self.unit_tests.words}; "
                "no test of its own ran",
            )
        # The tests of the changed units beside a proof go with the verdict
        # (``unit_tests``) and below the table, never into its word.
        match self.fail_to_pass:
            case "proven":
                return said(PROVEN)
            case "fixed-upstream":
                return said(FIXED_UPSTREAM)
        return said(PASSED, "fail-to-pass not checked (no --against-pristine)")

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
            "verdict": self.verdict.json(),
            "ok": not self.problems,
            "problems": self.problems,
        }

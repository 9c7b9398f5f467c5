"""Derived patches side by side with the hand-written series (issue 26, item 5).

For each of five upstream fixes, the patch ``derive`` makes from upstream's
own change (``tests/support/upstream.py`` builds the diff from the releases
before and after the fix) is run next to the hand-written patch of the
series, on every release in ``targets.toml`` and on the drift corpus
(``tests/test_drift.py``'s drifted copies of the hand-written patch's target
files: reformatted, commented, a local renamed, a vendor's unrelated change).

Each side plans the same input alone: the hand-written patch, or the derived
one, after the series' patches it requires (vllm#43617 requires vllm#40932:
the built-in vllm#40932 comes first on both sides). Each cell is one of

``same``       both write, and every file they write has the same AST; or
               neither writes and both report the same state;
``refused``    the hand-written patch writes and the derived one does not
               (drifted, not-applicable), or neither writes and the derived
               one refuses (drifted) where the hand-written one has nothing
               to do: no harm done, only less done;
``different``  anything else: the derived patch writes code the
               hand-written one does not (other code, other files, or where
               the hand-written one writes nothing), or claims a state the
               hand-written one contradicts without refusing (``applied``
               where the fix is needed). There must be none.

A derived patch must be correct (``same``) on at least 80% of the cells where
the hand-written patch writes. ``python tests/test_derived_vs_series.py``
prints the table.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES, patch_by_id

from tests.support import TARGETS
from tests.support.upstream import FIXES, restricted_tree, upstream_diff
from tests.test_drift import (
    KINDS,
    drift_function,
    functions_at,
    light_copy,
    rename_local,
    renamed_locals,
)

#: The least share of the hand-written patch's rewrites the derived one makes.
CORRECT_SHARE = 0.8
VERDICTS = ("same", "refused", "different")


# -- the derived patch -------------------------------------------------------------


def derive(fix_id: str, release_root: Callable[[str], Path]) -> Patch:
    """The patch ``derive`` makes from upstream's diff on the fix's base."""
    from deepstack_patch.distribution.derive import derive_patch

    fix = FIXES[fix_id]
    return derive_patch(
        upstream_diff(fix_id, release_root),
        base=release_root(fix.before),
        patch_id=fix_id,
    )


def requirements(fix_id: str) -> list[Patch]:
    """The built-in patches the hand-written one requires, in series order."""
    required = set(patch_by_id(fix_id).requires)
    return [patch for patch in SERIES if patch.id in required]


# -- one side, one cell ------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """What one patch does with one input: its state and the files it writes."""

    state: PatchState
    writes: dict[str, bytes]  # relpath -> new content; empty: writes nothing
    reason: str


def side(plan: Plan, patch_id: str) -> Side:
    report = plan.report(patch_id)
    refused = any(r.selected and r.state is PatchState.DRIFTED for r in plan.reports)
    writes = {}
    if report.state is PatchState.NEEDED and not refused:
        writes = {edit.relpath: edit.new for edit in plan.edits}
    return Side(report.state, writes, report.reason)


def hand_side(root: Path, fix_id: str) -> Side:
    selected = {fix_id, *patch_by_id(fix_id).requires}
    return side(plan_tree(VllmTree.open(root), SERIES, selected), fix_id)


def derived_side(root: Path, fix_id: str, derived: Patch) -> Side:
    plan = plan_tree(VllmTree.open(root), [*requirements(fix_id), derived])
    return side(plan, derived.id)


@dataclass(frozen=True)
class Cell:
    fix: str
    corpus: str  # "release" or a drift kind
    release: str
    case: str
    verdict: str
    hand: PatchState
    derived: PatchState
    hand_writes: bool
    detail: str = ""


def same_code(hand: dict[str, bytes], derived: dict[str, bytes]) -> str:
    """Empty if both write the same files with the same AST, else what differs."""
    if set(hand) != set(derived):
        return f"files differ: {sorted(hand)} != {sorted(derived)}"
    for relpath in hand:
        if ast.dump(ast.parse(hand[relpath])) != ast.dump(ast.parse(derived[relpath])):
            return f"{relpath}: the written AST differs"
    return ""


def verdict(hand: Side, derived: Side) -> tuple[str, str]:
    if derived.writes:
        if not hand.writes:
            return "different", f"derived writes where hand-written is {hand.state}"
        differs = same_code(hand.writes, derived.writes)
        return ("different", differs) if differs else ("same", "")
    if hand.writes:
        if derived.state is PatchState.APPLIED:
            return "different", "derived says applied where the fix is needed"
        return "refused", f"derived {derived.state}: {derived.reason}"
    if derived.state is hand.state:
        return "same", ""
    if derived.state is PatchState.DRIFTED:
        return "refused", f"hand-written {hand.state}; derived: {derived.reason}"
    return "different", f"hand-written {hand.state}, derived {derived.state}"


def compare(
    fix_id: str, derived: Patch, root: Path, corpus: str, release: str, case: str
) -> Cell:
    hand = hand_side(root, fix_id)
    other = derived_side(root, fix_id, derived)
    result, detail = verdict(hand, other)
    return Cell(
        fix_id,
        corpus,
        release,
        case,
        result,
        hand.state,
        other.state,
        bool(hand.writes),
        detail,
    )


# -- the corpora -------------------------------------------------------------------


def release_cells(
    fix_id: str, derived: Patch, release_root: Callable[[str], Path]
) -> Iterator[Cell]:
    for release in TARGETS.releases:
        yield compare(fix_id, derived, release_root(release), "release", release, "")


def drift_inputs(
    fix_id: str, pristine: Path
) -> Iterator[tuple[str, str, dict[str, str]]]:
    """``(kind, case, files)``: test_drift's drifted copies of one release."""
    selected = {fix_id, *patch_by_id(fix_id).requires}
    plan = plan_tree(VllmTree.open(pristine), SERIES, selected)
    targets: dict[str, tuple[set[str], set[int]]] = {}
    for loc in plan.report(fix_id).locations:
        if loc.state is PatchState.NEEDED:
            names, lines = targets.setdefault(loc.path, (set(), set()))
            names.update({loc.finding.symbol, *loc.finding.rewrites})
            lines.add(loc.finding.line)
    patched = {e.relpath: e.new.decode() for e in plan.edits}
    original = {rel: (pristine / rel).read_text() for rel in targets}
    for kind in KINDS:
        if kind != "rename":
            drift = drift_function(kind, targets)
            yield kind, kind, {rel: drift(rel, text) for rel, text in original.items()}
            continue
        for rel, (names, lines) in targets.items():
            for qualname, function in functions_at(original[rel], names, lines):
                for old in renamed_locals(function, original[rel], patched[rel]):
                    new = f"{old}_vendor"
                    renamed = rename_local(original[rel], qualname, old, new)
                    if renamed is None or new in original[rel]:
                        continue
                    yield kind, f"{qualname}:{old}", {**original, rel: renamed}


def drift_cells(
    fix_id: str, derived: Patch, release_root: Callable[[str], Path], work: Path
) -> Iterator[Cell]:
    for release, state in TARGETS.patches[fix_id].expected.items():
        if state is not PatchState.NEEDED:
            continue
        pristine = release_root(release)
        for kind, case, files in drift_inputs(fix_id, pristine):
            root = work / f"case{sum(1 for _ in work.iterdir())}"
            light_copy(pristine, root, list(files))
            for rel, text in files.items():
                (root / rel).unlink()
                (root / rel).write_text(text)
            yield compare(fix_id, derived, root, kind, release, case)


def fix_cells(
    fix_id: str, release_root: Callable[[str], Path], work: Path
) -> list[Cell]:
    derived = derive(fix_id, release_root)
    work.mkdir(parents=True, exist_ok=True)
    return [
        *release_cells(fix_id, derived, release_root),
        *drift_cells(fix_id, derived, release_root, work),
    ]


# -- the tests ---------------------------------------------------------------------


@pytest.mark.release
@pytest.mark.parametrize("fix_id", list(FIXES))
def test_upstream_diff_is_the_restricted_change(
    fix_id: str, release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    """``git apply`` takes each diff on its base without fuzz and gives the
    restricted release after the fix (else the comparison derives from a
    diff that is not upstream's change)."""
    import subprocess

    fix = FIXES[fix_id]
    diff = upstream_diff(fix_id, release_tree)
    expected = restricted_tree(fix_id, release_tree)
    base = release_tree(fix.before)
    for rel in expected:
        if (base / rel).exists():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes((base / rel).read_bytes())
    (tmp_path / "fix.diff").write_text(diff)
    subprocess.run(
        ["git", "apply", "--unsafe-paths", "--directory=.", "fix.diff"],
        cwd=tmp_path,
        check=True,
    )
    for rel, text in expected.items():
        assert (tmp_path / rel).read_text() == text, rel
    assert len(expected) == len(fix.files) + len(fix.new_tests)


# -- the table ---------------------------------------------------------------------


def table(release_root: Callable[[str], Path], work: Path) -> Iterator[str]:
    """Rows ``fix corpus same refused different`` and the refusals."""
    for fix_id in FIXES:
        cells = fix_cells(fix_id, release_root, work / fix_id.replace("#", ""))
        for corpus in ("release", *KINDS):
            counts = Counter(c.verdict for c in cells if c.corpus == corpus)
            writes = sum(c.hand_writes for c in cells if c.corpus == corpus)
            yield (
                f"{fix_id:11} {corpus:10} {counts['same']:4} {counts['refused']:7} "
                f"{counts['different']:9} {writes:11}"
            )
        for cell in cells:
            if cell.verdict != "same":
                yield (
                    f"    {cell.verdict}: {cell.corpus} {cell.release} {cell.case} "
                    f"(hand-written {cell.hand}, derived {cell.derived}): "
                    f"{cell.detail}"
                )


if __name__ == "__main__":
    import tempfile

    from deepstack_patch.fetch.releases import fetch_release

    with tempfile.TemporaryDirectory() as scratch:

        def release_root(version: str) -> Path:
            out = Path(scratch) / "releases" / version
            return out if out.is_dir() else fetch_release(version, out).root

        print("fix         corpus     same refused different hand-writes")
        for row in table(release_root, Path(scratch) / "work"):
            print(row, flush=True)

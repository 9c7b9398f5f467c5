"""The trees a patch's pristine proof runs on where the pristine tree alone
cannot show its bug: a companion's (a fix that repairs what another fix
exposes) is proven on the pristine tree with the fixes that name it
applied, as they would ship without it (``verify.py`` runs the proofs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.apply import WRITE, apply_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.tree import VllmTree, link_copy
from deepstack_patch.proof.verdicts import PatchVerdict

Progress = Callable[[str], None]


def proven_on_baselines(
    pristine: VllmTree | None,
    series: Sequence[Patch],
    verdicts: list[PatchVerdict],
    scratch: Path,
    before_ids: list[str],
) -> tuple[list[Baseline], list[str]]:
    """The baselines companions are proven on (see :func:`companion_baselines`),
    each named in its verdicts, and the proofs left for the pristine tree."""
    if pristine is None:
        return [], before_ids
    baselines = companion_baselines(pristine, series, verdicts, scratch, before_ids)
    for baseline in baselines:
        for verdict in verdicts:
            if verdict.patch.id in baseline.proves:
                verdict.pristine_baseline = baseline.applied
    on_baselines = {i for baseline in baselines for i in baseline.proves}
    return baselines, [i for i in before_ids if i not in on_baselines]


def pristine_runs(
    pristine: VllmTree | None,
    before_ids: list[str],
    baselines: list[Baseline],
    progress: Progress,
) -> list[tuple[Path, list[str]]]:
    """The trees the pristine proofs run on, with the proofs of each."""
    if pristine is None:
        return []
    progress(f"proofs on pristine {pristine.root}: {', '.join(before_ids)}")
    runs = [(pristine.root, before_ids)]
    for baseline in baselines:
        progress(
            f"proofs on pristine + {', '.join(baseline.applied)}: "
            f"{', '.join(baseline.proves)}"
        )
        runs.append((baseline.tree.root, list(baseline.proves)))
    return runs


@dataclass(frozen=True)
class Baseline:
    """The tree companions' pristine proofs run on: pristine plus ``applied``."""

    tree: VllmTree
    #: The fixes (and their requirements) applied alone, in series order.
    applied: tuple[str, ...]
    #: The companions proven here.
    proves: list[str]


def companion_baselines(
    pristine: VllmTree,
    series: Sequence[Patch],
    verdicts: Sequence[PatchVerdict],
    scratch: Path,
    provable: Sequence[str],
) -> list[Baseline]:
    """For each companion among ``provable``: the pristine tree (hard-linked
    into ``scratch``) with the selected fixes that name it applied, where they
    are needed, without it.

    A companion's bug is what its fix exposes (vllm#43617 makes buffers built
    on the meta device reach the decoder): on a release where the fix is
    needed, the pristine tree hides it and the proof passes there. Its
    fail-to-pass is judged against what the fix alone would ship instead.
    """
    pristine_states = {v.patch.id: v.pristine_state for v in verdicts}
    by_id = {patch.id: patch for patch in series}
    groups: dict[tuple[str, ...], list[str]] = {}
    for companion_id in provable:
        fixes = [
            patch.id
            for patch in series
            if companion_id in patch.companions
            and pristine_states.get(patch.id) is PatchState.NEEDED
        ]
        if not fixes:
            continue
        needed = set(fixes)
        pending = list(fixes)
        while pending:  # the fixes' own requirements that are needed, too
            for required in by_id[pending.pop()].requires:
                if (
                    required not in needed
                    and pristine_states.get(required) is PatchState.NEEDED
                ):
                    needed.add(required)
                    pending.append(required)
        applied = tuple(patch.id for patch in series if patch.id in needed)
        groups.setdefault(applied, []).append(companion_id)
    baselines = []
    for number, (applied, companions) in enumerate(groups.items()):
        root = link_copy(pristine.root, scratch / f"baseline-{number}")
        tree = VllmTree.open(root)
        # The series holds only these fixes: applying a fix without its
        # companion is refused everywhere else, and rightly so.
        alone = [by_id[patch_id] for patch_id in applied]
        apply_tree(tree, alone, set(applied), WRITE)
        baselines.append(Baseline(tree, applied, companions))
    return baselines

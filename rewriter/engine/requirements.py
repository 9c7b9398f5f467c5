"""Requirements and companions: a selected patch whose requirement or
companion is needed but left out waits for it (the engine's rule, for every
series)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from deepstack_patch.engine.protocol import Finding, Location, PatchReport, PatchState


class Selection(set[str]):
    """The ids a command works on, and the ``--only`` and ``--skip`` that
    chose them: what to change to add one names only the options given."""

    def __init__(
        self, ids: Iterable[str], only: Iterable[str] = (), skip: Iterable[str] = ()
    ) -> None:
        super().__init__(ids)
        self.only = frozenset(only)
        self.skip = frozenset(skip)

    def how_to_add(self, patch_id: str) -> str:
        """The change to the command line that selects ``patch_id`` too."""
        steps = [f"drop --skip {patch_id}"] if patch_id in self.skip else []
        if self.only and patch_id not in self.only:
            steps.append(f"add --only {patch_id}")
        return " and ".join(steps) or f"select {patch_id}"


def how_to_add(selected: set[str], patch_id: str) -> str:
    """:meth:`Selection.how_to_add`, or plain words for a set of ids alone."""
    if isinstance(selected, Selection):
        return selected.how_to_add(patch_id)
    return f"select {patch_id} too"


def block_unmet_requirements(
    reports: dict[str, PatchReport], selected: set[str]
) -> None:
    """A selected patch whose requirement or companion is needed but left out
    waits for it.

    It is reported ``needed`` (the tree lacks its fix) with the reason and
    ``blocked_by``, never drifted: its target only looks unfamiliar because
    the required fix, which it builds on, is not in the code. A companion
    (``Patch.companions``) repairs what the fix breaks on its own: shipping
    the fix without it would leave the tree worse than it was.
    """
    for report in reports.values():
        if not report.selected or report.state not in (
            PatchState.NEEDED,
            PatchState.DRIFTED,
        ):
            continue
        reasons = {
            other_id: reason
            for other_id, reason in [
                *(
                    (r, "requires {id}, which is not selected")
                    for r in report.patch.requires
                ),
                *((c, _WITHOUT_COMPANION) for c in report.patch.companions),
            ]
            if (other := reports.get(other_id))
            and other.state is PatchState.NEEDED
            and not other.selected
        }
        if not reasons:
            continue
        missing = list(reasons)
        reason = ", ".join(
            text.format(id=other_id, symptom=reports[other_id].patch.symptom)
            for other_id, text in reasons.items()
        )
        report.blocked_by = missing
        # What to do comes last, after the only "; " it adds (refuse_blocked).
        report.blocked_reason = f"{reason}; {how_to_add(selected, missing[0])}"
        report.locations = [
            Location(loc.path, _as_blocked(loc.finding, reason))
            if loc.state is PatchState.DRIFTED
            else loc
            for loc in report.locations
        ]


def followers_of(
    reports: Sequence[PatchReport], left_out: Iterable[str]
) -> dict[str, list[str]]:
    """The selected needed patches that cannot go without a patch left out,
    each with the left-out ids it waits for: those that require one, and
    those that name one as companion (a fix never ships without its repair),
    and so on along the chain.

    Only needed ones: an applied patch is in the tree whatever is left out,
    and leaving out one that is not applicable changes nothing.
    """
    out = set(left_out)
    followers: dict[str, list[str]] = {}
    grew = True
    while grew:  # a companion comes after its fix: one pass may miss it
        grew = False
        for report in reports:
            patch = report.patch
            if (
                not report.selected
                or patch.id in out
                or report.state is not PatchState.NEEDED
            ):
                continue
            waits_for = [i for i in (*patch.requires, *patch.companions) if i in out]
            if waits_for:
                followers[patch.id] = waits_for
                out.add(patch.id)
                grew = True
    return followers


#: Why a fix is refused without its companion: what the user would meet.
_WITHOUT_COMPANION = (
    "ships only with its companion {id}, which is needed here and not "
    "selected; without it: {symptom}"
)


def _as_blocked(finding: Finding, reason: str) -> Finding:
    return dataclasses.replace(finding, state=PatchState.NEEDED, reason=reason)

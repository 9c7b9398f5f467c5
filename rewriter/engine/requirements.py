"""Requirements and companions: a selected patch whose requirement or
companion is needed but left out waits for it (the engine's rule, for every
series)."""

from __future__ import annotations

import dataclasses

from deepstack_patch.engine.protocol import Finding, Location, PatchReport, PatchState


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
        report.blocked_reason = (
            f"{reason}; drop --skip {missing[0]} or add --only {missing[0]}"
        )
        report.locations = [
            Location(loc.path, _as_blocked(loc.finding, reason))
            if loc.state is PatchState.DRIFTED
            else loc
            for loc in report.locations
        ]


#: Why a fix is refused without its companion: what the user would meet.
_WITHOUT_COMPANION = (
    "ships only with its companion {id}, which is needed here and not "
    "selected; without it: {symptom}"
)


def _as_blocked(finding: Finding, reason: str) -> Finding:
    return dataclasses.replace(finding, state=PatchState.NEEDED, reason=reason)

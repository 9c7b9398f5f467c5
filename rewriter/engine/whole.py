"""Patches that apply whole or not at all across files (a derived patch)."""

from __future__ import annotations

import dataclasses

from deepstack_patch.engine.protocol import (
    Finding,
    Location,
    Patch,
    PatchReport,
    PatchState,
)

#: What a part already as the fix leaves it says, where the rest of the fix
#: changes code this release never had.
WITH_THE_REST_NEVER_HERE = (
    "already as the fix leaves it; the rest of the fix is not in this release"
)


def refuse_partial_patches(reports: dict[str, PatchReport]) -> None:
    """A patch that applies whole or not at all (``applies_whole``: a patch
    derived from a diff, which cannot know that its parts stand apart) and
    is there (needed, applied or drifted) where some of its targets are
    absent drifts: rewriting the parts that are there would carry half of
    the fix, and calling them applied would claim a fix whose other half is
    gone. Each absent part is shown at its own file.

    A part whose code this release never had (not-applicable at a location:
    ``not in this release``) is no half of a fix: beside parts already as
    the fix leaves them, the whole patch is not applicable (a bug this
    release never had); beside a needed part it drifts, since the fix would
    go in half."""
    for report in reports.values():
        patch = report.patch
        if not getattr(patch, "applies_whole", False) or not report.locations:
            continue
        located = {loc.finding.part for loc in report.locations}
        states = {part: report.part_state(part)[0] for part in located}
        there = {p: s for p, s in states.items() if s is not PatchState.NOT_APPLICABLE}
        if not there:
            continue  # nothing of the fix is in this tree
        never = [p for p, s in states.items() if s is PatchState.NOT_APPLICABLE]
        absent = [part for part in patch.parts if part not in located]
        needed = PatchState.NEEDED in there.values()
        if never and not absent and set(there.values()) == {PatchState.APPLIED}:
            _never_had_the_bug(report)
            continue
        while_there = _while(patch, there)
        report.locations.extend(
            Location(
                patch.part_file(part) or report.locations[0].path,
                Finding(
                    state=PatchState.DRIFTED,
                    symbol=_name(part),
                    line=0,  # the unit is not in its file: no line to show
                    span=(0, 0),
                    reason=f"{patch.parts[part]} is absent while {while_there}: "
                    "it applies whole or not at all",
                    part=part,
                ),
            )
            for part in absent
        )
        if needed:
            report.locations = [
                Location(
                    loc.path,
                    dataclasses.replace(
                        loc.finding,
                        state=PatchState.DRIFTED,
                        reason=f"{loc.finding.reason}, while {while_there}: it "
                        "applies whole or not at all",
                    ),
                )
                if loc.finding.part in never
                else loc
                for loc in report.locations
            ]


def _while(patch: Patch, there: dict[str, PatchState]) -> str:
    """The parts that are there, with their states: ``X is drifted``."""
    shown = [
        f"{_name(patch.part_label(part))} is {state.value}"
        for part, state in there.items()
    ]
    if len(shown) > 3:
        shown = [*shown[:3], f"{len(shown) - 3} more"]
    return ", ".join(shown)


def _name(part: str) -> str:
    """A derived part's name without its file (``path::name``)."""
    return part.partition("::")[2] or part


def _never_had_the_bug(report: PatchReport) -> None:
    """Parts as the fix leaves them, beside code this release never had:
    the patch is not applicable, and each applied part says why."""
    report.locations = [
        Location(
            loc.path,
            dataclasses.replace(
                loc.finding,
                state=PatchState.NOT_APPLICABLE,
                reason=WITH_THE_REST_NEVER_HERE,
                details={},
            ),
        )
        if loc.state is PatchState.APPLIED
        else loc
        for loc in report.locations
    ]

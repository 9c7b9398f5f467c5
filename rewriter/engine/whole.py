"""Patches that apply whole or not at all across files (a derived patch)."""

from __future__ import annotations

from deepstack_patch.engine.protocol import (
    Finding,
    Location,
    PatchReport,
    PatchState,
)


def refuse_partial_patches(reports: dict[str, PatchReport]) -> None:
    """A patch that applies whole or not at all (``applies_whole``: a patch
    derived from a diff, which cannot know that its parts stand apart) and
    is there (needed or applied) where some of its targets are absent
    drifts: rewriting the parts that are there would carry half of the fix,
    and calling them applied would claim a fix whose other half is gone."""
    for report in reports.values():
        patch = report.patch
        if not getattr(patch, "applies_whole", False) or not report.locations:
            continue
        # Any part there, needed or applied, with another absent: half of
        # the fix's code is not the fix (issue 30, item 3).
        needed = any(loc.state is PatchState.NEEDED for loc in report.locations)
        present = {loc.finding.part for loc in report.locations}
        absent = [part for part in patch.parts if part not in present]
        where = report.locations[0]
        report.locations.extend(
            Location(
                where.path,
                Finding(
                    state=PatchState.DRIFTED,
                    symbol=part,
                    line=where.finding.line,
                    span=where.finding.span,
                    reason=f"{patch.parts[part]} is absent while the patch is "
                    f"{'needed' if needed else 'there'} elsewhere: it applies "
                    "whole or not at all",
                    part=part,
                ),
            )
            for part in absent
        )

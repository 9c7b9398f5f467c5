"""Patches that apply whole or not at all across files (a derived patch)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from deepstack_patch.engine.protocol import (
    THERE_ALREADY,
    Finding,
    Location,
    Patch,
    PatchReport,
    PatchState,
)

#: What a part already as the fix leaves it says, where documentation of the
#: fix is left out: never ``applied`` while one of its edits is missing.
WITH_DOCUMENTATION_LEFT_OUT = (
    "already as the fix leaves it, but the documentation the fix edits is left out"
)


#: The states of the parts that are there beside parts whose code this
#: release never had, for the fix to go in where its code is.
_IN_PART = frozenset({PatchState.NEEDED, PatchState.APPLIED})


def refuse_partial_patches(reports: dict[str, PatchReport]) -> None:
    """A patch that applies whole or not at all (``applies_whole``: a patch
    derived from a diff, which cannot know that its parts stand apart) and
    is there (needed, applied or drifted) where some of its targets are
    absent drifts: rewriting the parts that are there would carry half of
    the fix, and calling them applied would claim a fix whose other half is
    gone. Each absent part is shown at its own file.

    A part whose code this release never had (not-applicable at a location:
    ``not in this release``) is no half of a fix: beside parts needed or
    already as the fix leaves them, with no part drifted or absent, the fix
    is whole for this release's code. The patch is needed (it goes in where
    its code is) or applied, and each such part says what this release
    never had, as vLLM's maintainers carry such fixes into patch releases:
    a patch ``apply`` wrote reads ``applied`` the next time."""
    for report in reports.values():
        patch = report.patch
        if not getattr(patch, "applies_whole", False) or not report.locations:
            continue
        documentation = getattr(patch, "documentation_parts", frozenset())
        code = [part for part in patch.parts if part not in documentation]
        located = {loc.finding.part for loc in report.locations}
        # In the patch's order: the words a reason lists them in never
        # depend on how a set of strings hashes in this process.
        states = {part: report.part_state(part)[0] for part in code if part in located}
        there = {p: s for p, s in states.items() if s is not PatchState.NOT_APPLICABLE}
        if code and not there:
            # Nothing of the fix's code is in this tree: its documentation
            # alone is nothing to do.
            _documentation_alone(report, documentation)
            continue
        never = [p for p, s in states.items() if s is PatchState.NOT_APPLICABLE]
        absent = [part for part in code if part not in located]
        needed = PatchState.NEEDED in there.values()
        if (
            never
            and not absent
            and set(there.values()) <= _IN_PART
            and not (needed and _fixed_otherwise(report, never))
        ):
            _beside_code_never_here(report, there, never, documentation, located)
            continue
        _documentation_left_out(report, documentation, located)
        while_there = _while(patch, there)
        report.locations.extend(
            _absent(
                report,
                part,
                PatchState.DRIFTED,
                f"{patch.parts[part]} is absent while {while_there}: "
                "it applies whole or not at all",
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


def _fixed_otherwise(report: PatchReport, never: list[str]) -> bool:
    """Whether a part never here reads already what the fix adds
    (:data:`THERE_ALREADY`): the fix may be in another way there, and the
    rest of it is not written alone."""
    return any(
        loc.finding.details.get(THERE_ALREADY)
        for loc in report.locations
        if loc.finding.part in never
    )


def _beside_code_never_here(
    report: PatchReport,
    there: dict[str, PatchState],
    never: list[str],
    documentation: frozenset[str],
    located: set[str],
) -> None:
    """Parts needed or already in, beside parts whose code this release
    never had: the fix goes in where its code is, or is in there already
    (vllm#41522 on 0.20.0, as the maintainers carried it into 0.20.1);
    unless what is there only binds names for what is not, or is imports
    alone, where nothing of the fix is to do."""
    patch = report.patch
    imports = getattr(patch, "import_parts", frozenset())
    wanted = [
        p for p, s in there.items() if s is PatchState.NEEDED and p not in imports
    ]
    serving = getattr(patch, "serving_only", None)
    names = serving(wanted, never) if wanted and serving else []
    if names:
        _only_serving(report, wanted, never, names)
    if names or not set(there) - imports:
        _imports_alone(report, imports)
        _documentation_alone(report, documentation)
    else:
        _documentation_left_out(report, documentation, located)


def _only_serving(
    report: PatchReport, wanted: list[str], never: list[str], names: list[str]
) -> None:
    """The needed parts only bind ``names`` for parts whose code this
    release never had: not applicable, saying so."""
    patch = report.patch
    shown = ", ".join(f"`{name}`" for name in names)
    served = ", ".join(sorted(_name(patch.part_label(part)) for part in never))
    _not_applicable(
        report,
        lambda loc: loc.finding.part in wanted,
        f"not in this release: it only adds {shown}, which the fix reads in "
        f"{served} alone, whose code this release never had",
    )


def _imports_alone(report: PatchReport, imports: frozenset[str]) -> None:
    """The import parts where nothing of the fix's code is to do: not
    applicable (imports alone never make a patch needed or applied)."""
    _not_applicable(
        report,
        lambda loc: loc.finding.part in imports and loc.state in _IN_PART,
        "the imports of a fix whose code is not in this release",
    )


def _documentation_alone(report: PatchReport, documentation: frozenset[str]) -> None:
    """The documentation parts where the fix's code is not in this tree:
    not applicable (documentation never makes a patch needed or applied)."""
    _not_applicable(
        report,
        lambda loc: (
            loc.finding.part in documentation
            and loc.state in (PatchState.NEEDED, PatchState.APPLIED)
        ),
        "documentation of a fix whose code is not in this release",
    )


def _documentation_left_out(
    report: PatchReport, documentation: frozenset[str], located: set[str]
) -> None:
    """The documentation parts left out (their definition absent, or its
    text neither the old nor the new: not applicable, ``left out: ...``)
    never hold the fix's code back, and are shown: each absent one at its
    file; and the patch is never ``applied`` while one is left out: its
    applied parts are then not applicable, saying what was left out."""
    patch = report.patch
    absent = [part for part in documentation if part not in located]
    report.locations.extend(
        _absent(
            report,
            part,
            PatchState.NOT_APPLICABLE,
            f"left out: {patch.parts[part]} is absent",
        )
        for part in sorted(absent)
    )
    left_out = [
        part
        for part in documentation
        if report.part_state(part)[0] is PatchState.NOT_APPLICABLE
    ]
    if not left_out or report.state is not PatchState.APPLIED:
        return
    named = ", ".join(
        sorted(
            f"{_name(patch.part_label(part))} ({patch.part_file(part)})"
            for part in left_out
        )
    )
    _not_applicable(
        report,
        lambda loc: loc.state is PatchState.APPLIED,
        f"{WITH_DOCUMENTATION_LEFT_OUT}: {named}",
    )


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


def _not_applicable(
    report: PatchReport, which: Callable[[Location], bool], reason: str
) -> None:
    """The report's locations ``which`` accepts, restated as not applicable
    for ``reason``."""
    report.locations = [
        Location(
            loc.path,
            dataclasses.replace(
                loc.finding, state=PatchState.NOT_APPLICABLE, reason=reason, details={}
            ),
        )
        if which(loc)
        else loc
        for loc in report.locations
    ]


def _absent(report: PatchReport, part: str, state: PatchState, reason: str) -> Location:
    """A location for a part of the patch that its file does not hold."""
    return Location(
        report.patch.part_file(part) or report.locations[0].path,
        Finding(
            state=state,
            symbol=_name(part),
            line=0,  # the part is not in its file: no line to show
            span=(0, 0),
            reason=reason,
            part=part,
        ),
    )

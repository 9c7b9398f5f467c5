"""Apply a series to a tree: plan, then write all files or none.

The plumbing under ``deepstack-patch apply`` (without ``--commit``): the
command only chooses the mode and prints the result.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.locks import tree_lock
from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.protocol import Location, Patch, PatchReport, PatchState
from deepstack_patch.engine.recognition_cache import RecognitionCache
from deepstack_patch.engine.requirements import Selection, followers_of
from deepstack_patch.engine.tree import VllmTree

#: What ``apply`` does with the plan.
WRITE, DRY_RUN, CHECK = "write", "dry-run", "check"

EXIT_OK, EXIT_NEEDED, EXIT_ERROR = 0, 1, 2


@dataclass(frozen=True)
class LeftOut:
    """A patch ``apply --skip-drifted`` left out, and why.

    A drifted patch is placed at its first drifted location; a patch left
    out with it (it requires it, or names it as companion) has no location
    of its own to show, and ``waits_for`` names the ones it follows.
    """

    patch_id: str
    state: PatchState
    reason: str
    path: str | None = None
    line: int | None = None
    waits_for: tuple[str, ...] = ()


@dataclass
class ApplyResult:
    plan: Plan
    mode: str
    #: Relative paths written (empty unless the mode writes and nothing drifted).
    written: list[str] = field(default_factory=list)
    #: Ids this run applied, in series order.
    applied_now: list[str] = field(default_factory=list)
    #: Written files with other hard-linked names: how many other names each has.
    hard_links: dict[str, int] = field(default_factory=dict)
    #: A ``--check`` run (``check`` mode, or a dry run with ``--check``):
    #: needed patches make the exit code 1.
    check: bool = False
    #: With ``skip_drifted``: the patches left out, drifted ones first.
    left_out: list[LeftOut] = field(default_factory=list)

    @property
    def drifted(self) -> list[PatchReport]:
        return [
            r for r in self.plan.reports if r.selected and r.state is PatchState.DRIFTED
        ]

    @property
    def exit_code(self) -> int:
        """2 drifted; with ``check``, 1 when patches are needed; else 0."""
        if self.drifted:
            return EXIT_ERROR
        if self.check and self.plan.needed:
            return EXIT_NEEDED
        return EXIT_OK


def apply_tree(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    mode: str = WRITE,
    cache: RecognitionCache | None = None,
    *,
    check: bool = False,
    unchecked_names: bool = False,
    skip_drifted: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ApplyResult:
    """Plan ``series`` on ``tree``; in ``write`` mode write every edit or none.

    A drifted selected patch writes nothing. ``check`` computes states only
    (no rewrites); ``dry-run`` computes the edits without writing them, and
    with ``check=True`` also gives ``check``'s exit code. ``write`` and
    ``dry-run`` refuse a selected patch blocked by one left out, and a
    needed derived patch whose runtime names were not checked unless
    ``unchecked_names``.

    ``skip_drifted`` leaves out each drifted patch and every patch that
    cannot go without it, and works on the rest (``ApplyResult.left_out``).
    ``progress`` is called with each file the plan reads.
    """
    writes = mode == WRITE

    def plan_for(chosen: set[str]) -> Plan:
        return plan_tree(
            tree, series, chosen, rewrite=mode != CHECK, cache=cache, progress=progress
        )

    with tree_lock(tree.root) if writes else contextlib.nullcontext():
        if skip_drifted:
            plan, left_out = plan_leaving_out_drifted(plan_for, selected)
        else:
            plan, left_out = plan_for(selected), []
        result = ApplyResult(plan, mode, check=check or mode == CHECK)
        result.left_out = left_out
        # A dry run refuses what a write refuses: its diff is what would be
        # written, and a write with a blocked patch writes nothing.
        if mode != CHECK and not result.drifted:
            refuse_blocked(plan)
            if not unchecked_names:
                refuse_unchecked(plan)
        if writes and not result.drifted:
            if plan.edits:
                # What a write needs (the transaction, RECORD, bytecode) is
                # imported by a write only: a no-op apply starts faster.
                from deepstack_patch.engine.inplace import write_plan_edits

                # Counted before the write: the new files have one name each.
                edited = [e.relpath for e in plan.edits]
                result.hard_links = hard_linked(tree.root, edited)
                result.written = write_plan_edits(tree, plan)
            result.applied_now = [r.patch.id for r in plan.needed]
            mark_applied(plan, result.applied_now)
    return result


def plan_leaving_out_drifted(
    plan_for: Callable[[set[str]], Plan], selected: set[str]
) -> tuple[Plan, list[LeftOut]]:
    """The plan of ``selected`` less each drifted patch and its followers
    (:func:`followers_of`), and what was left out.

    Planned again while a patch left out had a rewrite in the plan: a later
    patch of the same file saw the code as that rewrite left it. Leaving
    out can make another patch drift (it now sees the code without the
    rewrite it followed): that one is left out in the next round.
    """
    chosen = selected
    left_out: list[LeftOut] = []
    while True:
        plan = plan_for(chosen)
        drifted = [
            r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED
        ]
        if not drifted:
            return plan, left_out
        followers = followers_of(plan.reports, [r.patch.id for r in drifted])
        left_out += [_drifted_left_out(report) for report in drifted]
        left_out += [
            LeftOut(
                patch_id,
                plan.report(patch_id).state,
                _waiting_words(plan.report(patch_id).patch, waits_for),
                waits_for=tuple(waits_for),
            )
            for patch_id, waits_for in followers.items()
        ]
        out = {r.patch.id for r in drifted} | set(followers)
        chosen = _narrowed(chosen, out)
        if not any(out.intersection(edit.patch_ids) for edit in plan.edits):
            # Nothing left out had a rewrite: every other patch saw the code
            # it sees now, and planning again would find the same.
            for report in plan.reports:
                report.selected = report.patch.id in chosen
            return plan, left_out


def _drifted_left_out(report: PatchReport) -> LeftOut:
    """A drifted patch at its first drifted location, with what is wrong there."""
    from deepstack_patch.engine.derived.runtime import RUNTIME

    where = next(
        (loc for loc in report.locations if loc.state is PatchState.DRIFTED), None
    )
    if where is None:  # a part absent while the rest is there
        return LeftOut(report.patch.id, PatchState.DRIFTED, report.reason)
    finding = where.finding
    reason = (
        f"the fix's code cannot run on this release: {finding.details[RUNTIME]}"
        if RUNTIME in finding.details
        else finding.reason or report.reason
    )
    return LeftOut(
        report.patch.id, PatchState.DRIFTED, reason, where.path, finding.line or None
    )


def _waiting_words(patch: Patch, waits_for: Sequence[str]) -> str:
    words = [
        f"requires {other}, which is left out"
        if other in patch.requires
        else f"ships only with its companion {other}, which is left out"
        for other in waits_for
    ]
    return "; ".join(words)


def _narrowed(chosen: set[str], out: set[str]) -> set[str]:
    """``chosen`` without ``out``, keeping the --only/--skip it came from."""
    if isinstance(chosen, Selection):
        return Selection(chosen - out, chosen.only, chosen.skip)
    return chosen - out


def refuse_blocked(plan: Plan) -> None:
    """A selected patch waits for a required patch or a companion that is
    left out: refuse, writing nothing."""
    blocked = [r for r in plan.reports if r.selected and r.blocked_by]
    if blocked:
        first = blocked[0]
        why, _, how = first.blocked_reason.rpartition("; ")
        raise DeepstackError(
            f"{first.patch.id} {why}; nothing was written",
            f"{how}, or leave {first.patch.id} out (--skip {first.patch.id})",
        )


def refuse_unchecked(plan: Plan) -> None:
    """A selected needed patch whose code's runtime names the tree could not
    check (:mod:`.derived.runtime`: this tool's partial extraction without
    the whole ``vllm`` package): refuse, writing nothing."""
    needed = [
        (report, location)
        for report in plan.reports
        if report.selected
        for location in report.locations
        if location.state is PatchState.NEEDED and location.finding.details
    ]
    if not needed:  # nothing to write: the derived engine need not be imported
        return
    from deepstack_patch.engine.derived.runtime import UNCHECKED

    unchecked = [
        (report, location)
        for report, location in needed
        if UNCHECKED in location.finding.details
    ]
    if unchecked:
        report, where = unchecked[0]
        raise DeepstackError(
            f"{report.patch.id} is needed, but what its code reads at run time "
            f"was not checked: {where.finding.details[UNCHECKED]}; nothing "
            "was written",
            "run it on a whole tree (a checkout, an sdist, an installed vLLM, "
            "or --release), or write it unchecked with --unchecked-names, or "
            f"leave it out with --skip {report.patch.id}",
            path=where.path,
            line=where.finding.line,
        )


def mark_applied(plan: Plan, patch_ids: Sequence[str]) -> None:
    """Show the state after a write: what this run applied is now applied,
    at the lines of the written files.

    Every rewrite was recognised as applied before it was written (the
    engine insists), so no second plan is needed to know it; the lines of
    every location in a written file (whatever its patch) are mapped from
    the old file to the new one, as ``status`` then reads them.
    """
    if not patch_ids:
        return
    moved = {edit.relpath: lines_after(edit.old, edit.new) for edit in plan.edits}
    for report in plan.reports:
        applied = report.patch.id in patch_ids
        report.applied_now = report.applied_now or applied
        report.locations = [
            _after_write(loc, applied, moved.get(loc.path)) for loc in report.locations
        ]


def _after_write(
    loc: Location, applied: bool, moved: Callable[[int], int] | None
) -> Location:
    finding = loc.finding
    if applied and finding.state is PatchState.NEEDED:
        finding = dataclasses.replace(finding, state=PatchState.APPLIED, reason="")
    if moved is not None:
        first, last = finding.span
        finding = dataclasses.replace(
            finding, line=moved(finding.line), span=(moved(first), moved(last))
        )
    return loc if finding is loc.finding else Location(loc.path, finding)


def lines_after(old: bytes, new: bytes) -> Callable[[int], int]:
    """Where each 1-based line of ``old`` is in ``new``: a kept line where
    it went; a replaced one the line that took its place (the first
    replacement line for a longer run, the line after a deleted run)."""
    import difflib

    opcodes = difflib.SequenceMatcher(
        a=old.splitlines(), b=new.splitlines(), autojunk=False
    ).get_opcodes()
    starts = [i1 for _tag, i1, _i2, _j1, _j2 in opcodes]

    def moved(line: int) -> int:
        index = bisect.bisect_right(starts, line - 1) - 1
        if index < 0:
            return line
        tag, i1, _i2, j1, j2 = opcodes[index]
        offset = line - 1 - i1
        if tag != "equal":
            offset = min(offset, max(j2 - j1 - 1, 0))
        return j1 + offset + 1

    return moved


def hard_linked(root: Path, relpaths: Sequence[str]) -> dict[str, int]:
    """Each file with other hard-linked names, and how many it has."""
    found = {}
    for relpath in relpaths:
        try:
            links = (root / relpath).stat().st_nlink
        except OSError:
            continue
        if links > 1:
            found[relpath] = links - 1
    return found

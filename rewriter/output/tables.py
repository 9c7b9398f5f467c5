"""What the commands say to people: styled text and tables (rich on a terminal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.output.plain import escape, new_table, one_field
from deepstack_patch.output.upstream import fixed_in_label, upstream_words

if TYPE_CHECKING:
    from deepstack_patch.engine.plan import Plan
    from deepstack_patch.engine.protocol import Patch, PatchReport
    from deepstack_patch.engine.tree import VllmTree
    from rich.console import Console

STATE_STYLE = {
    PatchState.NEEDED: "yellow",
    PatchState.APPLIED: "green",
    PatchState.NOT_APPLICABLE: "dim",
    PatchState.DRIFTED: "bold red",
}


def print_tree_header(console: Console, tree: VllmTree) -> None:
    installed = getattr(tree, "installed", None)  # an InstalledTree's install
    if installed is not None:  # the one line about it (--installed says no other)
        console.print(
            f"vLLM [bold]{tree.version}[/] installed in {tree.root} "
            f"[dim](python {installed.python}; version from "
            f"{tree.version_source})[/]"
        )
        return
    if tree.version_source == "unknown":
        console.print(
            f"vLLM tree at {tree.root} [dim](no version metadata: no PKG-INFO, "
            "vllm/_version.py or git tag)[/]"
        )
        return
    console.print(
        f"vLLM [bold]{tree.version}[/] at {tree.root} "
        f"[dim](version from {tree.version_source})[/]"
    )


def print_plan_table(
    console: Console, plan: Plan, left_out: Sequence[str] = ()
) -> None:
    """A row per selected patch, with its parts and locations; the patches
    ``--only``/``--skip`` left out, in one line under it (``left_out``: the
    ones ``--skip-drifted`` left out, which :func:`print_left_out` lists)."""
    table = new_table(console)
    table.add_column("patch", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("title / where", overflow="fold")
    for report in plan.reports:
        if not report.selected:
            continue
        patch = report.patch
        state = report.state
        label = f"[{STATE_STYLE[state]}]{state.value}[/]"
        note = fixed_in_label(patch)
        if report.applied_now:
            label += " [green](applied now)[/]"
        table.add_row(
            patch.id,
            label,
            escape(patch.title) + (f" [dim]({note})[/]" if note else ""),
        )
        relations = patch_relations(patch, plan.reports)
        if relations and state is not PatchState.NOT_APPLICABLE:
            table.add_row("", "", f"  [dim]{relations}[/]")
        multi_part = len(patch.parts) > 1
        for part in patch.parts:
            part_state, part_reason = report.part_state(part)
            if multi_part:
                table.add_row(
                    "",
                    f"  [{STATE_STYLE[part_state]}]{part_state.value}[/]",
                    f"  part {escape(part_words(patch.part_label(part)))}",
                )
            part_locations = [
                loc for loc in report.locations if loc.finding.part == part
            ]
            for loc in part_locations:
                symbol = escape(one_field(symbol_label(patch, part, loc)))
                # Line 0: the unit is not in its file (an absent part).
                line = f":{loc.finding.line}" if loc.finding.line else ""
                text = f"  {loc.path}{line} {symbol}"
                if loc.state is not part_state:
                    text += f" [{STATE_STYLE[loc.state]}]{loc.state.value}[/]"
                if loc.finding.reason:
                    text += f"\n    [dim]{escape(loc.finding.reason)}[/]"
                table.add_row("", "", text)
            if not part_locations and part_reason:
                table.add_row("", "", f"  [dim]{escape(part_reason)}[/]")
        if report.blocked_reason and not report.applied_now:
            table.add_row("", "", f"  [yellow]{escape(report.blocked_reason)}[/]")
        if state is not PatchState.NOT_APPLICABLE:
            # Its state speaks of what it carries: say what it does not.
            for item in patch.not_carried:
                table.add_row("", "", f"  [dim]not carried: {escape(item)}[/]")
    console.print(table)
    skipped = [
        r.patch.id
        for r in plan.reports
        if not r.selected and r.patch.id not in left_out
    ]
    if skipped:
        console.print(
            f"[dim]skipped (not selected): {', '.join(skipped)}[/]", highlight=False
        )


def print_left_out(console: Console, left_out: Sequence[Any]) -> None:
    """What ``apply --skip-drifted`` left out (``engine.apply.LeftOut``):
    one line each, where and why, under a line that counts them."""
    if not left_out:
        return
    drifted = sum(out.state is PatchState.DRIFTED for out in left_out)
    others = len(left_out) - drifted
    waiting = f", {others} that cannot go without them" if others else ""
    console.print(f"[bold]left out[/], not written: {drifted} drifted{waiting}")
    for out in left_out:
        line = f":{out.line}" if out.line else ""
        where = f" at {out.path}{line}" if out.path else ""
        console.print(
            f"  {out.patch_id} [{STATE_STYLE[out.state]}]{out.state.value}[/]"
            f"{where}: {escape(out.reason)}",
            highlight=False,
        )


def print_state_counts(console: Console, plan: Plan) -> None:
    """One line: how many selected patches are in each state, so a long
    table ends with what it amounts to."""
    from deepstack_patch.output.documents import state_counts

    counts = state_counts(plan.reports)
    selected = sum(counts.values())
    total = len(plan.reports)
    noun = "patch" if total == 1 else "patches"
    head = (
        f"{total} {noun}"
        if selected == total
        else f"{selected} of {total} {noun} selected"
    )
    states = ", ".join(f"{count} {state}" for state, count in counts.items())
    console.print(f"{head}: {states}", highlight=False)


def symbol_label(patch: Patch, part: str, loc: Any) -> str:
    """A location's symbol as the table shows it: the part's label where the
    location is the part's own unit (a derived unit of unnamed statements)."""
    name = part.partition("::")[2]
    if name and loc.finding.symbol == name:
        return patch.part_label(part).partition("::")[2] or name
    return loc.finding.symbol


def part_words(part: str) -> str:
    """A part as the table shows it. A derived patch's part is
    ``path::Class.method``, often wider than a terminal: shown as two
    fields, ``Class.method (path)``, each whole on a line of its own if it
    must (as ``derive`` lists its units)."""
    path, separator, name = part.partition("::")
    return f"{name} ({path})" if separator and name else part


def patch_relations(patch: Patch, reports: Sequence[PatchReport]) -> str:
    """What a patch travels with: the patches it requires, its companions
    (later upstream repairs it is never applied without), and the fixes it is
    the companion of; "" when none."""
    accompanied = [r.patch.id for r in reports if patch.id in r.patch.companions]
    relations = [
        f"{label} {', '.join(ids)}"
        for label, ids in (
            ("requires", patch.requires),
            ("companions:", patch.companions),
            ("companion of", accompanied),
        )
        if ids
    ]
    return "; ".join(relations)


def print_series(console: Console, series: Sequence[Patch]) -> None:
    """``list``: each patch's metadata, in series order."""
    for patch in series:
        console.print(f"[bold]{patch.id}[/]  {escape(patch.title)}")
        console.print(f"  upstream: {escape(upstream_words(patch))}")
        # Escaped: prose quotes code such as `self._ds_buffers[lvl][:n]`.
        if patch.symptom:
            console.print(f"  symptom:  {escape(patch.symptom)}")
        console.print(f"  changes:  {escape(patch.also_changes)}")
        for item in patch.not_carried:
            console.print(f"  not carried: {escape(item)}")
        if patch.requires:
            console.print(f"  requires: {', '.join(patch.requires)}")
        if patch.companions:
            console.print(
                f"  companions: {', '.join(patch.companions)} (later upstream "
                "repairs of this fix; it is never applied without them)"
            )
        accompanied = [p.id for p in series if patch.id in p.companions]
        if accompanied:
            console.print(f"  companion of: {', '.join(accompanied)}")
        if patch.supersedes:
            console.print(f"  supersedes: {', '.join(patch.supersedes)}")
        console.print(f"  where:    {', '.join(patch.paths)}")
        console.print(f"  from:     {escape(patch.origin)}")
        for follow_up in patch.follow_ups:
            console.print(
                f"  follow-up: [bold]{follow_up.reference}[/] ({follow_up.status} "
                f"when recorded on {follow_up.recorded})",
                highlight=False,
            )
            console.print(f"    {escape(follow_up.headline)}", highlight=False)
            console.print(f"    {escape(follow_up.summary)}", highlight=False)
            if follow_up.url:
                console.print(f"    [dim]{follow_up.url}[/]", highlight=False)


def print_open_follow_ups(
    console: Console, reports: Sequence[PatchReport], verbose: bool = False
) -> None:
    """The follow-ups of each selected patch that matters to the tree (needed,
    applied or drifted): what upstream reported about the fix and has not
    repaired in a change this series carries. Information only: it never
    changes a state or an exit code.

    Each is shown whole where a person decides: for a patch this run applied
    (``applied_now``), and for all of them with ``verbose`` (``status
    --verbose``). The others are one line: how many, and how to read them.
    """
    matter = [
        report
        for report in reports
        if report.selected
        and report.state is not PatchState.NOT_APPLICABLE
        and report.patch.follow_ups
    ]
    shown = [r for r in matter if verbose or r.applied_now]
    for report in shown:
        print_follow_ups(console, report.patch, indent=f"{report.patch.id}  ")
    rest = sum(len(r.patch.follow_ups) for r in matter if r not in shown)
    if rest:
        console.print(follow_ups_notice(rest, others=bool(shown)), highlight=False)


def follow_ups_notice(count: int, others: bool = False) -> str:
    """The one line that stands for ``count`` follow-ups not shown."""
    noun = "follow-up" if count == 1 else "follow-ups"
    more = "more " if others else ""
    it = "it" if count == 1 else "them"
    return (
        f"{count} {more}upstream {noun}: `deepstack-patch status --verbose` "
        f"or `list` shows {it}"
    )


def print_follow_ups(console: Console, patch: Patch, indent: str = "  ") -> None:
    """Each follow-up: reference and status when recorded, then its headline
    (written to fit a line, never cut) and its address, each on a line."""
    for follow_up in patch.follow_ups:
        console.print(
            f"{indent}follow-up: [bold]{follow_up.reference}[/] "
            f"({follow_up.status} when recorded on {follow_up.recorded})",
            highlight=False,
        )
        console.print(f"  {escape(follow_up.headline)}", highlight=False)
        if follow_up.url:
            console.print(f"  [dim]{follow_up.url}[/]", highlight=False)


def print_verify_report(console: Console, report: Any) -> None:
    """``verify``: a table of verdicts, then what failed and why."""
    print_tree_header(console, report.tree)
    if report.pristine is not None:
        console.print(f"pristine: {report.pristine.root}")
    table = new_table(console, boxed=True)
    table.add_column("patch")
    table.add_column("state")
    imports = any(v.imports is not None for v in report.verdicts)
    if imports:  # a patch without a proof of its own: its modules imported
        table.add_column("imports")
    table.add_column("proof")
    if report.pristine is not None:
        table.add_column("pristine")
        table.add_column("fail-to-pass")
    table.add_column("tree tests")
    table.add_column("verdict")
    for verdict in report.verdicts:
        proof = verdict.proof.status if verdict.proof else "-"
        passed = sum(t.outcome == "passed" for t in verdict.tests)
        skipped = sum(t.outcome == "skipped" for t in verdict.tests)
        tests = f"{passed}/{len(verdict.tests)} passed" if verdict.tests else "-"
        if skipped:
            tests += f", {skipped} skipped"
        cells = [verdict.patch.id, verdict.state.value]
        if imports:
            stage = verdict.imports
            cells.append(_style(stage.status) if stage else "-")
        cells.append(_style(proof))
        if report.pristine is not None:
            before = verdict.pristine_proof.status if verdict.pristine_proof else "-"
            cells += [_style(before, failed_ok=True), verdict.fail_to_pass or "-"]
        said = verdict.verdict  # the words of JSON's and JUnit's verdict
        colour = "green" if said.ok else "red"
        if verdict.state.value == "not-applicable":
            colour = "dim"
        verdict_cell = f"[{colour}]{escape(said.text)}[/]"
        table.add_row(*cells, tests, verdict_cell)
    console.print(table)
    _print_verify_messages(console, report)


def _print_release_tests(console: Console, patch_id: str, stage: Any) -> None:
    """A patch's release tests: the counts, each regression, the reasons."""
    console.print(
        f"[bold]{patch_id} release tests:[/] {escape(stage.summary)}"
        + (f" ({stage.seconds} s)" if not stage.not_run else ""),
        highlight=False,
    )
    for outcome in stage.pass_to_fail:
        console.print(
            f"  [red]pass-to-fail[/] {escape(outcome.nodeid)}: "
            + escape(outcome.reason),
            highlight=False,
        )
    for reason, count in stage.reasons().items():
        console.print(f"  {count} × {escape(reason)}", highlight=False)
    if stage.selection.through and not stage.not_run:
        console.print(
            "  reached through: " + escape(", ".join(stage.selection.through)),
            highlight=False,
        )
    if stage.selection.unreached and not stage.not_run:
        console.print(
            "  no test reaches: " + escape(", ".join(stage.selection.unreached)),
            highlight=False,
        )


def _print_verify_messages(console: Console, report: Any) -> None:
    """Below verify's table: baselines, failing stages and proofs, tree tests."""
    for verdict in report.verdicts:
        if verdict.pristine_baseline:
            console.print(
                f"{verdict.patch.id} pristine proof ran on pristine + "
                f"{', '.join(verdict.pristine_baseline)} (the fix that names it "
                "as companion, applied alone: what that fix would ship without it)",
                highlight=False,
            )
    for verdict in report.verdicts:
        stage = verdict.imports
        if stage is not None and stage.status != "passed":
            console.print(
                f"[bold]{verdict.patch.id} imports:[/] {stage.status}: "
                f"{escape(stage.message)}",
                highlight=False,
            )
        for label, proof in (
            ("proof", verdict.proof),
            ("pristine", verdict.pristine_proof),
        ):
            if proof and proof.status != "passed" and proof.message:
                console.print(
                    f"[bold]{verdict.patch.id} {label}:[/] {escape(proof.message)}"
                )
    for verdict in report.verdicts:
        if verdict.release_tests is not None:
            _print_release_tests(console, verdict.patch.id, verdict.release_tests)
    run = report.cpu_tests
    if run.selected or run.absent:
        console.print(
            f"tree tests: {len(run.cases)} run, {run.count('passed')} passed, "
            f"{run.count('failed')} failed, {run.count('error')} errors, "
            f"{run.count('skipped')} skipped ({run.seconds} s)"
        )
        for nodeid in run.absent:
            console.print(f"  not run: {escape(nodeid)}")
        for case in run.cases:
            if case.outcome in ("failed", "error"):
                console.print(
                    f"  [red]{case.outcome}[/] {escape(case.nodeid)}: "
                    f"{escape(case.message)}"
                )
        if run.error:
            console.print(f"[red]pytest:[/] {escape(run.error)}")
    if report.gpu.requested:
        gpu_run = report.gpu.run
        if report.gpu.status == "ran" and gpu_run is not None:
            console.print(
                f"GPU tests ({report.gpu.reason}): {len(gpu_run.cases)} run, "
                f"{gpu_run.count('passed')} passed, {gpu_run.count('skipped')} skipped"
            )
        else:
            console.print(f"[yellow]GPU tests skipped:[/] {escape(report.gpu.reason)}")
    verdict_text = "[green]verified[/]" if report.ok else "[red]not verified[/]"
    console.print(f"{verdict_text} in {report.seconds} s")


def _style(status: str, failed_ok: bool = False) -> str:
    if status == "passed":
        return f"[green]{status}[/]"
    if status == "failed" and failed_ok:
        return f"[yellow]{status}[/]"
    return status if status == "-" else f"[red]{status}[/]"


def _matrix_verdict(
    console: Console,
    results: list[Any],
    diffs: list[Any],
    patch_ids: list[str],
    targets: Any,
    uncompared: Sequence[str],
    errors: bool,
) -> str:
    """What was not compared, each in a line; then the verdict's words, which
    claim no more than was compared."""
    unlisted = [r.version for r in results if r.version not in targets.releases]
    if unlisted:
        console.print(
            f"no expectations for {', '.join(unlisted)}: targets.toml does not list "
            "it, so only the states are shown"
        )
    if uncompared:
        it, its = ("it", "its") if len(uncompared) == 1 else ("them", "their")
        console.print(
            f"no expectation for {', '.join(uncompared)}: the targets file has "
            f"no row for {it}, so {its} states are shown, not compared",
            highlight=False,
        )
    compared = len([i for i in patch_ids if i not in uncompared])
    verdict = "NOT as expected" if diffs or errors else "all as expected"
    if (len(unlisted) == len(results) or not compared) and not errors:
        return "nothing to compare"
    if uncompared:
        verdict += f" ({compared} compared; no expectation for {len(uncompared)})"
    return verdict


def print_matrix(
    console: Console,
    results: list[Any],
    diffs: list[Any],
    patch_ids: list[str],
    verify: bool,
    wall: float,
    jobs: int,
    targets: Any,
    uncompared: Sequence[str] = (),
) -> None:
    """``matrix``: a release x patch table; cells that differ show both states.

    ``uncompared``: patches with no expectation in ``targets`` (shown, never
    compared); the verdict says so rather than "all as expected"."""
    wrong = {(d.version, d.patch_id): d.expected for d in diffs}
    table = new_table(console)
    table.add_column("release", no_wrap=True)
    for patch_id in patch_ids:
        table.add_column(patch_id, no_wrap=True)
    if verify:
        table.add_column("verify", no_wrap=True)
    for result in results:
        if result.error:
            # The message follows the table: in a cell it would widen a column.
            row = ["[bold red]error[/] (below)"]
            row += [""] * (len(patch_ids) - 1 + verify)
            table.add_row(result.version, *row)
            continue
        cells = []
        for patch_id in patch_ids:
            state = result.states.get(patch_id, "")
            style = STATE_STYLE.get(PatchState(state), "") if state else ""
            cell = f"[{style}]{state}[/]" if style else state
            if (result.version, patch_id) in wrong:
                cell = f"[bold red]{state} ≠ {wrong[result.version, patch_id]}[/]"
            cells.append(cell)
        if verify:
            cells.append(
                "[green]passed[/]"
                if result.verify_code == 0
                else "skipped (drifted)"
                if result.verify_code is None
                else f"[red]failed ({result.verify_code})[/]"
            )
        table.add_row(result.version, *cells)
    console.print(table)
    errors = [r for r in results if r.error]
    for result in errors:
        console.print(f"[bold red]error:[/] {result.version}: {escape(result.error)}")
    for result in results:
        if result.verify_code:
            console.print(f"[red]verify failed on {result.version}:[/]")
            console.print(result.verify_output, markup=False)
    if diffs:
        console.print(
            f"[bold red]{len(diffs)} state(s) differ from the targets[/] "
            "(shown as found ≠ expected)"
        )
    verdict = _matrix_verdict(
        console, results, diffs, patch_ids, targets, uncompared, bool(errors)
    )
    console.print(
        f"{len(results)} release(s) x {len(patch_ids)} patch(es) in {wall:.1f} s "
        f"with {jobs} process(es); {verdict}"
    )


def human_bytes(count: int) -> str:
    """``188.4 MB``: decimal units, as ``du --si`` gives them."""
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"  # pragma: no cover - the loop returns at GB


def print_cache(console: Console, report: Any) -> None:
    """``cache``: each kind's size and entries, what clearing it costs, then
    what this run cleared (``report`` is a ``fetch.cache_kinds.CacheReport``)."""
    console.print(f"cache: {report.path} ({human_bytes(report.bytes)})")
    old = report.older_than_days
    table = new_table(console)
    for header in ("kind", "size", "entries"):
        table.add_column(header, no_wrap=True)
    if old is not None:
        table.add_column(f"older than {old:g} d", no_wrap=True)
    table.add_column("holds; if cleared")
    for kind in report.kinds:
        cells = [kind.name, human_bytes(kind.bytes), str(kind.entries)]
        if old is not None:
            cells.append(f"{human_bytes(kind.old_bytes)} ({kind.old_entries})")
        cells.append(escape(f"{kind.holds}; {kind.cost}"))
        table.add_row(*cells)
    console.print(table)
    for kind in report.kinds:
        if kind.name in report.clearing:
            console.print(
                f"cleared {kind.name}: {len(kind.cleared)} entries, "
                f"{human_bytes(kind.freed_bytes)} freed"
            )
        if kind.in_use:
            console.print(
                f"[yellow]left {len(kind.in_use)} {kind.name} entries another run "
                f"holds:[/] {escape(', '.join(kind.in_use))}"
            )
    if not report.clearing:
        console.print(
            "[dim]everything here is made again when needed: "
            "`deepstack-patch cache --clear KIND [--older-than DAYS]`[/]"
        )

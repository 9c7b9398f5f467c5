"""What the commands say: text for people, JSON for pipelines, unified diffs.

The JSON document is a contract (documented in README.md); add fields, never
rename or remove them without bumping ``SCHEMA_VERSION``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.plan import FileEdit, Plan
from deepstack_patch.engine.protocol import Patch, PatchReport, PatchState
from deepstack_patch.engine.tree import VllmTree

if TYPE_CHECKING:  # rich is imported by the text output only, not for JSON.
    from rich.console import Console

SCHEMA_VERSION = 1

STATE_STYLE = {
    PatchState.NEEDED: "yellow",
    PatchState.APPLIED: "green",
    PatchState.NOT_APPLICABLE: "dim",
    PatchState.DRIFTED: "bold red",
}


def unified_diff(edits: Sequence[FileEdit]) -> str:
    """A ``git apply`` / ``patch -p1`` compatible diff of the edits."""
    chunks = []
    for edit in edits:
        old = edit.old.decode("utf-8", "surrogateescape").splitlines(keepends=True)
        new = edit.new.decode("utf-8", "surrogateescape").splitlines(keepends=True)
        lines = difflib.unified_diff(old, new, f"a/{edit.relpath}", f"b/{edit.relpath}")
        chunks.append(f"diff --git a/{edit.relpath} b/{edit.relpath}\n")
        for line in lines:
            chunks.append(
                line
                if line.endswith("\n")
                else line + "\n\\ No newline at end of file\n"
            )
    return "".join(chunks)


def tree_json(tree: VllmTree) -> dict[str, Any]:
    return {
        "path": str(tree.root),
        "version": tree.version,
        "version_source": tree.version_source,
    }


def patch_json(report: PatchReport) -> dict[str, Any]:
    patch = report.patch
    return {
        "id": patch.id,
        "title": patch.title,
        "upstream_url": patch.upstream_url,
        "fixed_in": patch.fixed_in,
        "selected": report.selected,
        "state": report.state.value,
        "reason": report.reason,
        "parts": [
            {"name": part, "state": state.value, "reason": reason}
            for part in patch.parts
            for state, reason in [report.part_state(part)]
        ],
        "files": report.files,
        "locations": [
            {
                "path": loc.path,
                "line": loc.finding.line,
                "symbol": loc.finding.symbol,
                "part": loc.finding.part,
                "state": loc.state.value,
                "reason": loc.finding.reason,
            }
            for loc in report.locations
        ],
    }


def plan_json(plan: Plan, command: str, **extra: Any) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "command": command,
        "tree": tree_json(plan.tree),
        "patches": [patch_json(r) for r in plan.reports],
        **extra,
    }


def dump_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=False)


def metadata_json(patch: Patch) -> dict[str, Any]:
    return {
        "id": patch.id,
        "title": patch.title,
        "upstream_url": patch.upstream_url,
        "fixed_in": patch.fixed_in,
        "symptom": patch.symptom,
        "also_changes": patch.also_changes,
        "requires": list(patch.requires),
        "supersedes": list(patch.supersedes),
        "parts": {name or "": what for name, what in patch.parts.items()},
        "paths": list(patch.paths),
    }


def print_tree_header(console: Console, tree: VllmTree) -> None:
    console.print(
        f"vLLM [bold]{tree.version}[/] at {tree.root} "
        f"[dim](version from {tree.version_source})[/]"
    )


def print_plan_table(console: Console, plan: Plan) -> None:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("patch", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("title / where", overflow="fold")
    for report in plan.reports:
        patch = report.patch
        state = report.state
        label = f"[{STATE_STYLE[state]}]{state.value}[/]"
        if not report.selected:
            label += " [dim](skipped)[/]"
        table.add_row(
            patch.id, label, f"{patch.title} [dim](fixed in {patch.fixed_in})[/]"
        )
        multi_part = len(patch.parts) > 1
        for part in patch.parts:
            part_state, part_reason = report.part_state(part)
            if multi_part:
                table.add_row(
                    "",
                    f"  [{STATE_STYLE[part_state]}]{part_state.value}[/]",
                    f"  part {part}",
                )
            part_locations = [
                loc for loc in report.locations if loc.finding.part == part
            ]
            for loc in part_locations:
                text = f"  {loc.path}:{loc.finding.line} {loc.finding.symbol}"
                if loc.state is not part_state:
                    text += f" [{STATE_STYLE[loc.state]}]{loc.state.value}[/]"
                if loc.finding.reason:
                    text += f"\n    [dim]{loc.finding.reason}[/]"
                table.add_row("", "", text)
            if not part_locations and part_reason:
                table.add_row("", "", f"  [dim]{part_reason}[/]")
        if report.blocked_reason:
            table.add_row("", "", f"  [red]{report.blocked_reason}[/]")
    console.print(table)

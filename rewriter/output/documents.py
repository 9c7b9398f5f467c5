"""The JSON documents commands print with ``--format json`` (schema 1).

The documents are a contract (documented in docs/output.md); add fields, never
rename or remove them without bumping ``SCHEMA_VERSION``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: `list` imports this module, and no more
    from deepstack_patch.engine.plan import Plan
    from deepstack_patch.engine.protocol import Patch, PatchReport
    from deepstack_patch.engine.tree import VllmTree

SCHEMA_VERSION = 1


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
        "origin": patch.origin,
        "selected": report.selected,
        "state": report.state.value,
        "reason": report.reason,
        "blocked_by": list(report.blocked_by),
        "companions": list(patch.companions),
        "applied_now": report.applied_now,
        "parts": [
            {"name": part, "state": state.value, "reason": reason}
            for part in patch.parts
            for state, reason in [report.part_state(part)]
        ],
        "files": report.files,
        "follow_ups": follow_ups_json(patch),
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
        "origin": patch.origin,
        "symptom": patch.symptom,
        "also_changes": patch.also_changes,
        "requires": list(patch.requires),
        "companions": list(patch.companions),
        "supersedes": list(patch.supersedes),
        "parts": {name or "": what for name, what in patch.parts.items()},
        "paths": list(patch.paths),
        "follow_ups": follow_ups_json(patch),
    }


def follow_ups_json(patch: Patch) -> list[dict[str, str]]:
    """What upstream said about the fix since it shipped (``Patch.follow_ups``)."""
    return [
        {
            "reference": follow_up.reference,
            "status": follow_up.status,
            "recorded": follow_up.recorded,
            "summary": follow_up.summary,
            "url": follow_up.url,
        }
        for follow_up in patch.follow_ups
    ]


def list_json(series: Sequence[Patch]) -> dict[str, Any]:
    """``list --format json``: the series in order, with metadata."""
    return {
        "schema": SCHEMA_VERSION,
        "command": "list",
        "patches": [metadata_json(p) for p in series],
    }


def verify_json(report: Any) -> dict[str, Any]:
    """``verify --format json`` of a ``proof.verify.VerifyReport``."""
    return {
        "schema": SCHEMA_VERSION,
        "command": "verify",
        "tree": tree_json(report.tree),
        "pristine": tree_json(report.pristine) if report.pristine else None,
        "environment": {
            "python": str(report.env.python),
            "managed": report.env.managed,
            "path": str(report.env.root) if report.env.root else None,
            "key": report.env.key or None,
        },
        "patches": [v.json() for v in report.verdicts],
        "tree_tests": report.cpu_tests.json(),
        "gpu": report.gpu.json(),
        "seconds": report.seconds,
        "ok": report.ok,
    }


def watch_json(result: Any) -> dict[str, Any]:
    """``watch --format json`` of a ``distribution.watch.WatchResult``."""
    return {"schema": SCHEMA_VERSION, "command": "watch", **result.json()}


def footprint_json(tree: VllmTree, found: Sequence[Any]) -> dict[str, Any]:
    """``list --footprint --format json``: engine.footprint.PatchFootprint list."""
    return {
        "schema": SCHEMA_VERSION,
        "command": "list",
        "tree": tree_json(tree),
        "footprints": [
            {
                "id": item.patch_id,
                "functions": [
                    {"path": f.path, "line": f.line, "symbol": f.symbol, "why": f.why}
                    for f in item.functions
                ],
            }
            for item in found
        ],
    }

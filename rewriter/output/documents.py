"""The JSON documents commands print with ``--format json`` (schema 1).

The documents are a contract (documented in docs/output.md, with a JSON Schema
per command in docs/schemas/); add fields, never rename or remove them without
bumping ``SCHEMA_VERSION``. Two shapes are shared by every command: a tree
(``tree_json``) and a patch's state (``patch_state_json``, which every patch
object of every document starts with; ``patch_json`` for a planned tree).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deepstack_patch.output.upstream import derived_base, upstream_commit

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


def patch_state_json(patch: Patch, state: str, reason: str) -> dict[str, Any]:
    """What every document says of a patch's state, in this shape: ``state``
    one of needed, applied, not-applicable, drifted; ``reason`` why (or "")."""
    return {"id": patch.id, "title": patch.title, "state": state, "reason": reason}


def patch_json(report: PatchReport) -> dict[str, Any]:
    """A patch's state in a planned tree (status, apply, export, backport,
    doctor): ``patch_state_json`` and where, which parts, what follows."""
    patch = report.patch
    return {
        **patch_state_json(patch, report.state.value, report.reason),
        "upstream_url": patch.upstream_url,
        "fixed_in": patch.fixed_in,
        "base": derived_base(patch),
        "commit": upstream_commit(patch),
        "origin": patch.origin,
        "selected": report.selected,
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
        # What derive said the patch leaves out of the upstream fix.
        "not_carried": list(patch.not_carried),
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


#: The order states are counted in: what asks for work first.
COUNTED_STATES = ("needed", "drifted", "applied", "not-applicable")


def state_counts(reports: Sequence[PatchReport]) -> dict[str, int]:
    """How many selected patches are in each state (every state, 0 too)."""
    counts = dict.fromkeys(COUNTED_STATES, 0)
    for report in reports:
        if report.selected:
            counts[report.state.value] += 1
    return counts


def dump_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=False)


def metadata_json(patch: Patch) -> dict[str, Any]:
    return {
        "id": patch.id,
        "title": patch.title,
        "upstream_url": patch.upstream_url,
        "fixed_in": patch.fixed_in,
        "base": derived_base(patch),
        "commit": upstream_commit(patch),
        "origin": patch.origin,
        "symptom": patch.symptom,
        "also_changes": patch.also_changes,
        "not_carried": list(patch.not_carried),
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
            "headline": follow_up.headline,
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
            "extras": report.extras.json() if report.extras else None,
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
        "command": "list --footprint",
        "tree": tree_json(tree),
        "footprints": [
            {
                "id": item.patch_id,
                "functions": [
                    {
                        "path": f.path,
                        "line": f.line,
                        "symbol": f.symbol,
                        "why": f.why,
                        "kind": f.kind,
                    }
                    for f in item.functions
                ],
            }
            for item in found
        ],
    }


def cache_json(report: Any) -> dict[str, Any]:
    """``cache --format json``: a ``fetch.cache_kinds.CacheReport``."""
    return {
        "schema": SCHEMA_VERSION,
        "command": "cache",
        "path": str(report.path),
        "older_than_days": report.older_than_days,
        "cleared_kinds": report.clearing,
        "bytes": report.bytes,
        "freed_bytes": report.freed_bytes,
        "kinds": [kind.json() for kind in report.kinds],
    }


def revert_json(tree: VllmTree, result: Any) -> dict[str, Any]:
    """``revert --format json`` of an ``engine.inplace`` revert result.

    ``path`` and ``version`` repeat ``tree``'s (schema 1 had only them)."""
    return {
        "schema": SCHEMA_VERSION,
        "command": "revert",
        "tree": tree_json(tree),
        "path": str(result.installed.site_packages),
        "version": result.installed.version,
        "reverted": result.files,
        "bytecode": result.bytecode,
        "applied_before": result.applied,
    }


def error_json(error: Any) -> dict[str, Any]:
    """The ``error`` object of a document (an ``engine.errors.DeepstackError``)."""
    return {
        "message": error.message,
        "path": error.path,
        "line": error.line,
        "hint": error.hint,
    }

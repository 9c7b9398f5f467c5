"""A plan's reports as JSON and back, exactly: what a kept plan holds
beside its manifest (:mod:`.plan_memo`).

Recognition keeps tuples, lists, dicts and read-only mappings in a finding's
``details``; JSON has lists and objects only, so each container is written
tagged with its type, and read back as that type: a kept plan gives back
exactly the findings recognition gave (a plan is kept only where the round
trip is equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from deepstack_patch.engine.protocol import (
    Finding,
    Location,
    Patch,
    PatchReport,
    PatchState,
)


def report_document(report: PatchReport) -> dict[str, object]:
    """``report`` as JSON, its patch by id."""
    return {
        "id": report.patch.id,
        "selected": report.selected,
        "locations": [
            {"path": loc.path, "finding": _finding_document(loc.finding)}
            for loc in report.locations
        ],
        "blocked_reason": report.blocked_reason,
        "blocked_by": report.blocked_by,
        "applied_now": report.applied_now,
        "tree_files": None if report.tree_files is None else sorted(report.tree_files),
    }


def reports_of(
    documents: list[dict[str, object]], series: Sequence[Patch]
) -> list[PatchReport]:
    """The reports of ``documents``, each with its patch of ``series`` (a
    ValueError where they are another series' reports)."""
    patches = {patch.id: patch for patch in series}
    if [d["id"] for d in documents] != [p.id for p in series]:
        raise ValueError("another series")
    reports = []
    for document in documents:
        files = document["tree_files"]
        reports.append(
            PatchReport(
                patch=patches[str(document["id"])],
                selected=bool(document["selected"]),
                locations=[
                    Location(str(loc["path"]), _finding_of(loc["finding"]))
                    for loc in document["locations"]  # type: ignore[attr-defined]
                ],
                blocked_reason=str(document["blocked_reason"]),
                blocked_by=[str(b) for b in document["blocked_by"]],  # type: ignore[attr-defined]
                applied_now=bool(document["applied_now"]),
                tree_files=None if files is None else frozenset(files),  # type: ignore[arg-type]
            )
        )
    return reports


def _finding_document(finding: Finding) -> list[object]:
    return [
        finding.state.value,
        finding.symbol,
        finding.line,
        list(finding.span),
        finding.reason,
        finding.part,
        list(finding.rewrites),
        _tagged(finding.details),
    ]


def _finding_of(document: list) -> Finding:
    state, symbol, line, (first, last), reason, part, rewrites, details = document
    return Finding(
        PatchState(state),
        str(symbol),
        int(line),
        (int(first), int(last)),
        str(reason),
        str(part),
        tuple(str(name) for name in rewrites),
        _untagged(details),  # type: ignore[arg-type]
    )


def _tagged(value: object) -> object:
    """A finding's ``details`` in JSON, each container tagged with its type:
    recognition keeps tuples, lists, dicts and read-only mappings in them,
    and a kept plan gives back exactly what recognition gave."""
    match value:
        case str() | int() | float() | bool() | None:
            return value
        case tuple() | list():
            return {type(value).__name__: [_tagged(item) for item in value]}
        case MappingProxyType() | dict() if all(isinstance(k, str) for k in value):
            tag = "dict" if isinstance(value, dict) else "mappingproxy"
            return {tag: {key: _tagged(item) for key, item in value.items()}}
    raise TypeError(f"{type(value).__name__} in a finding's details")


def _untagged(value: object) -> object:
    match value:
        case {"tuple": list(items)}:
            return tuple(_untagged(item) for item in items)
        case {"list": list(items)}:
            return [_untagged(item) for item in items]
        case {"dict": dict(items)}:
            return {key: _untagged(item) for key, item in items.items()}
        case {"mappingproxy": dict(items)}:
            return MappingProxyType({k: _untagged(i) for k, i in items.items()})
        case dict() | list():
            raise ValueError("an untagged container in a kept finding")
    return value

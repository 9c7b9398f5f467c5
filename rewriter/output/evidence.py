"""``verify --gpu-evidence``: its JSON document (schema 1) and Markdown table."""

from __future__ import annotations

from typing import Any

from deepstack_patch.output.documents import SCHEMA_VERSION, tree_json


def evidence_json(report: Any) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "command": "verify",
        "mode": "gpu-evidence",
        "tree": tree_json(report.tree),
        "pristine": tree_json(report.pristine) if report.pristine else None,
        "device": {
            "requested": report.device,
            "status": report.status,
            "reason": report.reason,
            "python": report.python,
            **report.environment,
        },
        "measured_at": report.measured_at,
        "patches": [
            {
                "id": row.patch.id,
                "title": row.patch.title,
                "state": row.state.value,
                "pristine_state": row.pristine_state.value
                if row.pristine_state
                else None,
                "pristine_baseline": list(row.pristine_baseline),
                "pristine": row.pristine,
                "patched": row.patched,
                "ratios": row.ratios,
                "ok": not row.problems,
                "problems": row.problems,
            }
            for row in report.rows
        ],
        "seconds": report.seconds,
        "ok": report.ok,
    }


def device_label(report: Any) -> str:
    """``CPU (AMD EPYC, 2 threads), torch 2.13.0+cpu, no CUDA`` or the GPU's."""
    env = report.environment
    if report.status != "measured":
        return f"skipped: no GPU ({report.reason})"
    if env.get("kind") == "cuda":
        where = f"GPU {env.get('name')}"
        cuda = f"CUDA {env.get('cuda')}"
    else:
        where = f"CPU ({env.get('name')}, {env.get('threads')} threads)"
        cuda = "no CUDA" if not env.get("cuda") else f"CUDA {env.get('cuda')}"
    return (
        f"{where}, torch {env.get('torch')}, {cuda}, Python {env.get('python')}; "
        f"{report.measured_at}"
    )


def _cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "not measured"
    if result["status"] != "measured":
        return f"error: {result.get('error', '')}"
    measured = result["measurement"]
    parts = [measured["mechanism"]]
    for name, figure in measured["figures"].items():
        if isinstance(figure, dict) and "median_ms" in figure:
            parts.append(
                f"{name.replace('_', ' ')}: {figure['median_ms']:.3g} ms "
                f"(median of {figure['repetitions']}, "
                f"{figure['min_ms']:.3g}–{figure['max_ms']:.3g})"
            )
    return "; ".join(parts).replace("|", "\\|")


def evidence_markdown(report: Any) -> str:
    """The table docs/verify.md shows: one row per patch, both sides."""
    lines = [
        f"vLLM {report.tree.version}: {device_label(report)}",
        "",
    ]
    if report.status != "measured":
        return "\n".join(lines)
    lines += [
        "| patch | pristine | patched | ratio | fix shown |",
        "|---|---|---|---|---|",
    ]
    for row in report.rows:
        pristine = _cell(row.pristine)
        if row.pristine_baseline:
            pristine = f"(pristine + {', '.join(row.pristine_baseline)}) {pristine}"
        ratios = ", ".join(
            f"{name.replace('_', ' ')} {value}x" for name, value in row.ratios.items()
        )
        shown = "yes" if not row.problems else "no: " + "; ".join(row.problems)
        lines.append(
            f"| {row.patch.id} | {pristine} | {_cell(row.patched)} | "
            f"{ratios or '–'} | {shown} |"
        )
    return "\n".join(lines) + "\n"

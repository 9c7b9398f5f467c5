"""What ``derive`` prints: a derived patch's units and checks, as text or JSON."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def derive_json(result: Any) -> dict[str, Any]:
    """``derive --format json`` (schema 1); ``result`` is a DeriveResult."""
    from deepstack_patch.output.documents import tree_json

    return {
        "schema": 1,
        "command": "derive",
        "tree": tree_json(result.tree),
        "id": result.patch.id,
        "base": result.base_version,
        "upstream_url": result.patch.upstream_url,
        "fixed_in": result.patch.fixed_in,
        "commit": result.commit,
        "data_file": str(Path(result.data_file).absolute()),
        "round_trip": result.round_trip,
        "units": [
            {
                "path": u.path,
                "kind": u.kind,
                "name": u.name,
                # A file added or deleted whole: its text, and no edit recorded.
                "edits": 0 if u.whole_file else len(u.edits),
            }
            for u in result.units
        ],
        "tests": [t.path for t in result.tests],
        "skipped_tests": [
            {"path": t.path, "reason": t.reason} for t in result.patch.skipped_tests
        ],
        "notes": result.notes,
        "warnings": result.warnings,
        "seconds": round(result.seconds, 2),
    }


def print_derived(console: Console, result: Any, diff: str) -> None:
    """The text report of ``derive``: what was made, checked and written."""
    from deepstack_patch.output.plain import escape
    from deepstack_patch.output.upstream import upstream_words

    console.print(
        escape(f"derived {result.patch.id} from {diff} on vLLM {result.base_version}")
    )
    console.print(escape(f"  upstream: {upstream_words(result.patch)}"))
    for unit in result.units:
        console.print(escape(f"  {unit.kind} {unit.label} ({unit.path})"))
    for test in result.tests:
        which = ", ".join(test.names) if test.names else "the whole file"
        console.print(escape(f"  test {test.path} ({which})"))
    for text in result.notes:
        console.print(escape(f"  note: {text}"))
    same = "the same text" if result.round_trip == "text" else "the same code"
    console.print(
        "checked: needed only at the diff's sites; the rewrite gives the diff's "
        f"result ({same}); recognised applied after; a second pass changes nothing"
    )
    data_file = Path(result.data_file).absolute()
    console.print(escape(f"wrote {data_file} ({result.seconds:.1f} s)"))
    folder = shlex.quote(str(data_file.parent))
    console.print("next, on your vLLM tree PATH:")
    for command in ("apply", "verify"):
        console.print(
            escape(f"  deepstack-patch {command} --vllm-src PATH --patches {folder}")
        )

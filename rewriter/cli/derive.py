"""``deepstack-patch derive``: a derived patch from an upstream diff."""

from __future__ import annotations

import json
from pathlib import Path

import click
from deepstack_patch.cli.common import format_option, load_series, stdout_console


@click.command()
@click.option(
    "--diff",
    "diff",
    required=True,
    type=click.Path(path_type=Path),
    help="The upstream fix as a unified diff (a PR's .diff, git diff, "
    "git format-patch).",
)
@click.option(
    "--base",
    "base_version",
    metavar="VERSION",
    help="The release the diff applies to (fetched like --release).",
)
@click.option(
    "--base-src",
    "base_src",
    type=click.Path(path_type=Path),
    help="Instead of --base: a vLLM tree on disk the diff applies to.",
)
@click.option(
    "--id",
    "patch_id",
    required=True,
    metavar="ID",
    help="The patch's id: short text without spaces (vllm#49397, acme#12).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    help="The folder that receives the data file (ID.toml).",
)
@click.option("--title", default="", help="One line saying what the fix does.")
@click.option("--symptom", default="", help="The failure a user meets without it.")
@format_option
def derive(
    diff: Path,
    base_version: str | None,
    base_src: Path | None,
    patch_id: str,
    out: Path,
    title: str,
    symptom: str,
    output_format: str,
) -> None:
    """Derive a patch from an upstream diff: one data file, checked on the base.

    \b
    Exit codes: 0 written; 2 an error or a failed self-check (nothing written).
    """
    from deepstack_patch.distribution.derive import derive as derive_patch
    from deepstack_patch.output.progress import note

    result = derive_patch(
        diff,
        patch_id=patch_id,
        out=out,
        base_version=base_version,
        base_src=base_src,
        title=title,
        symptom=symptom,
        taken_ids=[patch.id for patch in load_series()],
        note=note,
    )
    units = [
        {"path": u.path, "kind": u.kind, "name": u.name, "edits": len(u.edits)}
        for u in result.units
    ]
    if output_format == "json":
        document = {
            "schema": 1,
            "command": "derive",
            "id": result.patch.id,
            "base": result.base_version,
            "data_file": str(result.data_file),
            "round_trip": result.round_trip,
            "units": units,
            "tests": [t.path for t in result.tests],
            "notes": result.notes,
            "seconds": round(result.seconds, 2),
        }
        click.echo(json.dumps(document, indent=2))
        return
    console = stdout_console()
    console.print(
        f"derived {result.patch.id} from {diff} on vLLM {result.base_version}"
    )
    for unit in units:
        console.print(f"  {unit['kind']} {unit['name']} ({unit['path']})")
    for test in result.tests:
        console.print(f"  test {test.path}")
    for text in result.notes:
        console.print(f"  note: {text}")
    same = "the same text" if result.round_trip == "text" else "the same code"
    console.print(
        "checked: needed only at the diff's sites; the rewrite gives the diff's "
        f"result ({same}); recognised applied after; a second pass changes nothing"
    )
    console.print(f"wrote {result.data_file} ({result.seconds:.1f} s)")

"""``deepstack-patch list``: the series, in order, with metadata."""

from __future__ import annotations

import click
from deepstack_patch.cli.common import (
    format_option,
    stdout_console,
)


@click.command("list")
@format_option
def list_command(output_format: str) -> None:
    """List the patch series in the order it is applied, with metadata."""
    from deepstack_patch.output.report import dump_json, metadata_json
    from deepstack_patch.patches import SERIES

    if output_format == "json":
        click.echo(
            dump_json(
                {
                    "schema": 1,
                    "command": "list",
                    "patches": [metadata_json(p) for p in SERIES],
                }
            )
        )
        return
    console = stdout_console()
    for patch in SERIES:
        console.print(f"[bold]{patch.id}[/]  {patch.title}")
        console.print(
            f"  upstream: {patch.upstream_url} (first in vLLM {patch.fixed_in})"
        )
        console.print(f"  symptom:  {patch.symptom}")
        console.print(f"  changes:  {patch.also_changes}")
        if patch.requires:
            console.print(f"  requires: {', '.join(patch.requires)}")
        if patch.supersedes:
            console.print(f"  supersedes: {', '.join(patch.supersedes)}")
        console.print(f"  where:    {', '.join(patch.paths)}")

"""``deepstack-patch list``: the series, in order, with metadata."""

from __future__ import annotations

import click
from deepstack_patch.cli.common import format_option, load_series, stdout_console


@click.command("list")
@format_option
def list_command(output_format: str) -> None:
    """List the patch series in the order it is applied, with metadata."""
    series = load_series()
    if output_format == "json":
        from deepstack_patch.output.documents import dump_json, list_json

        click.echo(dump_json(list_json(series)))
        return
    from deepstack_patch.output.tables import print_series

    print_series(stdout_console(), series)

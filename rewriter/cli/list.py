"""``deepstack-patch list``: the series, in order, with metadata."""

from __future__ import annotations

from pathlib import Path

import click
from deepstack_patch.cli.common import (
    format_option,
    stdout_console,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
)
from deepstack_patch.engine.errors import DeepstackError


@click.command("list")
@patches_option
@click.option(
    "--footprint",
    is_flag=True,
    help="Print each patch's footprint in a tree (--vllm-src or --release): the "
    "functions it rewrites and those writing the state they read.",
)
@click.option(
    "--vllm-src",
    "vllm_src",
    type=click.Path(path_type=Path),
    help="With --footprint: root of a vLLM source tree.",
)
@click.option(
    "--release", metavar="VERSION", help="With --footprint: a release's source."
)
@format_option
def list_command(
    footprint: bool, vllm_src: Path | None, release: str | None, output_format: str
) -> None:
    """List the patch series in the order it is applied, with metadata.

    Each patch says where it came from: built-in, a data file or module of a
    --patches folder, or an installed package's entry point.
    """
    series = load_series()
    if footprint:
        _print_footprints(series, vllm_src, release, output_format)
        return
    if vllm_src is not None or release is not None:
        raise DeepstackError(
            "--vllm-src and --release go with --footprint", "add --footprint"
        )
    if output_format == "json":
        from deepstack_patch.output.documents import dump_json, list_json

        click.echo(dump_json(list_json(series)))
        return
    from deepstack_patch.output.tables import print_series

    print_series(stdout_console(), series)


def _print_footprints(
    series: object, vllm_src: Path | None, release: str | None, output_format: str
) -> None:
    from deepstack_patch.cli.common import open_tree
    from deepstack_patch.engine.footprint import series_footprints

    tree = open_tree(vllm_src, release, None, read_only=True)
    found = series_footprints(tree, series)  # type: ignore[arg-type]
    if output_format == "json":
        from deepstack_patch.output.documents import dump_json, footprint_json

        click.echo(dump_json(footprint_json(tree, found)))
        return
    from deepstack_patch.output.watch import print_footprints

    print_footprints(stdout_console(), tree, found)

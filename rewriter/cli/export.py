"""``deepstack-patch export``: a quilt / format-patch series with DEP-3 headers."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from deepstack_patch.cli.common import (
    EXIT_OK,
    format_option,
    refuse_drifted,
    stdout_console,
    tree_options,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
    select_options,
)
from deepstack_patch.engine.tree import VllmTree


@click.command()
@patches_option
@tree_options
@click.option(
    "--series",
    "series_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder for the patch files and the quilt `series` file.",
)
@select_options
@format_option
def export(
    tree: VllmTree,
    series_dir: Path,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    output_format: str,
) -> None:
    """Write the patches this exact tree needs as a patch series.

    One `git format-patch` style file per needed patch, with DEP-3 headers
    (Description, Origin, Bug, Applied-Upstream, Last-Update), in series
    order and cumulative: each applies on top of the ones before it. A quilt
    `series` file lists them. `quilt push -a`, `patch -p1` or `git apply` on a
    copy of the same tree gives byte for byte what `apply` gives. The tree
    itself is not modified. SOURCE_DATE_EPOCH fixes the dates.

    \b
    Exit codes: 0 series written (possibly empty: nothing needed);
    2 drifted targets or an error, nothing written.
    """
    from deepstack_patch.distribution.quilt import export_series, vllm_named
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.output.documents import dump_json, plan_json

    series = load_series()
    result = export_series(tree, series, select_patches(series, only, skip), series_dir)
    if result.drifted:
        sys.exit(refuse_drifted(result.plan, output_format, "export"))
    names = result.names
    if output_format == "json":
        listed = [
            {"file": name, "id": step.patch.id}
            for name, step in zip(names, result.steps, strict=True)
        ]
        document = plan_json(
            result.plan, "export", series_dir=str(series_dir.resolve()), series=listed
        )
        click.echo(dump_json(document))
        sys.exit(EXIT_OK)
    console = stdout_console()
    if not names:
        console.print(
            f"{vllm_named(tree.version)}: nothing needed; wrote an empty series to "
            f"{series_dir / 'series'}"
        )
    else:
        console.print(
            f"{vllm_named(tree.version)}: wrote {len(names)} patch(es) to {series_dir}:"
        )
        for name in names:
            console.print(f"  {name}")
    sys.exit(EXIT_OK)

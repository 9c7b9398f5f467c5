"""``deepstack-patch wheel``: the official vLLM wheel, patched and re-versioned."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from deepstack_patch.cli.common import (
    EXIT_OK,
    format_option,
    refuse_drifted,
    stderr_console,
    stdout_console,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
    select_options,
)
from deepstack_patch.engine.errors import DeepstackError

if TYPE_CHECKING:
    from deepstack_patch.engine.protocol import Patch


@click.command()
@patches_option
@click.option("--release", metavar="VERSION", help="Fetch this release's wheel.")
@click.option(
    "--wheel",
    "wheel_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Patch this vllm-*.whl instead of fetching one.",
)
@click.option(
    "--platform",
    metavar="TAG",
    help="With --release: the wheel for this platform tag "
    "(manylinux_2_35_aarch64, or just aarch64); default: this machine's.",
)
@click.option(
    "--local-version",
    "label",
    default="deepstack.1",
    show_default=True,
    help="PEP 440 local version label: the wheel says VERSION+LABEL.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("."),
    show_default=True,
    help="The folder the patched wheel (vllm-VERSION+LABEL-*.whl) is written into.",
)
@select_options
@format_option
def wheel(
    release: str | None,
    wheel_file: Path | None,
    platform: str | None,
    label: str,
    out: Path,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    output_format: str,
) -> None:
    """Write the official vLLM wheel with the series applied, as VERSION+LABEL.

    Only Python files change; the compiled kernels, every other member and its
    attributes are the official wheel's. `pip install` the result (with
    --no-deps to keep your other packages) to run the fixed vLLM without
    building it.

    \b
    Exit codes: 0 written; 2 drifted targets or an error (nothing written).
    """
    from deepstack_patch.distribution.sdist import local_version
    from deepstack_patch.distribution.wheel import patch_wheel
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.output.documents import dump_json

    if (release is None) == (wheel_file is None):
        raise DeepstackError(
            "give exactly one of --release VERSION and --wheel FILE",
            "e.g. --release 0.20.2",
        )
    if wheel_file is not None and platform is not None:
        raise DeepstackError(
            "--platform goes with --release, not with --wheel",
            "drop --platform: the wheel file's name says its platform",
        )
    series = load_series()
    selected = select_patches(series, only, skip)
    local_version(release or "0", label)  # a bad label fails before a download
    source = wheel_file if wheel_file is not None else _download(release, platform)
    console = stderr_console()
    result = patch_wheel(
        source, series, selected, label, out, lambda line: console.print(line)
    )
    if result.path is None:
        sys.exit(refuse_drifted(result.plan, output_format, "wheel"))
    document = _wheel_json(result, series, source)
    if output_format == "json":
        click.echo(dump_json(document))
        sys.exit(EXIT_OK)
    names = ", ".join(document["applied"]) or "none (nothing needed)"
    stdout = stdout_console()
    stdout.print(f"vLLM {result.release} -> {result.version}; patches applied: {names}")
    stdout.print(f"  wheel   {result.path}")
    stdout.print(f"  sha256  {result.sha256}")
    stdout.print(f"  series  {result.series}")
    stdout.print(f"  sbom    {result.sbom}")
    stdout.print(
        f"  {len(result.replaced)} member(s) rewritten, {result.copied} copied as "
        "they were"
    )
    console.print(f"done in {result.seconds:.1f} s")
    sys.exit(EXIT_OK)


def _wheel_json(result: Any, series: Sequence[Patch], source: Path) -> dict[str, Any]:
    """``wheel --format json``: the plan document, with the wheel's outputs."""
    from deepstack_patch.output.documents import plan_json

    applied = sorted({i for e in result.plan.edits for i in e.patch_ids})
    document = plan_json(
        result.plan,
        "wheel",
        release=result.release,
        local_version=result.version,
        applied=[p.id for p in series if p.id in applied],
        written=result.replaced,
        outputs={
            "wheel": str(result.path),
            "wheel_sha256": result.sha256,
            "series": str(result.series),
            "sbom": str(result.sbom),
        },
        source_wheel=str(source),
        copied_members=result.copied,
        seconds=result.seconds,
    )
    # The plan read a temporary extraction; the tree a user knows is the wheel.
    document["tree"] = {
        "path": str(source.resolve()),
        "version": result.release,
        "version_source": "wheel file name",
    }
    return document


def _download(release: str, platform: str | None) -> Path:
    from deepstack_patch.fetch.wheels import download_wheel, find_wheel
    from deepstack_patch.output.progress import progress

    found = find_wheel(release, platform)
    with progress(found.filename) as update:
        return download_wheel(found, update)

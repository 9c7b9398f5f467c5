"""``deepstack-patch derive``: a derived patch from an upstream diff."""

from __future__ import annotations

from pathlib import Path

import click
from deepstack_patch.cli.common import (
    format_option,
    load_series,
    patches_option,
    stdout_console,
)


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
    help="The folder the derived patch's data file (ID.toml) is written into: "
    "give it to apply, status or verify with --patches.",
)
@click.option("--title", default="", help="One line saying what the fix does.")
@click.option("--symptom", default="", help="The failure a user meets without it.")
@click.option(
    "--fixed-in",
    "fixed_in",
    default="",
    metavar="VERSION",
    help="The first vLLM release with the fix, if there is one yet.",
)
@click.option(
    "--upstream-url",
    "upstream_url",
    default="",
    metavar="URL",
    help="Where the fix comes from (default for --id vllm#N: its pull request).",
)
@patches_option
@format_option
def derive(
    diff: Path,
    base_version: str | None,
    base_src: Path | None,
    patch_id: str,
    out: Path,
    title: str,
    symptom: str,
    fixed_in: str,
    upstream_url: str,
    output_format: str,
) -> None:
    """Derive a patch from an upstream diff: one data file, checked on the base.

    Its id must be new to the series it joins: the built-in patches, those of
    installed packages and those of the --patches folders.

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
        upstream_url=upstream_url,
        fixed_in=fixed_in,
    )
    if output_format == "json":
        from deepstack_patch.output.derived import derive_json
        from deepstack_patch.output.documents import dump_json

        click.echo(dump_json(derive_json(result)))
        return
    from deepstack_patch.output.derived import print_derived

    print_derived(stdout_console(), result, str(diff))

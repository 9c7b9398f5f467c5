"""``deepstack-patch derive``: a derived patch from an upstream diff."""

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


@click.command()
@click.option(
    "--diff",
    "diff",
    type=click.Path(path_type=Path),
    help="The upstream fix as a unified diff (a PR's .diff, git diff, "
    "git format-patch).",
)
@click.option(
    "--commit",
    "commit",
    metavar="SHA",
    help="Instead of --diff and its base: a commit of a vLLM clone; the base is "
    "its parent, read from the object store (the work tree is not touched).",
)
@click.option(
    "--repo",
    "repo",
    type=click.Path(path_type=Path),
    help="With --commit: the clone (a work tree or a bare clone; default: here).",
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
    "--base-version",
    "tree_version",
    metavar="VERSION",
    help="The version of a --base-src tree or a --commit's parent, where the "
    "tree has no version metadata or git describe finds no tag.",
)
@click.option(
    "--id",
    "patch_id",
    metavar="ID",
    help="The patch's id: short text without spaces (vllm#49397, acme#12); "
    "by default vllm#N from the commit's or the format-patch mail's subject "
    "ending in (#N).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    help="The folder the derived patch's data file (ID.toml) is written into: "
    "give it to apply, status or verify with --patches.",
)
@click.option(
    "--title",
    default="",
    help="One line saying what the fix does (default: the commit's or the "
    "format-patch mail's subject).",
)
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
@click.option(
    "--force",
    is_flag=True,
    help="Replace the data file in --out that holds the id (one derived "
    "again); without it such a file is refused.",
)
@patches_option
@format_option
def derive(
    diff: Path | None,
    commit: str | None,
    repo: Path | None,
    base_version: str | None,
    base_src: Path | None,
    tree_version: str | None,
    patch_id: str | None,
    out: Path,
    title: str,
    symptom: str,
    fixed_in: str,
    upstream_url: str,
    force: bool,
    output_format: str,
) -> None:
    """Derive a patch from an upstream diff or commit: one data file, checked
    on the base.

    Its id must be new to the series it joins: the built-in patches, those of
    installed packages and those of the --patches folders.

    \b
    Exit codes: 0 written; 2 an error or a failed self-check (nothing written).
    """
    from deepstack_patch.authoring.sources import check_sources
    from deepstack_patch.output.progress import note

    check_sources(
        diff=diff,
        commit=commit,
        repo=repo,
        release=base_version,
        base_src=base_src,
        tree_version=tree_version,
        patch_id=patch_id,
    )
    common = dict(
        out=out,
        tree_version=tree_version,
        title=title,
        symptom=symptom,
        taken_ids=_taken_ids(out, force),
        upstream_url=upstream_url,
        fixed_in=fixed_in,
        force=force,
    )
    if commit is not None:
        from deepstack_patch.authoring.commit import derive_commit

        result = derive_commit(
            commit, repo=repo or Path("."), patch_id=patch_id or "", **common
        )
        source = f"commit {result.commit[:12]}"
    else:
        from deepstack_patch.authoring.derive import derive as derive_patch

        assert diff is not None
        result = derive_patch(
            diff,
            patch_id=patch_id or "",
            base_version=base_version,
            base_src=base_src,
            note=note,
            **common,
        )
        source = str(diff)
    if output_format == "json":
        from deepstack_patch.output.derived import derive_json
        from deepstack_patch.output.documents import dump_json

        click.echo(dump_json(derive_json(result)))
        return
    from deepstack_patch.output.derived import print_derived
    from deepstack_patch.output.progress import warn

    for text in result.warnings:
        warn(text)
    print_derived(stdout_console(), result, source)


def _taken_ids(out: Path, force: bool) -> list[str]:
    """The ids of the series the derived patch joins; with --force, not the
    one of a data file in --out (it is the file replaced)."""
    return [
        patch.id
        for patch in load_series()
        if not (force and Path(patch.origin).parent.absolute() == out.absolute())
    ]

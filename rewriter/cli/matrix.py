"""``deepstack-patch matrix``: patch states on many releases, or a CI pipeline."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
from deepstack_patch.cli.common import (
    EXIT_OK,
    format_option,
    stderr_console,
    stdout_console,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
    select_options,
)
from deepstack_patch.engine.errors import DeepstackError


@click.command()
@patches_option
@click.option(
    "--releases",
    "releases_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Releases to check: one per line, or a TOML file with `releases = [...]` "
    "(default: the releases in the targets file).",
)
@click.option(
    "--targets",
    "targets_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Expected states (default: the targets.toml shipped with the tool).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=lambda: os.cpu_count() or 1,
    show_default="CPU count",
    help="Releases checked at once, one process each.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Also apply the series to each release and verify it, as "
    "`deepstack-patch verify` does.",
)
@click.option(
    "--emit",
    type=click.Choice(["github-actions", "buildkite"]),
    help="Write a CI pipeline that runs backport (and verify) per release on "
    "separate CI workers, instead of checking here.",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    help="With --emit: the pipeline file to write ('-' for stdout).",
)
@click.option(
    "--install",
    default=None,
    help="With --emit: the shell command that installs deepstack-patch in a CI "
    "job (default: pip install of the checked-out repository).",
)
@click.option(
    "--attest/--no-attest",
    default=True,
    show_default=True,
    help="With --emit github-actions: sign each verified patched tarball with "
    "GitHub's artifact attestation (actions/attest-build-provenance), which "
    "gives the job the permissions id-token: write, attestations: write and "
    "contents: read. Attestations in private repositories need GitHub "
    "Enterprise Cloud; without it, use --no-attest. Buildkite pipelines keep "
    "only the unsigned provenance.intoto.json.",
)
@click.option(
    "--watch/--no-watch",
    default=True,
    show_default=True,
    help="With --emit: a scheduled run (GitHub: weekly, Mondays 05:17 UTC; "
    "Buildkite: a schedule you set in the pipeline's settings) runs "
    "`deepstack-patch watch --since <oldest release>` instead of the "
    "backports, and fails when upstream changed the code a carried fix depends "
    "on in a way nobody reviewed (see docs/watch.md).",
)
@select_options
@format_option
def matrix(
    releases_file: Path | None,
    targets_file: Path | None,
    jobs: int,
    verify: bool,
    emit: str | None,
    output: Path | None,
    install: str | None,
    attest: bool,
    watch: bool,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    output_format: str,
) -> None:
    """Check every patch on many releases against targets.toml, in parallel.

    Each release is fetched (the verified tarball in the cache is reused),
    the files the patches read are extracted once into the cache, and each
    release is checked in its own process. Prints a release x patch table; a cell that
    differs from targets.toml shows both states.

    \b
    Exit codes: 0 every state is what targets.toml expects (and, with
    --verify, every verify passed); 1 some state differs or a verify failed;
    2 an error (a release could not be fetched or read).
    """
    from deepstack_patch.distribution.matrix import matrix_inputs
    from deepstack_patch.engine.plan import select_patches

    targets_path, targets, releases = matrix_inputs(releases_file, targets_file)
    series = load_series()
    selected = select_patches(series, only, skip)
    if (output is None) != (emit is None):
        raise DeepstackError(
            "--emit and --output go together",
            "e.g. --emit buildkite --output .buildkite/deepstack.yml",
        )
    if emit and output:
        sys.exit(_emit(emit, output, releases, targets, install, attest, watch))
    result = _check_with_progress(releases, series, selected, targets, jobs, verify)
    patch_ids = [patch.id for patch in series if patch.id in selected]
    if output_format == "json":
        from deepstack_patch.distribution.matrix import matrix_json
        from deepstack_patch.output.documents import dump_json

        document = matrix_json(
            result.results,
            result.differences,
            str(targets_path),
            result.wall_seconds,
            series,
        )
        document["no_expectations"] = [
            r.version for r in result.results if r.version not in targets.releases
        ]
        document["patches_without_expectations"] = result.uncompared
        click.echo(dump_json(document))
    else:
        from deepstack_patch.output.tables import print_matrix

        print_matrix(
            stdout_console(),
            result.results,
            result.differences,
            patch_ids,
            verify,
            result.wall_seconds,
            jobs,
            targets,
            result.uncompared,
        )
    sys.exit(result.exit_code)


def _emit(
    emit: str,
    output: Path,
    releases: list[str],
    targets: Any,
    install: str | None,
    attest: bool,
    watch: bool,
) -> int:
    from deepstack_patch.distribution.pipelines import DEFAULT_INSTALL, emit_pipeline

    install = install or DEFAULT_INSTALL
    text = emit_pipeline(emit, releases, targets, install, attest, watch)
    if str(output) == "-":
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        stderr_console().print(
            f"wrote {emit} pipeline for {len(releases)} release(s) to {output}"
        )
    return EXIT_OK


def _check_with_progress(
    releases: list[str],
    series: Any,
    selected: set[str],
    targets: Any,
    jobs: int,
    verify: bool,
) -> Any:
    from deepstack_patch.distribution.matrix import check_matrix
    from deepstack_patch.output.progress import progress

    with progress("matrix", unit="items") as update:
        finished = 0
        update(0, len(releases))

        def done(result: Any) -> None:
            nonlocal finished
            finished += 1
            status = "error" if result.error else "ok"
            update(finished, len(releases), f"{result.version} {status}")

        return check_matrix(
            releases, series, selected, targets, jobs=jobs, verify=verify, on_done=done
        )

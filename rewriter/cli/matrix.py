"""``deepstack-patch matrix``: patch states on many releases, or a CI pipeline."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from deepstack_patch.cli.common import (
    EXIT_ERROR,
    EXIT_NEEDED,
    EXIT_OK,
    format_option,
    select_options,
    stderr_console,
    stdout_console,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import PatchState


@click.command()
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
    help="Also apply the series to each release and run `deepstack-patch verify` "
    "on it (needs the verify command and its extras).",
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
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.engine.targets import default_targets_path, load_targets
    from deepstack_patch.patches import SERIES
    from deepstack_patch.vendor.matrix import (
        DEFAULT_INSTALL,
        differences,
        emit_pipeline,
        matrix_json,
        read_releases,
        verify_available,
    )

    targets_path = targets_file or default_targets_path()
    targets = load_targets(targets_path)
    releases = read_releases(releases_file) if releases_file else targets.releases
    if not releases:
        raise DeepstackError(
            f"{targets_path}: lists no releases", "add releases = [...] or --releases"
        )
    selected = select_patches(SERIES, only, skip)
    patch_ids = [patch.id for patch in SERIES if patch.id in selected]

    if (output is None) != (emit is None):
        raise DeepstackError(
            "--emit and --output go together",
            "e.g. --emit buildkite --output .buildkite/deepstack.yml",
        )
    if verify and not verify_available():
        raise DeepstackError(
            "--verify needs the `deepstack-patch verify` command, which this "
            "installation does not have",
            "install a deepstack-patch version with `verify`, or run without --verify",
        )
    if emit:
        with_verify = verify_available()
        text = emit_pipeline(
            emit, releases, targets, install or DEFAULT_INSTALL, with_verify
        )
        if str(output) == "-":
            sys.stdout.write(text)
        else:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text)
            stderr_console().print(
                f"wrote {emit} pipeline for {len(releases)} release(s) to {output}"
            )
        if not with_verify:
            stderr_console().print(
                "[yellow]warning:[/] this installation has no `verify` command, so "
                "the jobs run backport only"
            )
        sys.exit(EXIT_OK)

    results, wall = _run_with_progress(releases, sorted(selected), jobs, verify)
    diffs = differences(results, targets, patch_ids)
    errors = [r for r in results if r.error]
    failed_verify = [r for r in results if r.verify_code]
    code = EXIT_ERROR if errors else EXIT_NEEDED if diffs or failed_verify else EXIT_OK
    if output_format == "json":
        document = matrix_json(results, diffs, str(targets_path), wall)
        document["no_expectations"] = [
            r.version for r in results if r.version not in targets.releases
        ]
        click.echo(json.dumps(document, indent=2))
        sys.exit(code)
    _print_matrix(results, diffs, patch_ids, verify, wall, jobs, targets)
    sys.exit(code)


def _run_with_progress(
    releases: list[str], selected: list[str], jobs: int, verify: bool
) -> tuple[list[Any], float]:
    from deepstack_patch.output.progress import progress
    from deepstack_patch.vendor.matrix import run_matrix

    started = time.monotonic()
    with progress("matrix", unit="items") as update:
        finished = 0
        update(0, len(releases))

        def done(result: Any) -> None:
            nonlocal finished
            finished += 1
            status = "error" if result.error else "ok"
            update(finished, len(releases), f"{result.version} {status}")

        results = run_matrix(releases, selected, jobs, verify, done)
    return results, time.monotonic() - started


def _print_matrix(
    results: list[Any],
    diffs: list[Any],
    patch_ids: list[str],
    verify: bool,
    wall: float,
    jobs: int,
    targets: Any,
) -> None:
    from deepstack_patch.output.report import STATE_STYLE
    from rich.table import Table

    console = stdout_console()
    wrong = {(d.version, d.patch_id): d.expected for d in diffs}
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("release", no_wrap=True)
    for patch_id in patch_ids:
        table.add_column(patch_id, no_wrap=True)
    if verify:
        table.add_column("verify", no_wrap=True)
    for result in results:
        if result.error:
            row = [f"[bold red]error[/] {result.error.splitlines()[0]}"]
            row += [""] * (len(patch_ids) - 1 + verify)
            table.add_row(result.version, *row)
            continue
        cells = []
        for patch_id in patch_ids:
            state = result.states.get(patch_id, "")
            style = STATE_STYLE.get(PatchState(state), "") if state else ""
            cell = f"[{style}]{state}[/]" if style else state
            if (result.version, patch_id) in wrong:
                cell = f"[bold red]{state} ≠ {wrong[result.version, patch_id]}[/]"
            cells.append(cell)
        if verify:
            cells.append(
                "[green]passed[/]"
                if result.verify_code == 0
                else "skipped (drifted)"
                if result.verify_code is None
                else f"[red]failed ({result.verify_code})[/]"
            )
        table.add_row(result.version, *cells)
    console.print(table)
    errors = [r for r in results if r.error]
    for result in errors:
        console.print(f"[bold red]error:[/] {result.version}: {result.error}")
    for result in results:
        if result.verify_code:
            console.print(f"[red]verify failed on {result.version}:[/]")
            console.print(result.verify_output, markup=False)
    if diffs:
        console.print(
            f"[bold red]{len(diffs)} state(s) differ from the targets[/] "
            "(shown as found ≠ expected)"
        )
    unlisted = [r.version for r in results if r.version not in targets.releases]
    if unlisted:
        console.print(
            f"no expectations for {', '.join(unlisted)}: targets.toml does not list "
            "it, so only the states are shown"
        )
    verdict = "NOT as expected" if diffs or errors else "all as expected"
    if len(unlisted) == len(results) and not errors:
        verdict = "nothing to compare"
    console.print(
        f"{len(results)} release(s) x {len(patch_ids)} patch(es) in {wall:.1f} s "
        f"with {jobs} process(es); {verdict}"
    )

"""Commands for vendor pipelines: ``export``, ``backport``, ``matrix``, and the
``--commit`` mode of ``apply``.

Registered on the main group by one line at the end of cli.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click

from .cli import (
    EXIT_ERROR,
    EXIT_NEEDED,
    EXIT_OK,
    format_option,
    main,
    select_options,
    stderr_console,
    stdout_console,
)
from .errors import DeepstackError
from .plan import Plan
from .protocol import PatchState
from .tree import VllmTree


def _drifted(plan: Plan) -> list[Any]:
    return [r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED]


def _refuse_drifted(plan: Plan, output_format: str, command: str) -> None:
    """Print the plan and the refusal, then exit 2 (nothing was written)."""
    from .report import dump_json, plan_json, print_plan_table, print_tree_header

    if output_format == "json":
        click.echo(dump_json(plan_json(plan, command, written=[])))
    else:
        console = stdout_console()
        print_tree_header(console, plan.tree)
        print_plan_table(console, plan)
        names = ", ".join(r.patch.id for r in _drifted(plan))
        console.print(
            f"[bold red]refused:[/] {names} drifted: the target code has a shape "
            "this tool does not recognise, so nothing was written. Each location "
            "above says what was expected; use --skip ID to leave a patch out."
        )
    sys.exit(EXIT_ERROR)


# --- apply --commit ----------------------------------------------------------


def apply_with_commits(
    tree: VllmTree, selected: set[str], allow_dirty: bool, output_format: str
) -> int:
    """Apply the needed patches as one git commit each; return the exit code."""
    from .patches import SERIES
    from .report import dump_json, plan_json, print_plan_table, print_tree_header
    from .series import plan_steps
    from .transaction import tree_lock
    from .vcs import check_work_tree, commit_steps, open_repository

    repo = open_repository(tree)
    with tree_lock(tree.root):
        plan, steps = plan_steps(tree, SERIES, selected)
        if _drifted(plan):
            _refuse_drifted(plan, output_format, "apply")
        touched = sorted({edit.relpath for step in steps for edit in step.edits})
        check_work_tree(repo, tree, touched, allow_dirty)
        commits = commit_steps(repo, tree, steps)

    if output_format == "json":
        document = plan_json(
            plan,
            "apply",
            dry_run=False,
            check=False,
            written=touched,
            commits=[
                {"id": c.patch_id, "sha": c.sha, "files": c.files} for c in commits
            ],
        )
        click.echo(dump_json(document))
        return EXIT_OK
    console = stdout_console()
    print_tree_header(console, tree)
    print_plan_table(console, plan)
    if not commits:
        console.print(
            "nothing to do: every selected patch is applied or not applicable; "
            "no commit made"
        )
    for commit in commits:
        console.print(
            f"[green]committed[/] {commit.sha[:12]} {commit.patch_id} "
            f"({', '.join(commit.files)})"
        )
    return EXIT_OK


# --- export ------------------------------------------------------------------


@main.command()
@click.option(
    "--vllm-src",
    "vllm_src",
    required=True,
    type=click.Path(path_type=Path),
    help="Root of the vLLM source tree to export the series for (not modified).",
)
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
    vllm_src: Path,
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
    from .patches import SERIES
    from .plan import select_patches
    from .report import dump_json, plan_json
    from .series import plan_steps, write_series

    tree = VllmTree.open(vllm_src)
    plan, steps = plan_steps(tree, SERIES, select_patches(SERIES, only, skip))
    if _drifted(plan):
        _refuse_drifted(plan, output_format, "export")
    names = write_series(series_dir, steps, tree.version)
    if output_format == "json":
        series = [
            {"file": name, "id": step.patch.id}
            for name, step in zip(names, steps, strict=True)
        ]
        document = plan_json(
            plan, "export", series_dir=str(series_dir.resolve()), series=series
        )
        click.echo(dump_json(document))
        sys.exit(EXIT_OK)
    console = stdout_console()
    if not names:
        console.print(
            f"vLLM {tree.version}: nothing needed; wrote an empty series to "
            f"{series_dir / 'series'}"
        )
    else:
        console.print(
            f"vLLM {tree.version}: wrote {len(names)} patch(es) to {series_dir}:"
        )
        for name in names:
            console.print(f"  {name}")
    sys.exit(EXIT_OK)


# --- backport ----------------------------------------------------------------

REPORT_NAME = "report.json"


def _prepare_out(out: Path) -> None:
    """``--out`` must be new, empty, or an earlier backport's (then replaced)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise DeepstackError(f"--out {out}: is a file", "give a folder")
    children = list(out.iterdir())
    if not children:
        return
    report = out / REPORT_NAME
    try:
        earlier = json.loads(report.read_text()).get("command") == "backport"
    except (OSError, ValueError, AttributeError):
        earlier = False
    if not earlier:
        raise DeepstackError(
            f"--out {out}: not empty, and not the output of an earlier backport",
            "give a new or empty folder",
        )
    # Only what an earlier backport writes is removed.
    for child in children:
        if child.name in (REPORT_NAME, "series") or child.name.startswith("vllm-"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


@main.command()
@click.option(
    "--release",
    required=True,
    metavar="VERSION",
    help="The vLLM release to fetch from the package index pip is configured for.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="Output folder (default ./backport-VERSION): new, empty, or an earlier "
    "backport's, which is replaced.",
)
@click.option(
    "--local-version",
    "label",
    default="deepstack.1",
    show_default=True,
    help="PEP 440 local version label of the patched release: the tarball and "
    "tree say VERSION+LABEL. Bump the number when the series for a release "
    "changes.",
)
@select_options
@format_option
def backport(
    release: str,
    out: Path | None,
    label: str,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    output_format: str,
) -> None:
    """Fetch a release, apply the series, and write everything a build needs.

    \b
    Into --out:
      vllm-VERSION+LABEL/          the patched source tree
      series/                      the patch series (see `export`), against
                                   the pristine release
      vllm-VERSION+LABEL.tar.gz    the patched source tarball
      report.json                  states, patches, outputs (schema 1)

    The tree and the tarball carry the local version (PKG-INFO,
    vllm.egg-info/PKG-INFO, vllm/_version.py); the series carries only the
    fixes. SOURCE_DATE_EPOCH makes the tarball and series reproducible.

    \b
    Exit codes: 0 all four written; 2 drifted targets or an error (the
    patched tree and tarball are not written).
    """
    from .patches import SERIES
    from .plan import select_patches
    from .releases import extract_release
    from .report import dump_json, plan_json
    from .sdist import local_version, repack_sdist, version_edits
    from .series import build_date, plan_steps, write_series
    from .transaction import write_edits

    started = time.monotonic()
    selected = select_patches(SERIES, only, skip)
    new_version = local_version(release, label)
    out = out or Path(f"backport-{release}")
    _prepare_out(out)
    console = stderr_console()

    archive = _download(release)
    tree_dir = out / f"vllm-{new_version}"
    with console.status(f"extracting {archive.name}"):
        tree = extract_release(archive, release, tree_dir)
    if tree.version != release:
        raise DeepstackError(
            f"{archive.name}: its PKG-INFO says {tree.version}, not {release}",
            f"delete {archive} so it is downloaded again",
        )
    plan, steps = plan_steps(tree, SERIES, selected)
    if _drifted(plan):
        shutil.rmtree(tree_dir, ignore_errors=True)
        _refuse_drifted(plan, output_format, "backport")

    names = write_series(out / "series", steps, release)
    written = write_edits(tree.root, plan.edits)
    versioned = version_edits(tree.root, release, new_version)
    write_edits(tree.root, versioned)
    replaced = {edit.relpath: edit.new for edit in [*plan.edits, *versioned]}
    with console.status(f"writing vllm-{new_version}.tar.gz"):
        sdist = repack_sdist(
            archive,
            replaced,
            new_version,
            out / f"vllm-{new_version}.tar.gz",
            int(build_date().timestamp()),
        )
    document = plan_json(
        plan,
        "backport",
        release=release,
        local_version=new_version,
        applied=[step.patch.id for step in steps],
        written=written,
        outputs={
            "tree": str(tree.root),
            "series": str((out / "series").resolve()),
            "series_files": names,
            "sdist": str(sdist.resolve()),
            "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
            "report": str((out / REPORT_NAME).resolve()),
        },
        seconds=round(time.monotonic() - started, 2),
    )
    (out / REPORT_NAME).write_text(dump_json(document) + "\n")
    if output_format == "json":
        click.echo(dump_json(document))
        sys.exit(EXIT_OK)
    applied = ", ".join(document["applied"]) or "none (nothing needed)"
    stdout = stdout_console()
    stdout.print(f"vLLM {release} -> {new_version}; patches applied: {applied}")
    stdout.print(f"  tree     {tree.root}")
    stdout.print(f"  series   {out / 'series'} ({len(names)} patch file(s))")
    stdout.print(f"  tarball  {sdist}")
    stdout.print(f"  report   {out / REPORT_NAME}")
    console.print(f"done in {document['seconds']:.1f} s")
    sys.exit(EXIT_OK)


def _download(release: str) -> Path:
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    from .releases import download_release, find_release

    with Progress(
        *Progress.get_default_columns(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=stderr_console(),
        transient=True,
    ) as progress:
        task = progress.add_task(f"vllm-{release}.tar.gz", total=None)
        return download_release(
            find_release(release),
            lambda done, total: progress.update(task, completed=done, total=total),
        )


# --- matrix ------------------------------------------------------------------


@main.command()
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

    Each release is fetched (cached), extracted to a temporary folder and
    checked in its own process. Prints a release x patch table; a cell that
    differs from targets.toml shows both states.

    \b
    Exit codes: 0 every state is what targets.toml expects (and, with
    --verify, every verify passed); 1 some state differs or a verify failed;
    2 an error (a release could not be fetched or read).
    """
    from .matrix import (
        DEFAULT_INSTALL,
        differences,
        emit_pipeline,
        matrix_json,
        read_releases,
        verify_available,
    )
    from .patches import SERIES
    from .plan import select_patches
    from .targets import default_targets_path, load_targets

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
        click.echo(
            json.dumps(matrix_json(results, diffs, str(targets_path), wall), indent=2)
        )
        sys.exit(code)
    _print_matrix(results, diffs, patch_ids, verify, wall, jobs)
    sys.exit(code)


def _run_with_progress(
    releases: list[str], selected: list[str], jobs: int, verify: bool
) -> tuple[list[Any], float]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from .matrix import run_matrix

    started = time.monotonic()
    with Progress(
        TextColumn("matrix"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=stderr_console(),
        transient=True,
    ) as progress:
        task = progress.add_task("", total=len(releases))

        def done(result: Any) -> None:
            status = "error" if result.error else "ok"
            progress.update(task, advance=1, description=f"{result.version} {status}")

        results = run_matrix(releases, selected, jobs, verify, done)
    return results, time.monotonic() - started


def _print_matrix(
    results: list[Any],
    diffs: list[Any],
    patch_ids: list[str],
    verify: bool,
    wall: float,
    jobs: int,
) -> None:
    from rich.table import Table

    from .report import STATE_STYLE

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
    console.print(
        f"{len(results)} release(s) x {len(patch_ids)} patch(es) in {wall:.1f} s "
        f"with {jobs} process(es); "
        + ("all as expected" if not diffs and not errors else "NOT as expected")
    )

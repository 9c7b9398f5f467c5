"""``deepstack-patch verify``: prove the fixes in a tree (see ``verify.py``).

Exit codes (README.md, "Verify"): 0 every selected check passed; 1 a check
failed (a proof, fail-to-pass, a tree test, a patch not applied, or --gpu
without a GPU); 2 a selected patch is drifted, or an error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from deepstack_patch.cli.common import (
    EXIT_ERROR,
    format_option,
    select_options,
    stderr_console,
    stdout_console,
    tree_options,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.tree import VllmTree

EXIT_FAILED = 1


@click.command("verify")
@tree_options
@select_options
@click.option(
    "--against-pristine",
    is_flag=True,
    help="Also run the proofs on the unpatched release of the tree's version "
    "(fetched from the package index and cached): each needed fix must fail "
    "there and pass here.",
)
@click.option(
    "--pristine",
    "pristine_path",
    type=click.Path(path_type=Path, file_okay=False),
    help="With --against-pristine: the unpatched tree to compare with, for a "
    "checkout whose version is not a release on the index.",
)
@click.option(
    "--gpu",
    is_flag=True,
    help="Also run the patches' gpu_tests with the official vllm==VERSION "
    "wheel's compiled extensions under this tree's Python sources; without a "
    "GPU they are reported skipped and the exit code is 1.",
)
@click.option(
    "--python",
    "python",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Run proofs and tests with this interpreter (it needs "
    "`pip install 'deepstack-patch[verify]'`) instead of the environment "
    "verify builds and caches.",
)
@click.option(
    "--junit-xml",
    "junit_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write every check as JUnit XML to this file.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 16),
    default=2,
    show_default=True,
    help="Subprocesses run at once (proofs, pristine proofs, tree tests).",
)
@format_option
def verify(
    tree: VllmTree,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    against_pristine: bool,
    pristine_path: Path | None,
    gpu: bool,
    python: Path | None,
    junit_path: Path | None,
    jobs: int,
    output_format: str,
) -> None:
    """Prove the fixes in a tree: each patch's proof and the tree's own tests.

    Each applicable patch's proof runs the tree's own code with torch on the
    CPU and must pass; the tree's tests listed for the patch in targets.toml
    run with pytest. Proofs and tests run in an environment verify builds
    once in the user cache (about 1.3 GB; torch CPU and vLLM's minimal
    dependencies) and reuses.

    \b
    Typical use:
      deepstack-patch apply  --release 0.20.2
      deepstack-patch verify --release 0.20.2 --against-pristine

    \b
    Exit codes: 0 every selected check passed; 1 a check failed; 2 a selected
    patch is drifted, or an error.
    """
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.engine.targets import load_targets
    from deepstack_patch.output.report import dump_json
    from deepstack_patch.patches import SERIES
    from deepstack_patch.proof.envs import CPU_REQUIREMENTS, check_python, ensure_env
    from deepstack_patch.proof.verify import junit_xml, report_json, verify_tree

    err = stderr_console()
    selected = select_patches(SERIES, only, skip)
    if pristine_path is not None and not against_pristine:
        raise DeepstackError(
            "--pristine goes with --against-pristine", "add --against-pristine"
        )
    pristine = _pristine_tree(tree, pristine_path) if against_pristine else None

    def say(line: str) -> None:
        err.print(f"[dim]{line}[/]", markup=True, highlight=False)

    if python is not None:
        env = check_python(python)
    else:
        with err.status("preparing the proof environment") as status:

            def building(line: str) -> None:
                status.update(f"proof environment: {line[:100]}")
                if not err.is_terminal:
                    say(line)

            env = ensure_env("cpu", CPU_REQUIREMENTS, building)
        say(
            f"proof environment: {env.root}" + (" (built now)" if env.built_now else "")
        )

    with err.status(f"verifying {tree.root} (importing vLLM takes a while)"):
        report = verify_tree(
            tree,
            SERIES,
            selected,
            env,
            load_targets(),
            pristine=pristine,
            gpu=gpu,
            jobs=jobs,
            progress=say,
        )
    if junit_path is not None:
        junit_path.write_text(junit_xml(report))
    code = EXIT_ERROR if report.drifted else 0 if report.ok else EXIT_FAILED
    if output_format == "json":
        click.echo(dump_json(report_json(report)))
    else:
        _print_report(report)
    sys.exit(code)


def _pristine_tree(tree: VllmTree, path: Path | None) -> VllmTree:
    """The unpatched tree: given, or the cached release of the tree's version."""
    if path is not None:
        return VllmTree.open(path)
    if tree.version_source not in ("PKG-INFO", "vllm/_version.py") or (
        "dev" in tree.version or "+" in tree.version
    ):
        raise DeepstackError(
            f"{tree.root} is vLLM {tree.version} (from {tree.version_source}), not "
            "a release on the package index, so there is no pristine copy to fetch",
            "give the unpatched tree with --pristine PATH (e.g. a `git worktree "
            "add` of the commit before your backports)",
        )
    from deepstack_patch.cli import fetch_with_progress
    from deepstack_patch.engine.cache import cache_dir

    # A cache folder only verify writes: it is never patched.
    out = cache_dir() / "pristine" / f"vllm-{tree.version}"
    return fetch_with_progress(tree.version, out)


def _print_report(report: object) -> None:
    from deepstack_patch.output.report import print_tree_header
    from deepstack_patch.proof.verify import VerifyReport
    from rich.table import Table

    assert isinstance(report, VerifyReport)
    console = stdout_console()
    print_tree_header(console, report.tree)
    if report.pristine is not None:
        console.print(f"pristine: {report.pristine.root}")
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("patch")
    table.add_column("state")
    table.add_column("proof")
    if report.pristine is not None:
        table.add_column("pristine")
        table.add_column("fail-to-pass")
    table.add_column("tree tests")
    table.add_column("verdict")
    for verdict in report.verdicts:
        proof = verdict.proof.status if verdict.proof else "-"
        passed = sum(t.outcome == "passed" for t in verdict.tests)
        skipped = sum(t.outcome == "skipped" for t in verdict.tests)
        tests = f"{passed}/{len(verdict.tests)} passed" if verdict.tests else "-"
        if skipped:
            tests += f", {skipped} skipped"
        cells = [verdict.patch.id, verdict.state.value, _style(proof)]
        if report.pristine is not None:
            before = verdict.pristine_proof.status if verdict.pristine_proof else "-"
            cells += [_style(before, failed_ok=True), verdict.fail_to_pass or "-"]
        problems = verdict.problems
        verdict_cell = (
            "[red]" + "; ".join(problems) + "[/]"
            if problems
            else "[dim]not applicable[/]"
            if verdict.state.value == "not-applicable"
            else "[green]ok[/]"
        )
        table.add_row(*cells, tests, verdict_cell)
    console.print(table)
    for verdict in report.verdicts:
        for label, proof in (
            ("proof", verdict.proof),
            ("pristine", verdict.pristine_proof),
        ):
            if proof and proof.status != "passed" and proof.message:
                console.print(f"[bold]{verdict.patch.id} {label}:[/] {proof.message}")
    run = report.cpu_tests
    if run.selected or run.absent:
        console.print(
            f"tree tests: {len(run.cases)} run, {run.count('passed')} passed, "
            f"{run.count('failed')} failed, {run.count('error')} errors, "
            f"{run.count('skipped')} skipped ({run.seconds} s)"
        )
        for nodeid in run.absent:
            console.print(f"  not run: {nodeid}")
        for case in run.cases:
            if case.outcome in ("failed", "error"):
                console.print(f"  [red]{case.outcome}[/] {case.nodeid}: {case.message}")
        if run.error:
            console.print(f"[red]pytest:[/] {run.error}")
    if report.gpu.requested:
        gpu_run = report.gpu.run
        if report.gpu.status == "ran" and gpu_run is not None:
            console.print(
                f"GPU tests ({report.gpu.reason}): {len(gpu_run.cases)} run, "
                f"{gpu_run.count('passed')} passed, {gpu_run.count('skipped')} skipped"
            )
        else:
            console.print(f"[yellow]GPU tests skipped:[/] {report.gpu.reason}")
    verdict_text = "[green]verified[/]" if report.ok else "[red]not verified[/]"
    console.print(f"{verdict_text} in {report.seconds} s")


def _style(status: str, failed_ok: bool = False) -> str:
    if status == "passed":
        return f"[green]{status}[/]"
    if status == "failed" and failed_ok:
        return f"[yellow]{status}[/]"
    return status if status == "-" else f"[red]{status}[/]"

"""``deepstack-patch verify``: prove the fixes in a tree (see ``proof/verify.py``).

Exit codes (docs/verify.md, "Exit codes and output"): 0 every selected check
passed; 1 a check failed (a proof, fail-to-pass, a tree test, a patch not
applied, or --gpu without a GPU); 2 a selected patch is drifted, or an error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from deepstack_patch.cli.common import (
    format_option,
    python_option,
    stderr_console,
    stdout_console,
    tree_options,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
    select_options,
)
from deepstack_patch.engine.installed import InstalledTree
from deepstack_patch.engine.tree import VllmTree


@click.command("verify")
@patches_option
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
    "GPU they are reported skipped and the exit code is 1. With --installed: "
    "the release's gpu_tests in the installed vLLM's interpreter.",
)
@python_option(
    "Run proofs and tests with this interpreter (it needs "
    "`pip install 'deepstack-patch[verify]'`) instead of the environment "
    "verify builds and caches. With --installed: the interpreter that runs "
    "vLLM (default: the one running deepstack-patch); its vLLM is verified "
    "in it, with the release's tests.",
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
    default=3,
    show_default=True,
    help="Subprocesses run at once (proofs, pristine proofs, tree tests): "
    "each is mostly one core importing vLLM, so all three at once finish first "
    "even on 2 cores.",
)
@click.option(
    "--test-budget",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="With --against-pristine: the seconds each patch's release tests "
    "(the tests of tests/ that reach the units it changes) may take on each "
    "tree (default: 120); the tests not run by then are reported as could "
    "not run. 0 runs none of them.",
)
@click.option(
    "--gpu-evidence",
    is_flag=True,
    help="Instead of the proofs, measure each fix's symptom (timings, "
    "compilations, errors) on the pristine tree and on this one, with the "
    "trees' own code; needs --against-pristine. Without a GPU, --device cuda "
    "is skipped (exit 0).",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    default="cuda",
    show_default=True,
    help="With --gpu-evidence: where to measure (cpu: the same measurements, "
    "labelled CPU).",
)
@click.option(
    "--evidence-out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="With --gpu-evidence: write evidence.json and evidence.md to this "
    "folder (--out is --release's extraction folder).",
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
    test_budget: float | None,
    gpu_evidence: bool,
    device: str,
    out_dir: Path | None,
    output_format: str,
) -> None:
    """Prove the fixes in a tree: each patch's proof and the tree's own tests.

    Each applicable patch's proof runs the tree's own code with torch on the
    CPU and must pass; the tree's tests listed for the patch in targets.toml
    run with pytest. Proofs and tests run in an environment verify builds
    once in the user cache (about 2.3 GB; torch CPU and vLLM's minimal
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
    from deepstack_patch.proof.verify import pristine_for
    from deepstack_patch.proof.verify import verify as verify_plumbing

    err = stderr_console()
    series = load_series()
    selected = select_patches(series, only, skip)
    pristine = pristine_for(tree, against_pristine, pristine_path, err.print)
    if gpu_evidence:
        _gpu_evidence(tree, series, selected, pristine, device, python, out_dir,
                      output_format)  # fmt: skip

    def say(line: str) -> None:
        err.print(f"[dim]{line}[/]", markup=True, highlight=False)

    working = f"verifying {tree.root} (importing vLLM takes a while)"
    # An installed vLLM runs in its own interpreter: nothing to prepare.
    ready = python is not None or isinstance(tree, InstalledTree)
    with err.status(working if ready else "preparing the proof environment") as status:

        def building(line: str) -> None:
            status.update(f"proof environment: {line[:100]}")
            if not err.is_terminal:
                say(line)

        report = verify_plumbing(
            tree,
            series,
            selected,
            load_targets(),
            pristine=pristine,
            python=python,
            gpu=gpu,
            jobs=jobs,
            **({"test_budget": test_budget} if test_budget is not None else {}),
            progress=lambda line: _progress(status, say, working, line),
            building=building,
        )
    _write_report(report, junit_path, output_format)
    sys.exit(report.exit_code)


def _gpu_evidence(
    tree: VllmTree,
    series: Any,
    selected: set[str],
    pristine: VllmTree | None,
    device: str,
    python: Path | None,
    out_dir: Path | None,
    output_format: str,
) -> None:
    """``--gpu-evidence``: measure, write DIR/evidence.{json,md}, print, exit."""
    from deepstack_patch.output.documents import dump_json
    from deepstack_patch.output.evidence import evidence_json, evidence_markdown
    from deepstack_patch.proof.evidence import gpu_evidence

    err = stderr_console()
    with err.status(f"measuring on {device} (Inductor compiles take a while)"):
        report = gpu_evidence(
            tree, series, selected, pristine=pristine, device=device,
            python=python, progress=lambda line: err.print(line, highlight=False),
        )  # fmt: skip
    document, table = dump_json(evidence_json(report)), evidence_markdown(report)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "evidence.json").write_text(document + "\n")
        (out_dir / "evidence.md").write_text(table)
    if report.status == "skipped":
        err.print(f"skipped: no GPU ({report.reason})", highlight=False)
    click.echo(document if output_format == "json" else table)
    sys.exit(report.exit_code)


def _progress(status: Any, say: Any, working: str, line: str) -> None:
    say(line)
    if line.startswith("proof environment:"):  # built or found: verify starts
        status.update(working)


def _write_report(report: Any, junit_path: Path | None, output_format: str) -> None:
    from deepstack_patch.output.documents import dump_json, verify_json
    from deepstack_patch.output.junit import junit_xml
    from deepstack_patch.output.tables import print_verify_report

    if junit_path is not None:
        junit_path.write_text(junit_xml(report))
    if output_format == "json":
        click.echo(dump_json(verify_json(report)))
    else:
        print_verify_report(stdout_console(), report)

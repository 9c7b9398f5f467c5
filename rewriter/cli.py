"""The ``deepstack-patch`` command line.

Exit codes are a contract (README.md, "Exit codes"):
0 success / nothing needed, 1 ``apply --check`` found needed patches,
2 drifted targets or an error (nothing written).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from . import __version__
from .errors import DeepstackError
from .protocol import PatchState
from .tree import VllmTree

EXIT_OK = 0
EXIT_NEEDED = 1
EXIT_ERROR = 2


def stdout_console() -> Console:
    # Logs and pipes get long lines rather than tables wrapped at 80 columns.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


class DeepstackGroup(click.Group):
    """Turns a :class:`DeepstackError` into ``error: ...`` and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DeepstackError as exc:
            console = stderr_console()
            console.print(
                f"[bold red]error:[/] {escape(exc.message)}",
                markup=True,
                highlight=False,
            )
            if exc.hint:
                # Escaped: hints quote things like 'deepstack-patch[verify]'.
                console.print(f"[bold]hint:[/] {escape(exc.hint)}")
            sys.exit(EXIT_ERROR)


@click.group(
    cls=DeepstackGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="deepstack-patch")
def main() -> None:
    """Bring curated upstream vLLM fixes into a pinned vLLM source tree.

    Every patch recognises its target by structure and reports one of four
    states: needed, applied, not-applicable or drifted. Only recognised code
    is rewritten; a drifted target stops the run before anything is written.

    \b
    Typical use, in a vLLM checkout:
      deepstack-patch status --vllm-src .
      deepstack-patch apply --vllm-src .
    Or on a release fetched from the package index:
      deepstack-patch apply --release 0.20.2
    """


def tree_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--vllm-src PATH`` or ``--release VERSION [--out DIR]``, opened as a tree."""

    @click.option(
        "--vllm-src",
        "vllm_src",
        type=click.Path(path_type=Path),
        help="Root of a vLLM source tree (the folder that holds vllm/__init__.py).",
    )
    @click.option(
        "--release",
        metavar="VERSION",
        help="Fetch this vLLM release's source from the package index pip is "
        "configured for (PIP_INDEX_URL, pip.conf), verify its sha256, and work "
        "on an extraction of it.",
    )
    @click.option(
        "--out",
        type=click.Path(path_type=Path, file_okay=False),
        help="With --release: where to extract (default ./vllm-VERSION). An "
        "earlier extraction of the same release is reused.",
    )
    @functools.wraps(command)
    def wrapper(
        vllm_src: Path | None, release: str | None, out: Path | None, **kwargs: Any
    ) -> Any:
        return command(tree=open_tree(vllm_src, release, out), **kwargs)

    return wrapper


def open_tree(vllm_src: Path | None, release: str | None, out: Path | None) -> VllmTree:
    if (vllm_src is None) == (release is None):
        raise DeepstackError(
            "give exactly one of --vllm-src PATH and --release VERSION",
            "e.g. --vllm-src . in a vLLM checkout, or --release 0.20.2",
        )
    if vllm_src is not None:
        if out is not None:
            raise DeepstackError("--out goes with --release, not with --vllm-src")
        return VllmTree.open(vllm_src)
    return fetch_with_progress(release, out or Path(f"vllm-{release}"))


def fetch_with_progress(version: str, out: Path) -> VllmTree:
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    from .releases import fetch_release

    console = stderr_console()
    with Progress(
        *Progress.get_default_columns(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"vllm-{version}.tar.gz", total=None)

        def advance(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        tree = fetch_release(version, out, advance)
    console.print(f"vLLM {version} source at {tree.root}")
    return tree


def select_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--skip", multiple=True, metavar="ID", help="Leave this patch out (repeatable)."
    )(command)
    return click.option(
        "--only", multiple=True, metavar="ID", help="Only this patch (repeatable)."
    )(command)


format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text for people; json for pipelines (schema in README.md).",
)


@main.command("list")
@format_option
def list_command(output_format: str) -> None:
    """List the patch series in the order it is applied, with metadata."""
    from .patches import SERIES
    from .report import dump_json, metadata_json

    if output_format == "json":
        click.echo(
            dump_json({"schema": 1, "patches": [metadata_json(p) for p in SERIES]})
        )
        return
    console = stdout_console()
    for patch in SERIES:
        console.print(f"[bold]{patch.id}[/]  {patch.title}")
        console.print(
            f"  upstream: {patch.upstream_url} (first in vLLM {patch.fixed_in})"
        )
        console.print(f"  symptom:  {patch.symptom}")
        console.print(f"  changes:  {patch.also_changes}")
        if patch.requires:
            console.print(f"  requires: {', '.join(patch.requires)}")
        if patch.supersedes:
            console.print(f"  supersedes: {', '.join(patch.supersedes)}")
        console.print(f"  where:    {', '.join(patch.paths)}")


@main.command()
@tree_options
@select_options
@format_option
def status(
    tree: VllmTree, only: tuple[str, ...], skip: tuple[str, ...], output_format: str
) -> None:
    """Show the state of every patch in a tree, with file:line locations.

    \b
    Exit codes: 0 states computed, none drifted; 2 a selected patch is drifted,
    or an error. (Use `apply --check` to fail a pipeline on needed patches.)
    """
    from .patches import SERIES
    from .plan import plan_tree, select_patches
    from .report import dump_json, plan_json, print_plan_table, print_tree_header

    plan = plan_tree(tree, SERIES, select_patches(SERIES, only, skip), rewrite=False)
    if output_format == "json":
        click.echo(dump_json(plan_json(plan, "status")))
    else:
        console = stdout_console()
        print_tree_header(console, tree)
        print_plan_table(console, plan)
    sys.exit(EXIT_ERROR if _selected_drifted(plan) else EXIT_OK)


@main.command()
@tree_options
@select_options
@click.option("--dry-run", is_flag=True, help="Print the unified diff; write nothing.")
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 0 if nothing is needed, 1 if patches are needed, "
    "2 on drifted targets or errors (like `ruff format --check`).",
)
@click.option(
    "--commit",
    is_flag=True,
    help="In a git checkout: one commit per applied patch, in series order, "
    "with Backport-of and Upstream-release trailers. Refuses a dirty work tree.",
)
@click.option(
    "--allow-dirty",
    is_flag=True,
    help="With --commit: accept uncommitted changes to other files (they are "
    "never committed).",
)
@format_option
def apply(
    tree: VllmTree,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    dry_run: bool,
    check: bool,
    commit: bool,
    allow_dirty: bool,
    output_format: str,
) -> None:
    """Apply every needed patch to a tree, all files or none.

    Each file's bytes are kept except the intended edit (encoding, newlines,
    mode, untouched lines). A second run changes nothing. If any selected
    patch is drifted (its target exists but has a shape it does not
    recognise), nothing is written and the exit code is 2.

    \b
    Exit codes: 0 applied, or nothing to do; 1 with --check: patches needed;
    2 drifted targets or an error, nothing written.
    """
    from .patches import SERIES
    from .plan import plan_tree, select_patches
    from .report import (
        dump_json,
        plan_json,
        print_plan_table,
        print_tree_header,
        unified_diff,
    )
    from .transaction import tree_lock, write_edits

    selected = select_patches(SERIES, only, skip)
    if commit or allow_dirty:
        from .vendor_commands import apply_with_commits

        if not commit or dry_run or check:
            raise DeepstackError(
                "--allow-dirty needs --commit, and --commit writes: it cannot go "
                "with --dry-run or --check",
                "drop --dry-run/--check, or add --commit to --allow-dirty",
            )
        sys.exit(apply_with_commits(tree, selected, allow_dirty, output_format))
    console = stdout_console()
    writes = not (dry_run or check)
    with tree_lock(tree.root) if writes else contextlib.nullcontext():
        plan = plan_tree(tree, SERIES, selected, rewrite=not check)
        drifted = _selected_drifted(plan)
        written: list[str] = []
        if writes and not drifted:
            written = write_edits(tree.root, plan.edits)

    if check:
        code = EXIT_ERROR if drifted else EXIT_NEEDED if plan.needed else EXIT_OK
    else:
        code = EXIT_ERROR if drifted else EXIT_OK
    if output_format == "json":
        extra: dict[str, Any] = {"dry_run": dry_run, "check": check, "written": written}
        if dry_run:
            extra["diff"] = unified_diff(plan.edits)
        click.echo(dump_json(plan_json(plan, "apply", **extra)))
        sys.exit(code)

    if dry_run and not drifted:
        sys.stdout.write(unified_diff(plan.edits))
        sys.exit(code)
    print_tree_header(console, tree)
    print_plan_table(console, plan)
    if drifted:
        names = ", ".join(r.patch.id for r in drifted)
        console.print(
            f"[bold red]refused:[/] {names} drifted: the target code has a shape "
            "this tool does not recognise, so nothing was written. Each location "
            "above says what was expected; use --skip ID to apply the others."
        )
    elif check:
        needed = ", ".join(r.patch.id for r in plan.needed)
        console.print(f"needed: {needed}" if needed else "nothing needed")
    elif written:
        ids = ", ".join(r.patch.id for r in plan.needed)
        console.print(f"[green]applied[/] {ids}; wrote {len(written)} file(s):")
        for relpath in written:
            console.print(f"  {relpath}")
    else:
        console.print(
            "nothing to do: every selected patch is applied or not applicable"
        )
    sys.exit(code)


def _selected_drifted(plan: Any) -> list[Any]:
    return [r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED]


# Commands in their own modules register themselves on `main`.
from . import vendor_commands, verify_command  # noqa: E402,F401

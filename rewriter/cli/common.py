"""What every command shares: exit codes, consoles, tree and selection options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from deepstack_patch.engine.errors import DeepstackError

# Imported where used: `--version`, `--help` and `list` start without rich or
# the engine (the command line's import stays within 60 ms).
if TYPE_CHECKING:
    from deepstack_patch.engine.plan import Plan
    from deepstack_patch.engine.tree import VllmTree
    from rich.console import Console

EXIT_OK = 0
EXIT_NEEDED = 1
EXIT_ERROR = 2


def stdout_console() -> Console:
    from rich.console import Console

    # Logs and pipes get long lines rather than tables wrapped at 80 columns.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


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
    from deepstack_patch.engine.tree import VllmTree

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
    from deepstack_patch.fetch.releases import fetch_release
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

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


def selected_drifted(plan: Plan) -> list[Any]:
    from deepstack_patch.engine.protocol import PatchState

    return [r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED]


def _drifted(plan: Plan) -> list[Any]:
    from deepstack_patch.engine.protocol import PatchState

    return [r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED]


def refuse_drifted(plan: Plan, output_format: str, command: str) -> None:
    """Print the plan and the refusal, then exit 2 (nothing was written)."""
    from deepstack_patch.output.report import (
        dump_json,
        plan_json,
        print_plan_table,
        print_tree_header,
    )

    if output_format == "json":
        click.echo(dump_json(plan_json(plan, command, written=[])))
    else:
        console = stdout_console()
        print_tree_header(console, plan.tree)
        print_plan_table(console, plan)
        names = ", ".join(r.patch.id for r in selected_drifted(plan))
        console.print(
            f"[bold red]refused:[/] {names} drifted: the target code has a shape "
            "this tool does not recognise, so nothing was written. Each location "
            "above says what was expected; use --skip ID to leave a patch out."
        )
    sys.exit(EXIT_ERROR)

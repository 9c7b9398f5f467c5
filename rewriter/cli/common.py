"""What every command shares: exit codes, consoles, tree and selection options."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import Plan
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import VllmTree
from rich.console import Console

EXIT_OK = 0
EXIT_NEEDED = 1
EXIT_ERROR = 2


def stdout_console() -> Console:
    # Logs and pipes get long lines rather than tables wrapped at 80 columns.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def tree_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--vllm-src PATH``, ``--release VERSION [--out DIR]`` or
    ``--installed [--python PY]``, opened as a tree."""
    # A command with its own --python (verify: the interpreter to run in)
    # shares it: with --installed it is also the one whose vLLM is used.
    own_python = "python" in inspect.signature(command).parameters

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
    @installed_options(python=not own_python)
    @functools.wraps(command)
    def wrapper(
        vllm_src: Path | None,
        release: str | None,
        out: Path | None,
        installed: bool,
        **kwargs: Any,
    ) -> Any:
        python = kwargs.get("python") if own_python else kwargs.pop("python")
        if python is not None and not installed and not own_python:
            raise DeepstackError(
                "--python goes with --installed", "add --installed, or drop --python"
            )
        tree = open_tree(vllm_src, release, out, installed, python)
        return command(tree=tree, **kwargs)

    return wrapper


def installed_options(
    python: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--installed [--python PY]`` (``python=False``: the command has its own)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        if python:
            command = click.option(
                "--python",
                type=click.Path(path_type=Path, dir_okay=False),
                help="With --installed: the interpreter that runs vLLM (default: "
                "the one running deepstack-patch).",
            )(command)
        return click.option(
            "--installed",
            is_flag=True,
            help="Work on the vLLM an interpreter imports, in its site-packages: "
            "RECORD, bytecode and a change record follow every rewrite.",
        )(command)

    return decorate


def open_tree(
    vllm_src: Path | None,
    release: str | None,
    out: Path | None,
    installed: bool = False,
    python: Path | None = None,
) -> VllmTree:
    if [vllm_src is not None, release is not None, installed].count(True) != 1:
        raise DeepstackError(
            "give exactly one of --vllm-src PATH, --release VERSION and --installed",
            "e.g. --vllm-src . in a vLLM checkout, --release 0.20.2, or "
            "--installed for the vLLM this Python imports",
        )
    if out is not None and release is None:
        raise DeepstackError("--out goes with --release, not with --vllm-src")
    if installed:
        return open_installed_tree(python)
    if vllm_src is not None:
        return open_source_folder(vllm_src)
    return fetch_with_progress(release, out or Path(f"vllm-{release}"))


def open_installed_tree(python: Path | None) -> VllmTree:
    """The vLLM ``python`` imports; an editable install is its checkout."""
    from deepstack_patch.engine.installed import find_installed, open_installed

    found = find_installed(python)
    # One unwrapped line on stderr: a log keeps the paths whole.
    if found.editable:
        click.echo(
            f"vllm {found.version} is an editable install of {found.source_root}: "
            "working on that checkout as a source tree",
            err=True,
        )
    else:
        click.echo(
            f"vLLM {found.version} installed in {found.site_packages} "
            f"(python {found.python})",
            err=True,
        )
    return open_installed(found)


def open_source_folder(vllm_src: Path) -> VllmTree:
    """A source tree, or a site-packages folder (a vllm-*.dist-info beside vllm/)."""
    from deepstack_patch.engine.installed import (
        dist_info_beside,
        installed_in_folder,
        open_installed,
    )

    tree = VllmTree.open(vllm_src)
    dist_info = dist_info_beside(tree.root)
    if dist_info is None:
        return tree
    found = installed_in_folder(tree.root, dist_info)
    click.echo(
        f"vLLM {found.version} installed in {found.site_packages} ({dist_info.name}): "
        "working on it as an installed distribution",
        err=True,
    )
    return open_installed(found)


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
    return [r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED]


def _drifted(plan: Plan) -> list[Any]:
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

"""What every command shares: exit codes, consoles, tree and selection options."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
from deepstack_patch.engine.errors import (
    DeepstackError,
    os_error_hint,
    writable_folder_of,
)
from deepstack_patch.engine.plan import Plan
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.tree import VllmTree
from rich.console import Console

EXIT_OK = 0
EXIT_NEEDED = 1
EXIT_ERROR = 2


EXIT_INTERRUPTED = 130


def stdout_console() -> Console:
    """Rich text on a terminal; unwrapped, unpadded lines in a pipe or a log."""
    from deepstack_patch.output.progress import console_for

    return console_for(sys.stdout)


def stderr_console() -> Console:
    from deepstack_patch.output.progress import console_for

    return console_for(sys.stderr)


def interrupted() -> NoReturn:
    """Ctrl-C: one line, and 130 (never 1, which means "needed" or "differs")."""
    sys.stderr.write("interrupted\n")
    sys.exit(EXIT_INTERRUPTED)


def invoked_command(words: Sequence[str]) -> str:
    from deepstack_patch.cli import COMMANDS

    return next((word for word in words if word in COMMANDS), "")


def os_error(exc: OSError) -> DeepstackError:
    """A file-system error no code path expected, with the folder to fix."""
    path = Path(exc.filename).absolute() if exc.filename else Path.cwd()
    return DeepstackError(
        f"{exc.strerror or exc}: {path}",
        os_error_hint(exc, writable_folder_of(path.parent)),
        path=None,
    )


def report_error(exc: DeepstackError, words: Sequence[str]) -> NoReturn:
    """``error:`` and ``hint:`` on stderr (and JSON on stdout with --format json)."""
    from rich.markup import escape

    if wants_json(words):
        document = {
            "schema": 1,
            "command": invoked_command(words),
            "error": {
                "message": exc.message,
                "path": exc.path,
                "line": exc.line,
                "hint": exc.hint,
            },
        }
        click.echo(json.dumps(document, indent=2))
    console = stderr_console()
    console.print(f"[bold red]error:[/] {escape(exc.located)}")
    if exc.hint:
        # Escaped: hints quote things like 'deepstack-patch[verify]'.
        console.print(f"[bold]hint:[/] {escape(exc.hint)}")
    sys.exit(EXIT_ERROR)


def wants_json(words: Sequence[str]) -> bool:
    pairs = zip(words, words[1:])  # noqa: B905 - one shorter by design
    return "--format=json" in words or ("--format", "json") in pairs


def warn(text: str) -> None:
    from rich.markup import escape

    stderr_console().print(f"[yellow]warning:[/] {escape(text)}")


def tree_options(
    command: Callable[..., Any], *, read_only: bool = False
) -> Callable[..., Any]:
    """``--vllm-src PATH`` or ``--release VERSION [--out DIR]``, opened as a tree.

    ``read_only`` commands (status) read a release from a cached partial
    extraction unless ``--out`` (or an earlier extraction) says where.
    """

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
        "earlier extraction of the same release is reused."
        + (
            " Without it, status reads only the patches' files, extracted once "
            "into the cache."
            if read_only
            else ""
        ),
    )
    @functools.wraps(command)
    def wrapper(
        vllm_src: Path | None, release: str | None, out: Path | None, **kwargs: Any
    ) -> Any:
        return command(tree=open_tree(vllm_src, release, out, read_only), **kwargs)

    return wrapper


def read_tree_options(command: Callable[..., Any]) -> Callable[..., Any]:
    return tree_options(command, read_only=True)


def open_tree(
    vllm_src: Path | None,
    release: str | None,
    out: Path | None,
    read_only: bool = False,
) -> VllmTree:
    if (vllm_src is None) == (release is None):
        raise DeepstackError(
            "give exactly one of --vllm-src PATH and --release VERSION",
            "e.g. --vllm-src . in a vLLM checkout, or --release 0.20.2",
        )
    if vllm_src is not None:
        if out is not None:
            raise DeepstackError("--out goes with --release, not with --vllm-src")
        return VllmTree.open(vllm_src)
    default = Path(f"vllm-{release}")
    if read_only and out is None and not default.exists():
        return partial_release(release)
    return fetch_with_progress(release, out or default)


def partial_release(version: str) -> VllmTree:
    """What status reads of a release, extracted once into the cache."""
    from deepstack_patch.fetch.releases import release_archive
    from deepstack_patch.output.progress import note, progress
    from deepstack_patch.patches import SERIES
    from deepstack_patch.vendor.matrix import status_tree

    with progress(f"downloading vllm-{version}.tar.gz") as update:
        archive = release_archive(version, update, note)
    tree = status_tree(archive, version, [p for patch in SERIES for p in patch.paths])
    note(
        f"reading the patches' files of vLLM {version} from {tree.root} (a "
        "partial extraction in the cache; --out DIR extracts the whole tree)"
    )
    return tree


def fetch_with_progress(version: str, out: Path) -> VllmTree:
    """Fetch and extract a release into ``out``, serialised per ``out``.

    The extraction lock is held until the command ends, so two runs into one
    folder take turns: the second reuses the first's tree and sees its work.
    """
    from deepstack_patch.fetch.archives import extraction_lock, make_folder
    from deepstack_patch.fetch.releases import fetch_release
    from deepstack_patch.output.progress import note, progress

    make_folder(out.absolute().parent, "the output folder's parent")
    lock = extraction_lock(out, on_wait=note)
    click.get_current_context().with_resource(lock)
    with progress(f"downloading vllm-{version}.tar.gz") as update:
        tree = fetch_release(version, out, update, note)
    note(f"vLLM {version} source at {tree.root}")
    return tree


def load_series() -> Sequence[Patch]:
    """The patch series. The one place the command line imports the patches;
    every layer below gets the series as an argument."""
    from deepstack_patch.patches import SERIES

    return SERIES


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


def warn_hard_links(links: dict[str, int]) -> None:
    """A rewrite replaces a file: its other hard-linked names keep the old bytes."""
    for relpath, others in links.items():
        warn(
            f"{relpath} has {others} other hard link(s); they keep the old "
            "content (the rewrite replaces this name's file)"
        )


def selected_drifted(plan: Plan) -> list[Any]:
    return [r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED]


def refuse_drifted(plan: Plan, output_format: str, command: str) -> int:
    """Print the plan and the refusal; return exit code 2 (nothing was written)."""
    from deepstack_patch.output.documents import dump_json, plan_json
    from deepstack_patch.output.tables import print_plan_table, print_tree_header

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
    return EXIT_ERROR

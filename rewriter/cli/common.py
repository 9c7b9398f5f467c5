"""What every command shares: exit codes, consoles, tree and selection options."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from deepstack_patch.engine.errors import (
    DeepstackError,
    os_error_hint,
    writable_folder_of,
)
from deepstack_patch.output.progress import warn

# Imported where used: `--version`, `--help` and `list` start without rich or
# the engine (the command line's import stays within 60 ms).
if TYPE_CHECKING:
    from deepstack_patch.engine.plan import Plan
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
    """Ctrl-C: one line, and 130 (never 1, which means "needed" or "differs").

    deepstack_patch.entry says the same for a Ctrl-C before this module loads.
    """
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
    if wants_json(words):
        import json  # only here: the command line's import stays light

        from deepstack_patch.output.documents import error_json

        document = {
            "schema": 1,
            "command": invoked_command(words),
            "error": error_json(exc),
        }
        click.echo(json.dumps(document, indent=2))
    print_error(exc)
    sys.exit(EXIT_ERROR)


def print_error(exc: DeepstackError) -> None:
    """``error:`` and ``hint:`` on stderr, for a command that also has a
    document of its own to print (doctor's diagnosis)."""
    from deepstack_patch.output.plain import escape

    console = stderr_console()
    console.print(f"[bold red]error:[/] {escape(exc.located)}")
    if exc.hint:
        # Escaped: hints quote things like 'deepstack-patch[verify]'.
        console.print(f"[bold]hint:[/] {escape(exc.hint)}")


#: Options a later repetition may override, as ``make -j`` does: a tuning
#: knob, where a wrapper's default followed by the user's choice is common.
LAST_ONE_WINS = frozenset({"jobs"})


def refuse_repeated_options(
    command: click.Command, name: str, parent: click.Context, args: Sequence[str]
) -> None:
    """Refuse a single-valued option given twice, before anything runs.

    click keeps the last value, so ``--vllm-src A --vllm-src B`` would work
    on B without a word: a tree, a release or an output path given twice is
    a mistake in the command line, never a choice.
    """
    single = [
        param
        for param in command.params
        if isinstance(param, click.Option)
        and not (param.multiple or param.count or param.is_flag)
        and param.name not in LAST_ONE_WINS
    ]
    if not single:
        return
    parser = command.make_parser(
        command.context_class(command, info_name=name, parent=parent)
    )
    try:
        _, _, order = parser.parse_args(args=[*args])
    except click.UsageError:
        return  # the command's own parse reports it
    for param in single:
        if order.count(param) > 1:
            flag = param.opts[0]
            values = _values_of(param.opts, args)
            raise DeepstackError(
                f"{flag} given {len(values)} times ({', '.join(values)}): it "
                "takes one value",
                f"give {flag} once; to work on several, run the command once for each",
            )


def _values_of(flags: Sequence[str], args: Sequence[str]) -> list[str]:
    """Every value ``args`` gives one option (``--opt V`` or ``--opt=V``)."""
    values = []
    words = iter(args)
    for word in words:
        if word == "--":
            break
        if word in flags:
            values.append(next(words, ""))
        elif "=" in word and word.partition("=")[0] in flags:
            values.append(word.partition("=")[2])
    return values


def wants_json(words: Sequence[str]) -> bool:
    pairs = zip(words, words[1:])  # noqa: B905 - one shorter by design
    return "--format=json" in words or ("--format", "json") in pairs


#: What ``--out`` is to each command that opens a tree: the extraction it
#: works on, and where its own output goes instead (backport, wheel and
#: derive have an ``--out`` of their own).
OUT_IS = {
    "apply": ("patched", ""),
    "status": ("read", ""),
    "export": ("read", " The series goes to --series."),
    "verify": ("proved", " The GPU evidence goes to --evidence-out."),
}


def tree_options(
    command: Callable[..., Any], *, read_only: bool = False
) -> Callable[..., Any]:
    """``--vllm-src PATH`` or ``--release VERSION [--out DIR]``, opened as a tree.

    ``read_only`` commands (status) read a release as released, from a
    cached partial extraction, unless ``--out`` names a folder to read.
    ``--installed [--python PY]`` is the vLLM an interpreter imports.
    """
    # A command with its own --python (verify: the interpreter to run in)
    # shares it: with --installed it is also the one whose vLLM is used.
    own_python = "python" in inspect.signature(command).parameters
    verb, elsewhere = OUT_IS.get(command.__name__, ("worked on", ""))

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
        help=(
            "With --release: read the release's whole source in this folder "
            "(extracted there if absent; an earlier extraction is read as it "
            "is, patched or not). Without it, status reads the release as "
            "released, whatever folder it runs in: only the patches' files, "
            "extracted once into the cache."
            if read_only
            else "With --release: the folder the release's source is extracted "
            f"into and {verb} there (default ./vllm-VERSION; an earlier "
            f"extraction of the same release is reused).{elsewhere}"
        ),
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
        tree = open_tree(
            vllm_src, release, out, read_only, installed=installed, python=python
        )
        return command(tree=tree, **kwargs)

    return wrapper


def read_tree_options(command: Callable[..., Any]) -> Callable[..., Any]:
    return tree_options(command, read_only=True)


def installed_options(
    python: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--installed [--python PY]`` (``python=False``: the command has its own)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        if python:
            command = python_option(
                "With --installed: the interpreter that runs vLLM (default: "
                "the one running deepstack-patch)."
            )(command)
        return click.option(
            "--installed",
            is_flag=True,
            help="Work on the vLLM an interpreter imports, in its site-packages: "
            "RECORD, bytecode and a change record follow every rewrite.",
        )(command)

    return decorate


def python_option(help_text: str) -> Callable[..., Any]:
    """``--python PY``: an interpreter, relative to the folder the command was
    typed in (its proofs and tests run in other folders)."""
    return click.option(
        "--python",
        "python",
        type=click.Path(path_type=Path, dir_okay=False),
        callback=_from_current_folder,
        help=help_text,
    )


def _from_current_folder(
    context: click.Context, parameter: click.Parameter, path: Path | None
) -> Path | None:
    # Joined, not resolved: a venv's python is a link, and its own path is
    # what tells it which venv it runs in.
    return None if path is None else Path.cwd() / path


def open_tree(
    vllm_src: Path | None,
    release: str | None,
    out: Path | None,
    read_only: bool = False,
    *,
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
        given = "--installed" if installed else "--vllm-src"
        raise DeepstackError(
            f"--out goes with --release, not with {given}",
            f"drop --out: {given} works on that tree where it is (to patch a "
            "copy, copy the tree first), or fetch a release into a folder with "
            "--release VERSION --out DIR",
        )
    if installed:
        return open_installed_tree(python)
    if vllm_src is not None:
        return open_source_folder(vllm_src)
    if read_only and out is None:
        return partial_release(release)
    return fetch_with_progress(release, out or Path(f"vllm-{release}"))


def partial_release(version: str) -> VllmTree:
    """What status reads of a release, extracted once into the cache.

    Never ``./vllm-VERSION``, which ``apply --release`` may have patched: what
    a release needs does not depend on the folder the command runs in. Where
    that folder exists, the note says it was not read, and how to read it.
    """
    from deepstack_patch.cli.series import load_series
    from deepstack_patch.distribution.matrix import status_patterns, status_tree
    from deepstack_patch.fetch.releases import release_archive
    from deepstack_patch.output.progress import note, progress

    with progress(f"downloading vllm-{version}.tar.gz") as update:
        archive = release_archive(version, update, note)
    tree = status_tree(archive, version, status_patterns(load_series()))
    note(
        f"reading the patches' files of vLLM {version} from {tree.root} (a "
        "partial extraction in the cache; --out DIR extracts the whole tree)"
    )
    local = Path(f"vllm-{version}")
    if local.is_dir():
        note(
            f"./{local} is not read: the release is read as released "
            f"(--out {local} reads that folder as it is)"
        )
    return tree


def open_installed_tree(python: Path | None) -> VllmTree:
    """The vLLM ``python`` imports; an editable install is its checkout."""
    from deepstack_patch.engine.installed import find_installed, open_installed

    found = find_installed(python)
    # One unwrapped line on stderr: a log keeps the paths whole. An install
    # itself is named by the command's own header (one line, not two).
    if found.editable:
        click.echo(
            f"vllm {found.version} is an editable install of {found.source_root}: "
            "working on that checkout as a source tree",
            err=True,
        )
    return open_installed(found)


def open_source_folder(vllm_src: Path) -> VllmTree:
    """A source tree, or a site-packages folder (a vllm-*.dist-info beside vllm/)."""
    from deepstack_patch.engine.tree import VllmTree, dist_info_beside

    tree = VllmTree.open(vllm_src)
    dist_info = dist_info_beside(tree.root)
    if dist_info is None:
        return tree
    from deepstack_patch.engine.installed import installed_in_folder, open_installed

    found = installed_in_folder(tree.root, dist_info)
    click.echo(
        f"vLLM {found.version} installed in {found.site_packages} ({dist_info.name}): "
        "working on it as an installed distribution",
        err=True,
    )
    return open_installed(found)


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


format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text for people; json for pipelines (schema in docs/output.md).",
)


def warn_hard_links(links: dict[str, int]) -> None:
    """A rewrite replaces a file: its other hard-linked names keep the old bytes."""
    for relpath, others in links.items():
        warn(
            f"{relpath} has {others} other hard link(s); they keep the old "
            "content (the rewrite replaces this name's file)"
        )


def selected_drifted(plan: Plan) -> list[Any]:
    from deepstack_patch.engine.protocol import PatchState

    return [r for r in plan.reports if r.selected and r.state is PatchState.DRIFTED]


def refuse_drifted(
    plan: Plan,
    output_format: str,
    command: str,
    *,
    table_on_stderr: bool = False,
    **extra: Any,
) -> int:
    """Refuse a run with a drifted selected patch: the plan on stdout (``extra``
    goes into its JSON document, with the ``error`` object every error has),
    ``error:`` and ``hint:`` on stderr; return exit code 2 (nothing written).

    ``table_on_stderr``: the text plan goes to stderr too, where stdout is
    promised to be something else (``apply --dry-run``'s diff: empty here).
    """
    from deepstack_patch.output.documents import dump_json, error_json, plan_json
    from deepstack_patch.output.tables import print_plan_table, print_tree_header

    error = drift_error(plan, command)
    if output_format == "json":
        document = plan_json(plan, command, **{"written": [], **extra})
        document["error"] = error_json(error)
        click.echo(dump_json(document))
    else:
        console = stderr_console() if table_on_stderr else stdout_console()
        print_tree_header(console, plan.tree)
        print_plan_table(console, plan)
    print_error(error)
    return EXIT_ERROR


def drift_error(plan: Plan, command: str = "") -> DeepstackError:
    """The refusal of a plan with drifted selected patches, at the first
    drifted location (the table, or the JSON patches, show every one); the
    hint leaves every one of them out, with what cannot go without them."""
    from deepstack_patch.engine.derived.runtime import RUNTIME
    from deepstack_patch.engine.protocol import PatchState
    from deepstack_patch.engine.requirements import followers_of

    drifted = selected_drifted(plan)
    where = next(
        (
            location
            for report in drifted
            for location in report.locations
            if location.state is PatchState.DRIFTED
        ),
        None,
    )
    names = ", ".join(r.patch.id for r in drifted)
    out = [r.patch.id for r in drifted]
    out += followers_of(plan.reports, out)
    the_patch = "the patch" if len(out) == 1 else "the patches"
    skip = f"{the_patch} out with " + " ".join(f"--skip {i}" for i in out)
    if command == "apply":
        skip += (
            " (or --skip-drifted, which leaves out every drifted patch and "
            "what needs it)"
        )
    place = {
        "path": where.path if where else None,
        "line": where.finding.line or None if where else None,
    }
    if where and RUNTIME in where.finding.details:
        # The shape was recognised; what the fix reads is not there.
        return DeepstackError(
            f"{names} drifted: the fix's code cannot run on this release: "
            f"{where.finding.details[RUNTIME]}; nothing was written",
            # Which change would add it is not known here: none is named.
            "the release lacks what the fix's code reads (above): adapt the "
            f"fix to this release by hand, or leave {skip}",
            **place,
        )
    reason = f" ({where.finding.reason})" if where and where.finding.reason else ""
    return DeepstackError(
        f"{names} drifted: the target code has a shape this tool does not "
        f"recognise{reason}; nothing was written",
        "each drifted location in the table says what was expected; check the "
        f"code there, or leave {skip}",
        **place,
    )

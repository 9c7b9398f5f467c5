"""``deepstack-patch apply``: write every needed patch, or commit each one."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import click
from deepstack_patch.cli.common import (
    EXIT_OK,
    format_option,
    refuse_drifted,
    stderr_console,
    stdout_console,
    tree_options,
    warn,
    warn_hard_links,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
    select_options,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import Patch
from deepstack_patch.engine.tree import VllmTree


@click.command()
@patches_option
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
    "--skip-drifted",
    is_flag=True,
    help="Leave out each drifted patch, and every patch that requires it or "
    "names it as companion, and apply the rest; each one left out is listed "
    "with its location and reason. Exit 0 once the rest is written (or, "
    "with --check, 1 if any of the rest is needed), whatever was left out.",
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
@click.option(
    "--unchecked-names",
    is_flag=True,
    help="Write a needed derived patch whose runtime names (the attributes "
    "its code reads) could not be checked: a partial tree without the "
    "release's whole vllm package. Without it such a patch is refused.",
)
@format_option
def apply(
    tree: VllmTree,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    dry_run: bool,
    check: bool,
    skip_drifted: bool,
    commit: bool,
    allow_dirty: bool,
    unchecked_names: bool,
    output_format: str,
) -> None:
    """Apply every needed patch to a tree, all files or none.

    Each file's bytes are kept except the intended edit (encoding, newlines,
    mode, untouched lines). A second run changes nothing. If any selected
    patch is drifted (its target exists but has a shape it does not
    recognise), nothing is written and the exit code is 2; with
    --skip-drifted the drifted ones (and what cannot go without them) are
    left out, listed, and the rest is applied.

    \b
    Exit codes: 0 applied, or nothing to do (with --skip-drifted: every
    patch not left out is applied; the ones left out are listed, in JSON
    under left_out); 1 with --check: patches needed; 2 drifted targets
    (without --skip-drifted) or an error, nothing written; 130 interrupted
    before the write completed, every file as it was (after it: the
    summary, then "interrupted after the write", 0).
    """
    from deepstack_patch.engine.apply import CHECK, DRY_RUN, WRITE, apply_tree
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.engine.recognition_cache import RecognitionCache
    from deepstack_patch.output.documents import dump_json, plan_json
    from deepstack_patch.output.progress import files_read

    series = load_series()
    selected = select_patches(series, only, skip)
    if allow_dirty and not commit:
        raise DeepstackError(
            "--allow-dirty needs --commit", "add --commit, or drop --allow-dirty"
        )
    if commit and (dry_run or check):
        flag = "--dry-run" if dry_run else "--check"
        raise DeepstackError(
            f"--commit makes commits and {flag} writes nothing: they cannot go "
            "together",
            f"run with {flag} first to see what would change, then with --commit",
        )
    if commit:
        sys.exit(
            apply_with_commits(
                tree,
                series,
                selected,
                allow_dirty,
                output_format,
                unchecked_names,
                skip_drifted,
            )
        )
    # A dry run computes the diff, and with --check also gives its verdict.
    mode = DRY_RUN if dry_run else CHECK if check else WRITE
    # The recognition cache serves only files nothing is rewritten in.
    cache = RecognitionCache.for_series(series)
    with said_after_the_write():
        with files_read() as read:
            result = apply_tree(
                tree,
                series,
                selected,
                mode,
                cache,
                check=check,
                unchecked_names=unchecked_names,
                skip_drifted=skip_drifted,
                progress=read,
            )
        if result.drifted:
            fields = _apply_fields(result, dry_run, check)
            # Under --dry-run stdout is a diff (here an empty one), never a table.
            refused = refuse_drifted(
                result.plan, output_format, "apply", table_on_stderr=dry_run, **fields
            )
            sys.exit(refused)
        if output_format == "json":
            document = plan_json(
                result.plan, "apply", **_apply_fields(result, dry_run, check)
            )
            click.echo(dump_json(document))
        elif dry_run:
            _print_dry_run(result)
        else:
            _print_apply(result)
    sys.exit(result.exit_code)


@contextlib.contextmanager
def said_after_the_write() -> Iterator[None]:
    """A Ctrl-C once every file is written says so, and exits 0.

    Before the transaction's commit point, Ctrl-C is ``interrupted`` (130)
    and every file is as it was. After it the run's work is done, and
    "interrupted" would read as "nothing written": the first Ctrl-C waits
    until the summary (or the JSON document) is printed whole, then
    ``interrupted after the write: all N files written`` goes to stderr and
    the exit code is 0, the tree being what a finished apply leaves. A second
    Ctrl-C stops the printing at once, with the same line and code.
    """
    from deepstack_patch.engine.transaction import on_commit

    written: list[str] = []
    caught: list[int] = []
    held = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT)

    def hold(signum: int, _frame: object) -> None:
        caught.append(signum)
        if len(caught) > 1:
            raise KeyboardInterrupt

    def committed(paths: list[str]) -> None:
        written.extend(paths)
        if held:
            signal.signal(signal.SIGINT, hold)

    try:
        with on_commit(committed):
            yield
    except KeyboardInterrupt:
        if not written:
            raise
        caught.append(signal.SIGINT)
    finally:
        if written and held:
            signal.signal(signal.SIGINT, previous)
    if caught:
        sys.stdout.flush()
        files = "1 file" if len(written) == 1 else f"all {len(written)} files"
        sys.stderr.write(f"interrupted after the write: {files} written\n")
        sys.exit(EXIT_OK)


def _apply_fields(result: Any, dry_run: bool, check: bool) -> dict[str, Any]:
    """What apply's JSON document has beside the plan."""
    from deepstack_patch.output.diffs import unified_diff

    extra: dict[str, Any] = {
        "dry_run": dry_run,
        "check": check,
        "written": result.written,
        "left_out": left_out_json(result.left_out),
    }
    if result.written:
        extra["applied"] = result.applied_now
        extra["hard_links"] = result.hard_links
    if dry_run:
        # A refused run writes nothing, so its diff is empty: the rewrites of
        # the patches that did not drift are half a series, which a pipeline
        # applying the diff would write.
        refused = bool(result.drifted)
        extra["diff"] = "" if refused else unified_diff(result.plan.edits)
    return extra


def left_out_json(left_out: Sequence[Any]) -> list[dict[str, Any]]:
    """What --skip-drifted left out (``engine.apply.LeftOut``), for JSON."""
    return [
        {
            "id": out.patch_id,
            "state": out.state.value,
            "reason": out.reason,
            "path": out.path,
            "line": out.line,
            "waits_for": list(out.waits_for),
        }
        for out in left_out
    ]


def _print_dry_run(result: Any) -> None:
    """The diff on stdout (for `git apply`, `patch -p1`); what it amounts to
    on stderr, as `ruff format --diff` says it, so the diff stays a diff."""
    from deepstack_patch.output.diffs import unified_diff
    from deepstack_patch.output.tables import print_left_out

    sys.stdout.write(unified_diff(result.plan.edits))
    print_left_out(stderr_console(), result.left_out)
    if result.check:
        needed = ", ".join(r.patch.id for r in result.plan.needed)
        click.echo(f"needed: {needed}" if needed else "nothing needed", err=True)
    elif not result.plan.edits:
        click.echo(nothing_to_do(result), err=True)


def _print_apply(result: Any) -> None:
    from deepstack_patch.output.tables import (
        print_left_out,
        print_open_follow_ups,
        print_plan_table,
        print_tree_header,
    )

    plan = result.plan
    warn_hard_links(result.hard_links)
    console = stdout_console()
    print_tree_header(console, plan.tree)
    print_plan_table(console, plan, left_out=[out.patch_id for out in result.left_out])
    print_left_out(console, result.left_out)
    if result.check:
        needed = ", ".join(r.patch.id for r in plan.needed)
        console.print(f"needed: {needed}" if needed else "nothing needed")
    elif result.written:
        ids = ", ".join(result.applied_now)
        console.print(
            f"[green]applied now[/] {ids}; wrote {len(result.written)} file(s):"
        )
        for relpath in result.written:
            console.print(f"  {relpath}")
    else:
        console.print(nothing_to_do(result))
    print_open_follow_ups(console, plan.reports)


def nothing_to_do(result: Any) -> str:
    """The line of a run with nothing to write: true of what it worked on."""
    which = "other selected patch" if result.left_out else "selected patch"
    return f"nothing to do: every {which} is applied or not applicable"


def apply_with_commits(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    allow_dirty: bool,
    output_format: str,
    unchecked_names: bool = False,
    skip_drifted: bool = False,
) -> int:
    """Apply the needed patches as one git commit each; return the exit code."""
    from deepstack_patch.distribution.vcs import commit_series
    from deepstack_patch.output.documents import dump_json, plan_json
    from deepstack_patch.output.progress import files_read
    from deepstack_patch.output.tables import (
        print_left_out,
        print_plan_table,
        print_tree_header,
    )

    with files_read() as read:
        result = commit_series(
            tree, series, selected, allow_dirty, unchecked_names, skip_drifted, read
        )
    if result.drifted:
        return refuse_drifted(result.plan, output_format, "apply")
    if result.detached:
        warn(
            "HEAD is detached: the commits are on no branch; keep them with "
            f"git switch -c <branch> {result.commits[-1].sha[:12]}"
        )
    if output_format == "json":
        document = plan_json(
            result.plan,
            "apply",
            dry_run=False,
            check=False,
            written=result.touched,
            left_out=left_out_json(result.left_out),
            commits=[
                {"id": c.patch_id, "sha": c.sha, "files": c.files}
                for c in result.commits
            ],
        )
        click.echo(dump_json(document))
        return EXIT_OK
    console = stdout_console()
    print_tree_header(console, tree)
    print_plan_table(console, result.plan, [out.patch_id for out in result.left_out])
    print_left_out(console, result.left_out)
    if not result.commits:
        console.print(f"{nothing_to_do(result)}; no commit made")
    for commit in result.commits:
        console.print(
            f"[green]committed[/] {commit.sha[:12]} {commit.patch_id} "
            f"({', '.join(commit.files)})"
        )
    return EXIT_OK

"""``deepstack-patch apply``: write every needed patch, or commit each one."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import click
from deepstack_patch.cli.common import (
    EXIT_ERROR,
    EXIT_NEEDED,
    EXIT_OK,
    format_option,
    refuse_drifted,
    select_options,
    selected_drifted,
    stdout_console,
    tree_options,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.tree import VllmTree


@click.command()
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
    from deepstack_patch.engine.cache import RecognitionCache
    from deepstack_patch.engine.plan import plan_tree, select_patches
    from deepstack_patch.engine.transaction import tree_lock, write_edits
    from deepstack_patch.output.report import (
        dump_json,
        plan_json,
        print_plan_table,
        print_tree_header,
        unified_diff,
    )
    from deepstack_patch.patches import SERIES

    selected = select_patches(SERIES, only, skip)
    if commit or allow_dirty:
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
        cache = RecognitionCache.for_series(SERIES)  # used where nothing is rewritten
        plan = plan_tree(tree, SERIES, selected, rewrite=not check, cache=cache)
        drifted = selected_drifted(plan)
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


def apply_with_commits(
    tree: VllmTree, selected: set[str], allow_dirty: bool, output_format: str
) -> int:
    """Apply the needed patches as one git commit each; return the exit code."""
    from deepstack_patch.engine.transaction import tree_lock
    from deepstack_patch.output.report import (
        dump_json,
        plan_json,
        print_plan_table,
        print_tree_header,
    )
    from deepstack_patch.patches import SERIES
    from deepstack_patch.vendor.quilt import plan_steps
    from deepstack_patch.vendor.vcs import (
        check_work_tree,
        commit_steps,
        open_repository,
    )

    repo = open_repository(tree)
    with tree_lock(tree.root):
        plan, steps = plan_steps(tree, SERIES, selected)
        if selected_drifted(plan):
            refuse_drifted(plan, output_format, "apply")
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

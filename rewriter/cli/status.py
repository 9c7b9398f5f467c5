"""``deepstack-patch status``: every patch's state, with locations."""

from __future__ import annotations

import sys

import click
from deepstack_patch.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    format_option,
    read_tree_options,
    selected_drifted,
    stdout_console,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
    select_options,
    told_agreement,
)
from deepstack_patch.engine.tree import VllmTree


@click.command()
@patches_option
@read_tree_options
@select_options
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also show each upstream follow-up of the patches that matter here "
    "(otherwise one line says how many there are).",
)
@format_option
def status(
    tree: VllmTree,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    verbose: bool,
    output_format: str,
) -> None:
    """Show the state of every patch in a tree, with file:line locations.

    \b
    Exit codes: 0 states computed, none drifted; 2 a selected patch is drifted,
    or an error. (Use `apply --check` to fail a pipeline on needed patches.)
    """
    from deepstack_patch.engine.plan import plan_tree, select_patches
    from deepstack_patch.engine.recognition_cache import RecognitionCache
    from deepstack_patch.output.progress import files_read

    series = load_series()
    selected = select_patches(series, only, skip)
    cache = RecognitionCache.for_series(series)
    try:
        with files_read() as read:
            plan = plan_tree(
                tree, series, selected, rewrite=False, cache=cache, progress=read
            )
    except Exception:
        told_agreement()  # a data file that disagrees is the error to tell
        raise
    told_agreement()
    if output_format == "json":
        from deepstack_patch.output.documents import (
            dump_json,
            plan_json,
            state_counts,
        )

        document = plan_json(plan, "status", counts=state_counts(plan.reports))
        click.echo(dump_json(document))
    else:
        from deepstack_patch.output.tables import (
            print_open_follow_ups,
            print_plan_table,
            print_state_counts,
            print_tree_header,
        )

        console = stdout_console()
        print_tree_header(console, tree)
        print_plan_table(console, plan)
        print_open_follow_ups(console, plan.reports, verbose=verbose)
        print_state_counts(console, plan)
    sys.exit(EXIT_ERROR if selected_drifted(plan) else EXIT_OK)

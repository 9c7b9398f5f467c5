"""``deepstack-patch status``: every patch's state, with locations."""

from __future__ import annotations

import sys

import click
from deepstack_patch.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    format_option,
    select_options,
    selected_drifted,
    stdout_console,
    tree_options,
)
from deepstack_patch.engine.tree import VllmTree


@click.command()
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
    from deepstack_patch.engine.cache import RecognitionCache
    from deepstack_patch.engine.plan import plan_tree, select_patches
    from deepstack_patch.output.report import (
        dump_json,
        plan_json,
        print_plan_table,
        print_tree_header,
    )
    from deepstack_patch.patches import SERIES

    selected = select_patches(SERIES, only, skip)
    cache = RecognitionCache.for_series(SERIES)
    plan = plan_tree(tree, SERIES, selected, rewrite=False, cache=cache)
    if output_format == "json":
        click.echo(dump_json(plan_json(plan, "status")))
    else:
        console = stdout_console()
        print_tree_header(console, tree)
        print_plan_table(console, plan)
    sys.exit(EXIT_ERROR if selected_drifted(plan) else EXIT_OK)

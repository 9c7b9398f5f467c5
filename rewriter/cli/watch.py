"""``deepstack-patch watch``: upstream changes to the code the fixes depend on."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from deepstack_patch.cli.common import (
    EXIT_NEEDED,
    EXIT_OK,
    format_option,
    stdout_console,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
)


@click.command()
@patches_option
@click.option("--since", required=True, metavar="VERSION", help="First release.")
@click.option(
    "--until",
    metavar="VERSION",
    help="Last release (default: the newest on the index, which is then asked).",
)
@click.option(
    "--vllm-git",
    type=click.Path(path_type=Path, file_okay=False),
    help="A vLLM clone with its release tags: name the commits (and pull "
    "requests) that made each change.",
)
@click.option(
    "--reviewed",
    "reviewed_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The reviewed changes (default: the watch.toml shipped with the tool).",
)
@click.option(
    "--all-diffs", is_flag=True, help="Print the diff of every change, not only new."
)
@format_option
def watch(
    since: str,
    until: str | None,
    vllm_git: Path | None,
    reviewed_path: Path | None,
    all_diffs: bool,
    output_format: str,
) -> None:
    """Report every release that changed a patch's footprint: the functions it
    rewrites, and those that write the state they read.

    Each change is carried (the series writes it), known (reviewed, in
    watch.toml) or new. Comments, formatting and docstrings do not count.

    \b
    Exit codes: 0 nothing new; 1 a new change to review; 2 an error.
    """
    from deepstack_patch.distribution.watch import run_watch

    result = run_watch(load_series(), since, until, reviewed_path, vllm_git)
    if output_format == "json":
        from deepstack_patch.output.documents import dump_json, watch_json

        click.echo(dump_json(watch_json(result)))
    else:
        from deepstack_patch.output.watch import print_watch

        print_watch(stdout_console(), result, all_diffs)
    sys.exit(EXIT_NEEDED if result.new else EXIT_OK)

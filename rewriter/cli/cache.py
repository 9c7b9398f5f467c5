"""``deepstack-patch cache``: what the user cache holds, and clearing it."""

from __future__ import annotations

import sys

import click
from deepstack_patch.cli.common import EXIT_OK, format_option, stdout_console


@click.command()
@click.option(
    "--clear",
    "clear",
    multiple=True,
    metavar="KIND",
    help="Remove this kind's entries (repeatable; `all` for every kind). "
    "An entry another run holds is left, and said.",
)
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(min=0),
    metavar="DAYS",
    help="Count (and with --clear remove) only entries made or last changed "
    "more than DAYS days ago.",
)
@format_option
def cache(clear: tuple[str, ...], older_than: float | None, output_format: str) -> None:
    """Show the cache's size per kind; clear a kind, or its old entries.

    Everything in the cache is made again when a command needs it: a
    tarball is downloaded again, a tree extracted again, an environment
    rebuilt. Each kind's line says what that costs. Lock files are never
    removed. The cache is ~/.cache/deepstack-patch, or $DEEPSTACK_PATCH_CACHE.

    \b
    Examples:
      deepstack-patch cache
      deepstack-patch cache --clear commit-trees
      deepstack-patch cache --clear all --older-than 30

    \b
    Exit codes: 0 shown (and cleared); 2 an error (an unknown kind).
    """
    from deepstack_patch.fetch.cache_kinds import cache_usage

    report = cache_usage(clear, older_than)
    if output_format == "json":
        from deepstack_patch.output.documents import cache_json, dump_json

        click.echo(dump_json(cache_json(report)))
    else:
        from deepstack_patch.output.tables import print_cache

        print_cache(stdout_console(), report)
    sys.exit(EXIT_OK)

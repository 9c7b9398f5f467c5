"""``deepstack-patch revert``: give an installed vLLM back its own files."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from deepstack_patch.cli.common import (
    EXIT_OK,
    format_option,
    installed_options,
    open_tree,
    stdout_console,
)
from deepstack_patch.engine.errors import DeepstackError


@click.command()
@installed_options()
@click.option(
    "--vllm-src",
    "vllm_src",
    type=click.Path(path_type=Path),
    help="A site-packages folder holding vllm/ and vllm-*.dist-info/.",
)
@format_option
def revert(
    installed: bool, python: Path | None, vllm_src: Path | None, output_format: str
) -> None:
    """Undo every change deepstack-patch made to an installed vLLM.

    Every rewritten module, RECORD and the bytecode get their original bytes
    back (kept in the distribution's dist-info folder at apply), and the
    change record goes. If a file changed after deepstack-patch wrote it,
    nothing is reverted and the file is named.

    \b
    Exit codes: 0 reverted, or nothing to revert; 2 a file changed since,
    or an error (nothing changed).
    """
    from deepstack_patch.engine.inplace import revert_in_place
    from deepstack_patch.engine.installed import InstalledTree
    from deepstack_patch.engine.locks import tree_lock
    from deepstack_patch.output.documents import dump_json, revert_json

    if installed == (vllm_src is not None):
        raise DeepstackError(
            "give exactly one of --installed [--python PY] and --vllm-src "
            "SITE-PACKAGES",
            "e.g. deepstack-patch revert --installed --python /opt/venv/bin/python",
        )
    if python is not None and not installed:
        raise DeepstackError(
            "--python goes with --installed", "add --installed, or drop --python"
        )
    tree = open_tree(vllm_src, None, None, installed=installed, python=python)
    if not isinstance(tree, InstalledTree) or tree.installed is None:
        raise DeepstackError(
            f"{tree.root}: is a source tree, not an installed vLLM; revert gives "
            "back what apply changed in an install",
            "in a git checkout use git (git checkout -- vllm/); re-extract a release",
        )
    with tree_lock(tree.root):
        result = revert_in_place(tree.installed)
    if output_format == "json":
        click.echo(dump_json(revert_json(tree, result)))
        sys.exit(EXIT_OK)
    console = stdout_console()
    if result.nothing:
        console.print(
            f"nothing to revert: vLLM {result.installed.version} in "
            f"{result.installed.site_packages} has no deepstack-patch record"
        )
        sys.exit(EXIT_OK)
    console.print(
        f"[green]reverted[/] {', '.join(result.applied)}: gave back "
        f"{len(result.files)} file(s), RECORD and {len(result.bytecode)} "
        "bytecode file(s); the change record is removed"
    )
    for path in result.files:
        console.print(f"  {path}")
    sys.exit(EXIT_OK)

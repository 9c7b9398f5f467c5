"""The ``deepstack-patch`` command line: one module per command, loaded on use.

Exit codes are a contract (README.md, "Exit codes"):
0 success / nothing needed, 1 ``apply --check`` found needed patches,
2 drifted targets or an error (nothing written).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click
from deepstack_patch import __version__
from deepstack_patch.cli.common import EXIT_ERROR, stderr_console
from deepstack_patch.engine.errors import DeepstackError

# Command name -> "module:function" under deepstack_patch.cli. Only the invoked
# command's module (and what it needs) is imported, so `deepstack-patch list`
# never imports LibCST or the proof layer.
COMMANDS = {
    "list": "list:list_command",
    "status": "status:status",
    "apply": "apply:apply",
    "export": "export:export",
    "backport": "backport:backport",
    "matrix": "matrix:matrix",
    "verify": "verify:verify",
    "revert": "revert:revert",
}


class DeepstackGroup(click.Group):
    """Loads commands lazily; turns a :class:`DeepstackError` into ``error: ...``
    and exit code 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, _, attribute = COMMANDS[name].partition(":")
        module = importlib.import_module(f"deepstack_patch.cli.{module_name}")
        return getattr(module, attribute)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DeepstackError as exc:
            from rich.markup import escape

            console = stderr_console()
            console.print(
                f"[bold red]error:[/] {escape(exc.message)}",
                markup=True,
                highlight=False,
            )
            if exc.hint:
                # Escaped: hints quote things like 'deepstack-patch[verify]'.
                console.print(f"[bold]hint:[/] {escape(exc.hint)}")
            sys.exit(EXIT_ERROR)


@click.group(
    cls=DeepstackGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="deepstack-patch")
def main() -> None:
    """Bring curated upstream vLLM fixes into a pinned vLLM source tree.

    Every patch recognises its target by structure and reports one of four
    states: needed, applied, not-applicable or drifted. Only recognised code
    is rewritten; a drifted target stops the run before anything is written.

    \b
    Typical use, in a vLLM checkout:
      deepstack-patch status --vllm-src .
      deepstack-patch apply --vllm-src .
    Or on a release fetched from the package index:
      deepstack-patch apply --release 0.20.2
    """

"""The ``deepstack-patch`` command line: one module per command, loaded on use.

Exit codes are a contract (docs/output.md, "Exit codes"):
0 success / nothing needed, 1 ``apply --check`` found needed patches,
2 drifted targets or an error (nothing written).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click
from deepstack_patch import __version__
from deepstack_patch.cli.common import (
    interrupted,
    invoked_command,
    os_error,
    refuse_repeated_options,
    report_error,
    wants_json,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.output import progress

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
    "wheel": "wheel:wheel",
    "doctor": "doctor:doctor",
    "revert": "revert:revert",
    "watch": "watch:watch",
    "derive": "derive:derive",
    "cache": "cache:cache",
}


class DeepstackGroup(click.Group):
    """Loads commands lazily; every way out of a command is a documented exit.

    A :class:`DeepstackError`, a file-system error and a click usage error
    become ``error:`` + ``hint:`` (JSON on stdout with ``--format json``) and
    exit 2; Ctrl-C prints ``interrupted`` and exits 130 (after ``apply``'s
    write it says so and exits 0: ``cli.apply.said_after_the_write``). A reader that
    closes the pipe is deepstack_patch.entry's to handle (it changes nothing).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, _, attribute = COMMANDS[name].partition(":")
        module = importlib.import_module(f"deepstack_patch.cli.{module_name}")
        return getattr(module, attribute)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and name is not None:
            refuse_repeated_options(command, name, ctx, rest)
        return name, command, rest

    def main(self, args: Any = None, *pargs: Any, **kwargs: Any) -> Any:
        # Not list(): importing the `list` command module shadows the builtin here.
        words = [*(sys.argv[1:] if args is None else args)]
        self.words = words  # for invoke's error report (--format json)
        progress.quiet = wants_json(words)
        kwargs["standalone_mode"] = False
        try:
            code = super().main(words, *pargs, **kwargs)
        except click.exceptions.Abort:
            interrupted()
        except click.ClickException as exc:
            no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())
            if isinstance(exc, no_args):  # bare `deepstack-patch`: the help
                exc.show()
                sys.exit(exc.exit_code)
            command = invoked_command(words)
            report_error(
                DeepstackError(
                    exc.format_message(),
                    f"run 'deepstack-patch {command} --help'"
                    if command
                    else "run 'deepstack-patch --help'",
                ),
                words,
            )
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        words = getattr(self, "words", [])
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()
        except DeepstackError as exc:
            report_error(exc, words)
        except OSError as exc:
            # Not stdout's or stderr's closed pipe: deepstack_patch.entry makes
            # those write to the null device instead of raising.
            report_error(os_error(exc), words)


@click.group(
    cls=DeepstackGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="deepstack-patch")
def main() -> None:
    """Bring curated upstream vLLM fixes into the vLLM you run: a source tree,
    an installed vLLM (site-packages, a container image) or a wheel.

    Every patch recognises its target by structure and reports one of four
    states: needed, applied, not-applicable or drifted. Only recognised code
    is rewritten; a drifted target stops the run before anything is written.

    \b
    Typical use, in a vLLM checkout:
      deepstack-patch status --vllm-src .
      deepstack-patch apply --vllm-src .
    Or on a release fetched from the package index:
      deepstack-patch apply --release 0.20.2
    Or in the vLLM this Python imports, then check that the fix is live:
      deepstack-patch apply --installed && deepstack-patch doctor
    """

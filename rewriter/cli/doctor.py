"""``deepstack-patch doctor``: is every needed fix live in the vLLM a Python runs?"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from deepstack_patch.cli.common import (
    EXIT_ERROR,
    EXIT_NEEDED,
    EXIT_OK,
    format_option,
    print_error,
    python_option,
    stdout_console,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
)


@click.command()
@patches_option
@python_option("The interpreter that runs vLLM (default: the one running this tool).")
@click.option(
    "--import",
    "import_check",
    is_flag=True,
    help="Also import the target modules in that Python and compare the live "
    "functions with the source. Needs vLLM's dependencies (torch, ...) there.",
)
@format_option
def doctor(python: Path | None, import_check: bool, output_format: str) -> None:
    """Check that the fixes are live where vLLM runs, without importing vLLM.

    In that Python: which vllm the import system resolves (path, version, how
    it was installed, what shadows what on sys.path / PYTHONPATH); each
    patch's state in that source; whether each target module loads from that
    source and its bytecode is that source's; and the change record
    `apply --installed` keeps (applied, skipped, files changed since).

    \b
    Exit codes: 0 every needed fix is live; 1 one is not (the output says
    which and why); 2 an error, or with --import the files are patched but
    that Python cannot import vLLM (a dependency such as torch missing).
    """
    from deepstack_patch.liveness.doctor import diagnose, diagnosis_json
    from deepstack_patch.output.documents import dump_json

    diagnosis = diagnose(python, load_series(), import_check)
    if output_format == "json":
        click.echo(dump_json(diagnosis_json(diagnosis)))
    else:
        _print(diagnosis)
    match diagnosis.outcome:
        case "live":
            sys.exit(EXIT_OK)
        case "not-live":
            sys.exit(EXIT_NEEDED)
        case "cannot-import":
            # The files are patched; the environment, not the tree, is at fault.
            print_error(diagnosis.import_error)
            sys.exit(EXIT_ERROR)


def _print(diagnosis) -> None:  # noqa: ANN001 - a liveness.doctor.Diagnosis
    from deepstack_patch.output.plain import escape, new_table
    from deepstack_patch.output.tables import print_open_follow_ups

    console = stdout_console()
    console.print(f"python  {diagnosis.python} ({diagnosis.python_version})")
    console.print(f"vllm    {diagnosis.version} at {diagnosis.package}")
    console.print(f"        {escape(diagnosis.installed_as)}")
    for other in diagnosis.shadowing:
        console.print(f"        also on the path, not imported: {escape(other)}")
    record = diagnosis.record
    if record is not None:
        changed = ", ".join(diagnosis.changed_since) or "none"
        console.print(
            f"record  applied {', '.join(record.applied) or 'nothing'} on "
            f"{record.date}; skipped {', '.join(record.skipped) or 'none'}; "
            f"files changed since: {changed}"
        )
    for note in diagnosis.notes:
        console.print(f"note    {escape(note)}")
    table = new_table(console, boxed=True)
    for column in ("patch", "state", "live", "why"):
        table.add_column(column)
    for verdict in diagnosis.verdicts:
        live = "yes" if verdict.live else ("-" if not verdict.counts else "NO")
        if verdict.import_failed:
            live = "?"  # patched files, running code unknown
        table.add_row(
            verdict.report.patch.id,
            str(verdict.report.state),
            live,
            escape("; ".join(verdict.reasons)),
        )
    console.print(table)
    print_open_follow_ups(console, [verdict.report for verdict in diagnosis.verdicts])
    match diagnosis.outcome:
        case "live":
            console.print("every needed fix is live")
        case "not-live":
            console.print(f"not live; to fix: {escape(diagnosis.fix_command)}")
        # cannot-import: the error and its hint follow on stderr.

"""A reader that closes the pipe (``| head``) changes nothing but what is printed.

Every test runs the installed command in a subprocess whose stdout (and, where
said, stderr) is a real pipe with no reader left: its read end is closed
before the command starts, so every write the command makes meets a closed
pipe, as the writes after ``head -1`` has read its line do, without the race
of a reader that might read everything first. The command must then finish
its work and exit as it would with its whole output read, with nothing on
stderr that it would not have said anyway: no traceback, no "Exception
ignored", no "Broken pipe". One test goes through a shell's ``| head -1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deepstack_patch.cli import COMMANDS
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

from tests.test_cli import MODEL, make_tree

NOISE = ("Traceback", "Exception ignored", "Broken pipe", "BrokenPipeError")


def into_closed_pipe(
    *args: str, cwd: Path | None = None, stderr_too: bool = False
) -> tuple[int, str]:
    """Run the command with stdout (and ``stderr_too``) a pipe nobody reads;
    return its exit code and what it wrote on stderr (if not into the pipe)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "deepstack_patch", *args],
            stdout=write_end,
            stderr=write_end if stderr_too else subprocess.PIPE,
            text=True,
            cwd=cwd,
            timeout=300,
        )
    finally:
        os.close(write_end)
    stderr = result.stderr or ""
    for noise in NOISE:
        assert noise not in stderr, stderr
    return result.returncode, stderr


@pytest.fixture
def needing_tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree", granite.BEFORE)


@pytest.fixture
def drifted_tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "drifted", granite.SLICED_OTHERWISE)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("list",), 0),
        (("list", "--format", "json"), 0),
        (("status", "--vllm-src", "{needing}"), 0),
        (("status", "--vllm-src", "{needing}", "--format", "json"), 0),
        (("apply", "--check", "--vllm-src", "{needing}"), 1),  # the verdict
        (("apply", "--dry-run", "--vllm-src", "{needing}"), 0),
        (("status", "--vllm-src", "{drifted}"), 2),
        (("export", "--vllm-src", "{needing}", "--series", "{tmp}/series"), 0),
        (("matrix", "--emit", "github-actions", "--output", "-"), 0),
        (("--version",), 0),
    ],
)
def test_a_closed_pipe_keeps_the_exit_code(
    args: tuple[str, ...],
    code: int,
    needing_tree: Path,
    drifted_tree: Path,
    tmp_path: Path,
) -> None:
    words = [
        a.format(needing=needing_tree, drifted=drifted_tree, tmp=tmp_path) for a in args
    ]
    before = (needing_tree / MODEL).read_bytes()
    assert into_closed_pipe(*words)[0] == code
    assert (needing_tree / MODEL).read_bytes() == before  # none of them writes
    if "export" in args:  # the series is written all the same
        assert (tmp_path / "series" / "series").is_file()


@pytest.mark.parametrize("command", [*COMMANDS])
def test_every_commands_help_takes_a_closed_pipe(command: str) -> None:
    assert into_closed_pipe(command, "--help", stderr_too=True)[0] == 0


def test_apply_into_a_closed_pipe_writes_and_says_so(needing_tree: Path) -> None:
    """The plan is made and written whatever the reader does, all files or
    none; the exit code says it was written (0), as it would have in full."""
    code, stderr = into_closed_pipe("apply", "--vllm-src", str(needing_tree))
    assert (code, stderr) == (0, "")
    assert (needing_tree / MODEL).read_text() == granite.AFTER
    # A second run, into the pipe and its stderr too: nothing to do, still 0.
    assert (
        into_closed_pipe("apply", "--vllm-src", str(needing_tree), stderr_too=True)[0]
        == 0
    )


def test_an_error_into_a_closed_pipe_is_still_an_error(drifted_tree: Path) -> None:
    """stdout and stderr both into the closed pipe (``2>&1 | head``)."""
    before = (drifted_tree / MODEL).read_bytes()
    code, _ = into_closed_pipe(
        "apply", "--vllm-src", str(drifted_tree), stderr_too=True
    )
    assert code == 2
    assert (drifted_tree / MODEL).read_bytes() == before


@pytest.mark.skipif(shutil.which("bash") is None, reason="runs a bash pipeline")
def test_head_in_a_shell_pipeline(needing_tree: Path) -> None:
    """As a user types it: ``set -o pipefail``, then the command's own status."""
    command = " ".join([sys.executable, "-m", "deepstack_patch"])
    script = (
        "set -o pipefail; "
        f"{command} list | head -1 >/dev/null; a=$?; "
        f"{command} apply --vllm-src '{needing_tree}' | head -1 >/dev/null; b=$?; "
        'echo "$a $b"'
    )
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.stdout.split() == ["0", "0"], result.stdout + result.stderr
    for noise in NOISE:
        assert noise not in result.stderr, result.stderr
    assert (needing_tree / MODEL).read_text() == granite.AFTER

"""Ctrl-C at any moment: ``interrupted`` on stderr, exit 130, never a traceback.

Timing a signal into the first tenth of a second would pass or fail by luck,
so the moment is chosen instead: a ``sitecustomize`` on PYTHONPATH hooks the
import system, and when the command line goes to import a given module it
sends this process a real SIGINT (what Ctrl-C in a terminal sends), then
lets the import go on. Python raises KeyboardInterrupt right there, halfway
through the command line's imports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

#: Sends SIGINT when the module named in DEEPSTACK_TEST_SIGINT_ON is about to
#: be imported, and says so on stderr (so a test knows the moment came).
SITECUSTOMIZE = """
import os, signal, sys

class _InterruptOnImport:
    target = os.environ.get("DEEPSTACK_TEST_SIGINT_ON")

    def find_spec(self, name, path=None, target=None):
        if name == self.target:
            type(self).target = None  # once
            sys.stderr.write("test hook: SIGINT on importing %s\\n" % name)
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _InterruptOnImport())
"""

#: Moments from the first import of the command line to the command's own
#: (``list``). Earlier than the entry module (Python's own start-up, the
#: ``deepstack_patch`` package) no code of ours runs yet: not covered.
MOMENTS = [
    "deepstack_patch.cli",
    "click",
    "deepstack_patch.cli.common",
    "deepstack_patch.engine.errors",
    "deepstack_patch.output.progress",
    "deepstack_patch.cli.list",
    "deepstack_patch.patches",
    "deepstack_patch.output.tables",
]

CONSOLE_SCRIPT = Path(sys.executable).parent / "deepstack-patch"


def launchers() -> list[list[str]]:
    found = [[sys.executable, "-m", "deepstack_patch"]]
    if CONSOLE_SCRIPT.is_file():  # a venv with this project installed
        found.append([str(CONSOLE_SCRIPT)])
    return found


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("launcher", launchers(), ids=lambda words: words[-1])
def test_ctrl_c_while_the_command_line_imports(
    tmp_path: Path, launcher: list[str], moment: str
) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "DEEPSTACK_TEST_SIGINT_ON": moment,
    }
    done = subprocess.run(
        [*launcher, "list"], env=env, capture_output=True, text=True, timeout=120
    )
    assert f"test hook: SIGINT on importing {moment}" in done.stderr, (
        f"the moment never came: {moment} was not imported\n{done.stderr}"
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith("interrupted"), done.stderr
    assert done.returncode == 130, (done.returncode, done.stderr)


def test_the_hook_interrupts_a_plain_python(tmp_path: Path) -> None:
    """The hook itself works: without the command line's handling, the same
    moment is Python's own KeyboardInterrupt traceback."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "DEEPSTACK_TEST_SIGINT_ON": "json",
    }
    done = subprocess.run(
        [sys.executable, "-c", "import json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "KeyboardInterrupt" in done.stderr, done.stderr
    assert done.returncode in (1, -signal.SIGINT, 128 + signal.SIGINT), done.returncode


@pytest.mark.parametrize("moment", ["click", "deepstack_patch.patches"])
def test_ctrl_c_with_format_json_leaves_stdout_empty(
    tmp_path: Path, moment: str
) -> None:
    """A pipeline reads no half document: the exit code (130) says why."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "DEEPSTACK_TEST_SIGINT_ON": moment,
    }
    done = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "list", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"test hook: SIGINT on importing {moment}" in done.stderr, done.stderr
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stdout == "", done.stdout
    assert "Traceback" not in done.stderr, done.stderr

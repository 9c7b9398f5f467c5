"""Ctrl-C at any moment: ``interrupted`` on stderr, exit 130, never a traceback.

Timing a signal into the first tenth of a second would pass or fail by luck,
so the moment is chosen instead: a ``sitecustomize`` on PYTHONPATH hooks the
import system, and when the command line goes to import a given module it
sends this process a real SIGINT (what Ctrl-C in a terminal sends), then
lets the import go on. Python raises KeyboardInterrupt right there, halfway
through the command line's imports.
"""

from __future__ import annotations

import json
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


# -- Ctrl-C around apply's write (issue 36 item 1) ------------------------------

#: Sends SIGINT at a chosen step of ``apply``'s write: on importing a module
#: (DEEPSTACK_TEST_SIGINT_ON, as above), or in the first call of json.dumps
#: (DEEPSTACK_TEST_SIGINT_IN_DUMPS=1: the document of a run that has written).
#: With DEEPSTACK_TEST_SIGINT_TWICE=1 the signal is sent twice.
APPLY_SITECUSTOMIZE = (
    SITECUSTOMIZE
    + """
import json

_dumps = json.dumps
_times = 2 if os.environ.get("DEEPSTACK_TEST_SIGINT_TWICE") else 1

def _interrupting_dumps(*args, **kwargs):
    global _dumps_armed
    if _dumps_armed:
        _dumps_armed = False
        sys.stderr.write("test hook: SIGINT in json.dumps\\n")
        sys.stderr.flush()
        for _ in range(_times):
            os.kill(os.getpid(), signal.SIGINT)
    return _dumps(*args, **kwargs)

_dumps_armed = bool(os.environ.get("DEEPSTACK_TEST_SIGINT_IN_DUMPS"))
json.dumps = _interrupting_dumps
"""
)

GRANITE = "vllm/model_executor/models/granite4_vision.py"


def _needing_tree(root: Path) -> Path:
    """A small tree where one patch (vllm#40917) is needed: one file to write."""
    from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

    (root / "vllm/model_executor/models").mkdir(parents=True)
    (root / "vllm/__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (root / GRANITE).write_text(granite.BEFORE)
    return root


def _interrupted_apply(
    tmp_path: Path, hook: dict[str, str], *options: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(APPLY_SITECUSTOMIZE)
    tree = _needing_tree(tmp_path / "tree")
    env = {**os.environ, "PYTHONPATH": str(hooks), **hook}
    done = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "apply", "--vllm-src", str(tree)]
        + list(options),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "test hook: SIGINT" in done.stderr, f"the moment never came\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done, tree


def test_ctrl_c_before_apply_writes_is_130_and_writes_nothing(tmp_path: Path) -> None:
    """The transaction module loads just before the write: nothing is written,
    and 130 with ``interrupted`` says so."""
    from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

    done, tree = _interrupted_apply(
        tmp_path, {"DEEPSTACK_TEST_SIGINT_ON": "deepstack_patch.engine.transaction"}
    )
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr.rstrip().endswith("interrupted"), done.stderr
    assert "after the write" not in done.stderr
    assert (tree / GRANITE).read_text() == granite.BEFORE


def test_ctrl_c_after_apply_wrote_says_so_and_exits_0(tmp_path: Path) -> None:
    """The summary's table module loads after every file is in place: the
    summary is printed whole, then the interrupt is named for what it came
    after, with 0 (a finished apply), never 130 (which means "as it was")."""
    from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

    done, tree = _interrupted_apply(
        tmp_path, {"DEEPSTACK_TEST_SIGINT_ON": "deepstack_patch.output.tables"}
    )
    assert (tree / GRANITE).read_text() == granite.AFTER
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "wrote 1 file(s)" in done.stdout, done.stdout
    assert done.stderr.rstrip().endswith(
        "interrupted after the write: 1 file written"
    ), done.stderr


@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
def test_ctrl_c_after_apply_wrote_keeps_the_json_document(
    tmp_path: Path, twice: bool
) -> None:
    """Under --format json the first Ctrl-C after the write waits for the
    document, so a pipeline reads it whole with 0; a second one stops the
    printing with the same line and code."""
    hook = {"DEEPSTACK_TEST_SIGINT_IN_DUMPS": "1"}
    if twice:
        hook["DEEPSTACK_TEST_SIGINT_TWICE"] = "1"
    done, tree = _interrupted_apply(tmp_path, hook, "--format", "json")
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "interrupted after the write: 1 file written" in done.stderr
    if not twice:
        assert json.loads(done.stdout)["written"] == [GRANITE]

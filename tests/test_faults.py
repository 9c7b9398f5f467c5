"""Faults and bad input: each ends in a clear error, exit 2, nothing half-written.

Every case runs the real command line (``CliRunner`` in process, or a
subprocess where the process must die) on a copy of a real release, and checks
the exit code, the message (with ``file:line`` where there is one) and that
every file of the tree is byte-identical afterwards (same paths, same bytes,
same mode bits: no stray temporary file either).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from deepstack_patch.cli import main
from deepstack_patch.engine import apply as apply_module
from deepstack_patch.engine import plan as plan_module
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES

from tests.support import IndexHandler, snapshot, tiny_sdist

pytestmark = pytest.mark.release

VERSION = "0.20.2"  # needs vllm#40917 (and more patches as they land)
GRANITE = "vllm/model_executor/models/granite4_vision.py"


def own_copy(path: Path) -> None:
    """Break ``path``'s hard link to the pristine release before changing it."""
    content = path.read_bytes()
    mode = path.stat().st_mode
    path.unlink()
    path.write_bytes(content)
    path.chmod(stat.S_IMODE(mode))


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def assert_refused(result: Result, *fragments: str) -> None:
    """Exit 2 with ``error:`` and every fragment in the message."""
    # rich wraps long messages at the terminal width: compare unwrapped text.
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "error:" in output, result.output
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in:\n{result.output}"


def target_files(root: Path) -> list[str]:
    """The files `apply` would write on ``root``."""
    plan = plan_tree(VllmTree.open(root), SERIES)
    assert plan.edits, f"nothing needed on {root}: the fault case tests nothing"
    return [edit.relpath for edit in plan.edits]


@pytest.fixture
def tree(patched_copy: Callable[[str], Path]) -> Path:
    return patched_copy(VERSION)


@pytest.fixture
def two_targets(tree: Path) -> Path:
    """A tree where `apply` writes at least two files.

    A vendor copy of the Granite model sits beside the original, so a fault
    can fall between two renames whatever the series holds.
    """
    models = tree / "vllm" / "model_executor" / "models"
    (models / "granite4_vision_vendor.py").write_bytes((tree / GRANITE).read_bytes())
    assert len(target_files(tree)) >= 2
    return tree


# -- killed or failing during the writes ----------------------------------------

KILL_SCRIPT = """
import os, signal, sys
from deepstack_patch.engine import transaction
from deepstack_patch.cli import main

renames = 0

def die_before_second_rename(target):
    global renames
    renames += 1
    if renames == 2:
        os.kill(os.getpid(), signal.SIGKILL)

transaction._before_replace = die_before_second_rename
sys.argv = ["deepstack-patch", "apply", "--vllm-src", sys.argv[1]]
main()
"""


def test_killed_between_renames_leaves_whole_files_and_rerun_completes(
    two_targets: Path,
) -> None:
    root = two_targets
    plan = plan_tree(VllmTree.open(root), SERIES)
    old = {e.relpath: e.old for e in plan.edits}
    new = {e.relpath: e.new for e in plan.edits}

    killed = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(root)],
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()

    now = {rel: (root / rel).read_bytes() for rel in old}
    assert all(now[rel] in (old[rel], new[rel]) for rel in old), "a file is mixed"
    assert sum(now[rel] == new[rel] for rel in old) == 1, "expected one rename done"

    rerun = run("apply", "--vllm-src", str(root))
    assert rerun.exit_code == 0, rerun.output
    assert {rel: (root / rel).read_bytes() for rel in new} == new
    strays = [p for p in root.rglob("*.deepstack-tmp")]
    assert strays == [], "the rerun left the killed run's staged files"
    after = plan_tree(VllmTree.open(root), SERIES)
    assert after.edits == []
    assert all(r.state is not PatchState.NEEDED for r in after.reports)


def test_failed_rename_restores_every_file(
    two_targets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepstack_patch.engine import transaction

    before = snapshot(two_targets)
    calls: list[Path] = []

    def fail_second(target: Path) -> None:
        calls.append(target)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(transaction, "_before_replace", fail_second)
    result = run("apply", "--vllm-src", str(two_targets))
    assert_refused(result, "No space left on device", "every file was restored")
    assert len(calls) == 2, "the fault was never injected"
    assert snapshot(two_targets) == before


# -- bad files in the tree -------------------------------------------------------


def test_read_only_target(tree: Path) -> None:
    target = tree / target_files(tree)[0]
    own_copy(target)
    target.chmod(0o444)  # root still may write it: the tool must not
    before = snapshot(tree)
    result = run("apply", "--vllm-src", str(tree))
    assert_refused(result, "read-only", target.name, "chmod u+w")
    assert snapshot(tree) == before


def test_symlink_leading_outside_the_tree(tree: Path, tmp_path: Path) -> None:
    relpath = target_files(tree)[0]
    outside = tmp_path / "elsewhere" / "granite.py"
    outside.parent.mkdir()
    outside.write_bytes((tree / relpath).read_bytes())
    (tree / relpath).unlink()
    (tree / relpath).symlink_to(outside)
    before, outside_before = snapshot(tree), outside.read_bytes()
    for command in ("status", "apply"):
        result = run(command, "--vllm-src", str(tree))
        assert_refused(result, relpath, "symlink", "outside the tree")
    assert snapshot(tree) == before
    assert outside.read_bytes() == outside_before


def _corrupt(tree: Path, make_bad: Callable[[bytes], bytes]) -> tuple[str, int]:
    """Replace the first target's bytes; return it and the bad line's number."""
    relpath = target_files(tree)[0]
    path = tree / relpath
    raw = path.read_bytes()
    line = raw.count(b"\n", 0, raw.index(b"\nclass ")) + 2  # the first class line
    lines = raw.split(b"\n")
    lines[line - 1] = make_bad(lines[line - 1])
    own_copy(path)
    path.write_bytes(b"\n".join(lines))
    return relpath, line


def test_non_utf8_bytes(tree: Path) -> None:
    relpath, line = _corrupt(tree, lambda text: b"# caf\xe9 \xff\n" + text)
    before = snapshot(tree)
    for command in ("status", "apply"):
        result = run(command, "--vllm-src", str(tree))
        assert_refused(result, f"{relpath}:{line}:", "not valid utf-8")
    assert snapshot(tree) == before


def test_syntax_error(tree: Path) -> None:
    relpath, line = _corrupt(tree, lambda text: text.replace(b"class ", b"clas "))
    before = snapshot(tree)
    for command in ("status", "apply"):
        result = run(command, "--vllm-src", str(tree))
        assert_refused(result, f"{relpath}:{line}:", "syntax error")
    assert snapshot(tree) == before


def test_file_vanishing_between_plan_and_write(
    two_targets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = two_targets
    vanishing = target_files(root)[-1]
    real_plan_tree = plan_module.plan_tree

    def plan_then_delete(*args: object, **kwargs: object) -> plan_module.Plan:
        plan = real_plan_tree(*args, **kwargs)  # type: ignore[arg-type]
        (root / vanishing).unlink()
        return plan

    # apply plans through engine.apply, which holds its own name for plan_tree.
    monkeypatch.setattr(apply_module, "plan_tree", plan_then_delete)
    before = snapshot(root)
    del before[vanishing]
    result = run("apply", "--vllm-src", str(root))
    assert_refused(result, vanishing, "cannot read before writing", "run again")
    assert snapshot(root) == before


def test_dangling_symlink_among_targets(tree: Path) -> None:
    relpath = target_files(tree)[0]
    (tree / relpath).unlink()
    (tree / relpath).symlink_to(tree / "no-such-file.py")
    before = snapshot(tree)
    result = run("apply", "--vllm-src", str(tree))
    assert_refused(result, relpath, "no such file")
    assert snapshot(tree) == before


# -- bad arguments and concurrent runs --------------------------------------------


def test_vllm_src_is_a_file(tree: Path) -> None:
    path = tree / "vllm" / "__init__.py"
    for command in ("status", "apply"):
        result = run(command, "--vllm-src", str(path))
        assert_refused(result, "__init__.py", "is a file, not a directory")


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from deepstack_patch.engine.locks import tree_lock
with tree_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(60)  # bounded: the test kills it long before
"""


def test_second_apply_on_the_same_tree_stops(tree: Path) -> None:
    before = snapshot(tree)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(tree.resolve())],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        result = run("apply", "--vllm-src", str(tree))
        assert_refused(result, "another deepstack-patch run is writing to")
        assert snapshot(tree) == before
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert run("apply", "--vllm-src", str(tree)).exit_code == 0  # lock released


def test_commit_with_a_dirty_tree(tree: Path) -> None:
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "release"], check=True)
    readme = tree / "vllm" / "__init__.py"
    own_copy(readme)
    readme.write_bytes(readme.read_bytes() + b"# local edit\n")
    # The tree's files are hard links to a shared pristine copy: another link
    # to one (as a parallel test makes) changes its ctime, and a plain git
    # status then rewrites .git/index. A refusal must not, so this does it.
    time.sleep(1.1)  # ctime has one-second resolution on some filesystems
    tracked = tree / "vllm" / "envs.py"
    os.link(tracked, tree.parent / "another-link-to-envs.py")
    before = snapshot(tree)
    result = run("apply", "--vllm-src", str(tree), "--commit")
    assert_refused(result, "vllm/__init__.py")
    assert snapshot(tree) == before


# -- downloads -------------------------------------------------------------------

FAKE_VERSION = "0.0.1"


class FakeIndex:
    """A PEP 691 JSON index for one project on 127.0.0.1, with a bad mode."""

    def __init__(self, sdist: bytes) -> None:
        self.sdist = sdist
        self.listed_sha256 = hashlib.sha256(sdist).hexdigest()
        self.truncate = False
        index = self

        class Handler(IndexHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                filename = f"vllm-{FAKE_VERSION}.tar.gz"
                if self.path.rstrip("/") == "/simple/vllm":
                    body = json.dumps(
                        {
                            "meta": {"api-version": "1.0"},
                            "name": "vllm",
                            "files": [
                                {
                                    "filename": filename,
                                    "url": f"/files/{filename}",
                                    "hashes": {"sha256": index.listed_sha256},
                                }
                            ],
                        }
                    ).encode()
                    self._send(body, "application/vnd.pypi.simple.v1+json")
                elif self.path == f"/files/{filename}":
                    body = index.sdist
                    self.send_response(200)
                    self.send_header("Content-Type", "application/gzip")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    # A truncated download: the connection ends early.
                    self.wfile.write(body[: len(body) // 2] if index.truncate else body)
                    self.close_connection = True
                else:
                    self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 10
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple/"


@pytest.fixture
def fake_index(tmp_path: Path) -> Iterator[tuple[FakeIndex, dict[str, str]]]:
    index = FakeIndex(tiny_sdist(FAKE_VERSION))
    thread = threading.Thread(target=index.server.serve_forever, daemon=True)
    thread.start()
    # Stops by itself even if the test hangs: the daemon thread dies with the
    # session, and the timer shuts the server after a minute.
    timer = threading.Timer(60, index.server.shutdown)
    timer.daemon = True
    timer.start()
    env = {
        "PIP_INDEX_URL": index.url,
        "DEEPSTACK_PATCH_CACHE": str(tmp_path / "cache"),
    }
    try:
        yield index, env
    finally:
        timer.cancel()
        index.server.shutdown()
        index.server.server_close()
        thread.join(timeout=10)


def _download(tmp_path: Path, env: dict[str, str]) -> tuple[Result, Path]:
    out = tmp_path / "out"
    result = run("status", "--release", FAKE_VERSION, "--out", str(out), env=env)
    return result, out


def _cached(tmp_path: Path) -> list[str]:
    sdists = tmp_path / "cache" / "sdists"
    return (
        sorted(p.name for p in sdists.glob("*") if not p.name.endswith(".lock"))
        if sdists.is_dir()
        else []
    )


def test_download_good_control(
    fake_index: tuple[FakeIndex, dict[str, str]], tmp_path: Path
) -> None:
    """The fake index serves a good release: proves the harness itself works."""
    _index, env = fake_index
    result, out = _download(tmp_path, env)
    assert result.exit_code == 0, result.output
    assert (out / "vllm" / "__init__.py").is_file()
    # The tarball, and the index's sha256 recorded beside it as verified.
    assert _cached(tmp_path) == [
        f"vllm-{FAKE_VERSION}.tar.gz",
        f"vllm-{FAKE_VERSION}.tar.gz.sha256",
    ]


def test_download_hash_mismatch(
    fake_index: tuple[FakeIndex, dict[str, str]], tmp_path: Path
) -> None:
    index, env = fake_index
    index.listed_sha256 = hashlib.sha256(b"another file").hexdigest()
    result, out = _download(tmp_path, env)
    assert_refused(result, f"vllm-{FAKE_VERSION}.tar.gz", "does not match")
    assert not out.exists()
    assert _cached(tmp_path) == []


def test_download_truncated(
    fake_index: tuple[FakeIndex, dict[str, str]], tmp_path: Path
) -> None:
    index, env = fake_index
    index.truncate = True
    result, out = _download(tmp_path, env)
    assert_refused(result, f"vllm-{FAKE_VERSION}.tar.gz")
    assert not out.exists()
    assert _cached(tmp_path) == []

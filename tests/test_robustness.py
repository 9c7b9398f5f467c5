"""What a new user meets around the rewrite (issue 12), through the command line.

Every test runs the installed command in a subprocess, as a user or a CI step
would: two runs at once, killed runs, Ctrl-C, root and other users, read-only
folders, git hooks and odd repositories, piped output. Trees are real
releases (0.20.2, 0.20.0) from the shared cache: either a whole extraction
made by the command under test, or a private copy of the partial extraction
`status` reads (the patches' files and the version metadata), which is small
enough to copy, chown and commit.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from deepstack_patch.fetch.releases import (
    cached_release,
    download_release,
    find_release,
)
from deepstack_patch.patches import SERIES

from tests import support

GRANITE = "vllm/model_executor/models/granite4_vision.py"
MODELS = "vllm/model_executor/models"
SPEED_DOC = Path(__file__).resolve().parent.parent / "docs" / "speed.md"


# The work trees these tests snapshot may be git checkouts: git's own files
# change with every command and say nothing about the tree.
snapshot = functools.partial(support.snapshot, skip=(".git",))


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "deepstack_patch", *args]


def cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, ``error:`` and ``hint:``, no traceback, every fragment said."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "error:" in result.stderr and "hint:" in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr}"
    return result.stderr


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def cached(version: str) -> Path:
    return cached_release(version) or download_release(find_release(version))


@pytest.fixture
def partial_copy(tmp_path: Path) -> Callable[[str], Path]:
    """``partial_copy("0.20.2")``: a private, writable copy of what status reads."""
    from deepstack_patch.distribution.matrix import status_tree

    def get(version: str, name: str = "tree") -> Path:
        patterns = [pattern for patch in SERIES for pattern in patch.paths]
        source = status_tree(cached(version), version, patterns).root
        return Path(shutil.copytree(source, tmp_path / name))

    return get


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def gather(children: set[int], pid: int) -> set[int]:
    """Add ``pid``'s live descendants to ``children``; return them all."""
    children.update(descendants(pid))
    return children


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


# -- 1. two runs into one folder ------------------------------------------------


@pytest.mark.release
def test_two_applies_into_one_folder_at_once(tmp_path: Path) -> None:
    cached("0.20.2")
    out = tmp_path / "vllm-0.20.2"
    runs = [
        subprocess.Popen(
            command("apply", "--release", "0.20.2", "--out", str(out)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (stdout, stderr) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, stdout + stderr
    # One run applied the series; the other reused its tree and found it done.
    assert sorted("applied now" in stdout for stdout, _ in outputs) == [False, True]
    reference = tmp_path / "reference"
    assert cli("apply", "--release", "0.20.2", "--out", str(reference)).returncode == 0
    expected = snapshot(reference)
    assert len(expected) > 1000 and snapshot(out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reference", "vllm-0.20.2"]


# -- 2. owner, group, xattrs, hard links ----------------------------------------


@pytest.mark.release
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_rewrite_keeps_owner_group_xattrs_and_names_hard_links(
    partial_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    tree = partial_copy("0.20.2")
    target = tree / GRANITE
    try:
        os.setxattr(target, "user.test", b"kept")
    except OSError:
        pytest.skip("this file system has no user xattrs")
    os.chown(target, 1234, 1234)
    other_name = tmp_path / "granite-other-name.py"
    os.link(target, other_name)
    old = target.read_bytes()
    result = cli("apply", "--vllm-src", str(tree))
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() != old  # rewritten...
    status = target.stat()
    assert (status.st_uid, status.st_gid) == (1234, 1234)  # ...keeping its owner
    assert os.getxattr(target, "user.test") == b"kept"
    assert other_name.read_bytes() == old
    warning = " ".join(result.stderr.split())
    assert f"{GRANITE} has 1 other hard link(s); they keep the old content" in warning


# -- 3. killed and interrupted runs -----------------------------------------------


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index that accepts connections and never answers: workers block."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/simple/"
    finally:
        listener.close()


def _start_matrix(tmp_path: Path, index: str) -> subprocess.Popen[str]:
    """A matrix whose two workers wait on the index (releases not cached)."""
    releases = tmp_path / "releases.txt"
    releases.write_text("0.0.98\n0.0.99\n")
    env = {
        **os.environ,
        "DEEPSTACK_PATCH_CACHE": str(tmp_path / "cache"),
        "PIP_INDEX_URL": index,
        "PIP_DEFAULT_TIMEOUT": "300",
    }
    return subprocess.Popen(
        command("matrix", "--releases", str(releases), "--jobs", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def _workers(matrix: subprocess.Popen[str], children: set[int]) -> None:
    """Wait until the pool's processes exist and are waiting on the index."""
    # Two workers and the resource tracker.
    assert wait_for(lambda: len(gather(children, matrix.pid)) >= 3, 60), children
    time.sleep(2)
    gather(children, matrix.pid)


@pytest.mark.release
def test_killed_matrix_leaves_no_process_behind(
    tmp_path: Path, silent_index: str
) -> None:
    matrix = _start_matrix(tmp_path, silent_index)
    children: set[int] = set()
    try:
        _workers(matrix, children)
        os.kill(matrix.pid, signal.SIGKILL)
        matrix.wait(timeout=30)
        assert wait_for(lambda: not any(alive(pid) for pid in children), 10), [
            Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children if alive(pid)
        ]
        # Nobody holds the caller's pipe any more: a CI step would not hang.
        assert matrix.stdout is not None and matrix.stdout.read() == ""
    finally:
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.release
def test_ctrl_c_on_matrix_exits_130(tmp_path: Path, silent_index: str) -> None:
    matrix = _start_matrix(tmp_path, silent_index)
    children: set[int] = set()
    try:
        _workers(matrix, children)
        os.killpg(matrix.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        _stdout, stderr = matrix.communicate(timeout=60)
        assert matrix.returncode == 130, stderr
        assert stderr.rstrip().endswith("interrupted") and "Traceback" not in stderr
        assert wait_for(lambda: not any(alive(pid) for pid in children), 10)
    finally:
        for pid in children | {matrix.pid}:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _start_extraction(out: Path) -> subprocess.Popen[str]:
    cached("0.20.2")
    run = subprocess.Popen(
        command("status", "--release", "0.20.2", "--out", str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The staging folder appears beside the destination once extraction runs.
    assert wait_for(lambda: bool(hidden(out.parent)), 60), "no staging folder seen"
    time.sleep(0.3)
    return run


@pytest.mark.release
def test_killed_extraction_is_cleaned_up_by_the_next_run(tmp_path: Path) -> None:
    out = tmp_path / "vllm-0.20.2"
    run = _start_extraction(out)
    run.kill()
    run.wait(timeout=30)
    assert hidden(tmp_path), "the kill left nothing: the test tests nothing"
    result = cli("status", "--release", "0.20.2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert hidden(tmp_path) == []
    assert (out / "vllm" / "__init__.py").is_file()


@pytest.mark.release
def test_ctrl_c_during_extraction_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "vllm-0.20.2"
    run = _start_extraction(out)
    run.send_signal(signal.SIGINT)
    _stdout, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    assert stderr.rstrip().endswith("interrupted") and "Traceback" not in stderr
    assert hidden(tmp_path) == [] and not out.exists()


# -- 4. states and selections ---------------------------------------------------


@pytest.mark.release
def test_left_out_requirement_is_needed_with_its_reason(
    partial_copy: Callable[[str], Path],
) -> None:
    tree = partial_copy("0.20.0")
    skip = ("--skip", "vllm#40932")
    result = cli("status", "--vllm-src", str(tree), *skip, "--format", "json")
    assert result.returncode == 0, result.stdout
    patches = {p["id"]: p for p in json.loads(result.stdout)["patches"]}
    blocked = patches["vllm#43617"]
    assert blocked["state"] == "needed"
    assert blocked["blocked_by"] == ["vllm#40932"]
    assert "requires vllm#40932, which is not selected" in blocked["reason"]
    assert all(loc["state"] != "drifted" for loc in blocked["locations"])
    assert not [p for p in patches.values() if p["state"] == "drifted"]
    text = cli("status", "--vllm-src", str(tree), *skip)
    assert text.returncode == 0
    assert "requires vllm#40932, which is not selected" in text.stdout
    # The counts line names every state ("0 drifted"): no patch drifted.
    assert "drifted" not in text.stdout.replace(" 0 drifted,", "")
    before = snapshot(tree)
    refused(
        cli("apply", "--vllm-src", str(tree), *skip),
        "vllm#43617 requires vllm#40932, which is not selected",
    )
    assert snapshot(tree) == before


@pytest.mark.release
def test_empty_selection_is_an_error(partial_copy: Callable[[str], Path]) -> None:
    tree = str(partial_copy("0.20.2"))
    empty = ("--only", "vllm#40917", "--skip", "vllm#40917")
    for args in (
        ("status", "--vllm-src", tree, *empty),
        ("apply", "--vllm-src", tree, "--check", *empty),
        ("apply", "--vllm-src", tree, *empty),
    ):
        refused(cli(*args), "the selection is empty")
    refused(cli("apply", "--vllm-src", tree, "--check", "--only", "vllm#1"), "vllm#1")


@pytest.mark.release
def test_apply_shows_the_state_after_the_run(
    partial_copy: Callable[[str], Path],
) -> None:
    tree = partial_copy("0.20.2")
    needed = {
        p["id"]
        for p in json.loads(
            cli("status", "--vllm-src", str(tree), "--format", "json").stdout
        )["patches"]
        if p["state"] == "needed"
    }
    assert needed, "nothing needed on 0.20.2: the test tests nothing"
    result = cli("apply", "--vllm-src", str(tree), "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document["applied"]) == needed
    for patch in document["patches"]:
        assert patch["applied_now"] == (patch["id"] in needed)
        if patch["id"] in needed:
            assert patch["state"] == "applied", patch
            assert {loc["state"] for loc in patch["locations"]} == {"applied"}
    # What apply says now is what status reads afterwards.
    after = json.loads(
        cli("status", "--vllm-src", str(tree), "--format", "json").stdout
    )
    assert {p["id"]: p["state"] for p in after["patches"]} == {
        p["id"]: p["state"] for p in document["patches"]
    }
    text_tree = partial_copy("0.20.2", "text-tree")
    text = cli("apply", "--vllm-src", str(text_tree))
    assert text.returncode == 0
    rows = [
        line
        for line in text.stdout.splitlines()
        if line.startswith("vllm#") and "  follow-up: " not in line
    ]
    assert len(rows) == len(SERIES)
    for row in rows:
        assert ("applied (applied now)" in row) == (row.split()[0] in needed), row
        assert "needed" not in row


# -- 7. no tracebacks, right hints ----------------------------------------------


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder on a read-only bind mount: not writable, even for root."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)])
    if mounted.returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.release
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only folder")
def test_read_only_places_are_errors_with_hints(
    read_only_folder: Path, partial_copy: Callable[[str], Path]
) -> None:
    cached("0.20.2")
    tree = partial_copy("0.20.2")
    hint = f"hint: {read_only_folder} is on a read-only file system"
    out = str(read_only_folder / "vllm-0.20.2")
    series = str(read_only_folder / "series")
    refused(cli("apply", "--release", "0.20.2", "--out", out), hint)
    refused(cli("export", "--vllm-src", str(tree), "--series", series), hint)
    refused(cli("apply", "--release", "0.20.2", cwd=read_only_folder), hint)
    assert list(read_only_folder.iterdir()) == []


def test_usage_errors_have_the_projects_format() -> None:
    for args, name in (
        (("status", "--format", "xml"), "status"),
        (("apply", "--frobnicate"), "apply"),
    ):
        result = cli(*args)
        stderr = refused(result, f"hint: run 'deepstack-patch {name} --help'")
        assert stderr.startswith("error:"), stderr


def test_errors_are_json_with_format_json(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = cli("status", "--vllm-src", str(missing), "--format", "json")
    refused(result, str(missing))
    document = json.loads(result.stdout)
    assert document["schema"] == 1 and document["command"] == "status"
    assert set(document["error"]) == {"message", "path", "line", "hint"}
    assert str(missing) in document["error"]["message"] and document["error"]["hint"]


@pytest.mark.release
def test_json_error_names_the_file_and_line(
    partial_copy: Callable[[str], Path],
) -> None:
    tree = partial_copy("0.20.2")
    target = tree / GRANITE
    lines = target.read_text().splitlines(keepends=True)
    lines[9] = "def broken(:\n"
    target.write_text("".join(lines))
    result = cli("status", "--vllm-src", str(tree), "--format", "json")
    refused(result, f"error: {GRANITE}:10: syntax error")
    error = json.loads(result.stdout)["error"]
    assert (error["path"], error["line"]) == (GRANITE, 10)
    assert error["message"].startswith("syntax error")


def _private_cache(tmp_path: Path, content: bytes) -> dict[str, str]:
    """A cache holding ``content`` as the verified 0.20.2 tarball; no index."""
    import hashlib

    sdists = tmp_path / "cache" / "sdists"
    sdists.mkdir(parents=True)
    (sdists / "vllm-0.20.2.tar.gz").write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    (sdists / "vllm-0.20.2.tar.gz.sha256").write_text(digest)
    return {
        **os.environ,
        "DEEPSTACK_PATCH_CACHE": str(tmp_path / "cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",
    }


@pytest.mark.release
def test_corrupt_cached_tarball_says_delete_it(tmp_path: Path) -> None:
    env = _private_cache(tmp_path, cached("0.20.2").read_bytes()[: 5 << 20])
    out = tmp_path / "vllm-0.20.2"
    result = cli("status", "--release", "0.20.2", "--out", str(out), env=env)
    archive = tmp_path / "cache" / "sdists" / "vllm-0.20.2.tar.gz"
    refused(result, "corrupt", f"delete the cached tarball {archive}")
    assert not out.exists() and hidden(tmp_path) == []


@pytest.mark.release
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tiny tmpfs")
def test_full_disk_says_free_space(tmp_path: Path) -> None:
    cached("0.20.2")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        result = cli("status", "--release", "0.20.2", "--out", str(disk / "vllm"))
        stderr = refused(result, "full", "free some space")
        assert "delete" not in stderr
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.release
def test_read_only_folder_hint_names_the_folder(
    partial_copy: Callable[[str], Path],
) -> None:
    tree = partial_copy("0.20.2")
    folder = tree / MODELS
    before = snapshot(tree)
    folder.chmod(0o555)
    try:
        refused(cli("apply", "--vllm-src", str(tree)), f"chmod u+w {folder}")
    finally:
        folder.chmod(0o755)
    assert snapshot(tree) == before


def _git(tree: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()


def _committed(tree: Path) -> Path:
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(
        tree,
        "-c",
        "user.name=Test",
        "-c",
        "user.email=t@example.com",
        "commit",
        "-qm",
        "vLLM 0.20.2",
    )
    _git(tree, "config", "user.name", "Test")
    _git(tree, "config", "user.email", "t@example.com")
    return tree


@pytest.mark.release
@pytest.mark.skipif(os.geteuid() != 0, reason="chowns the repository")
def test_dubious_ownership_is_named(
    partial_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    tree = _committed(partial_copy("0.20.2"))
    for path in [tree, *tree.rglob("*")]:
        os.lchown(path, 1234, 1234)
    config = tmp_path / "gitconfig"
    config.write_text("")  # no safe.directory anywhere
    env = {**os.environ, "GIT_CONFIG_GLOBAL": str(config), "GIT_CONFIG_NOSYSTEM": "1"}
    stderr = refused(
        cli("apply", "--vllm-src", str(tree), "--commit", env=env),
        "dubious ownership",
        f"git config --global --add safe.directory {tree}",
    )
    assert "no commit yet" not in stderr


@pytest.mark.release
def test_symlinked_vllm_folder_is_reported_as_such(
    partial_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    real = partial_copy("0.20.2")
    tree = tmp_path / "linked"
    tree.mkdir()
    shutil.copy(real / "PKG-INFO", tree / "PKG-INFO")
    (tree / "vllm").symlink_to(real / "vllm")
    refused(
        cli("status", "--vllm-src", str(tree)),
        f"vllm/: is a symlink to {real / 'vllm'}, outside the tree",
    )


@pytest.mark.release
def test_commit_on_a_detached_head_names_the_commit(
    partial_copy: Callable[[str], Path],
) -> None:
    tree = _committed(partial_copy("0.20.2"))
    _git(tree, "checkout", "-q", "--detach")
    result = cli("apply", "--vllm-src", str(tree), "--commit")
    assert result.returncode == 0, result.stderr
    head = _git(tree, "rev-parse", "HEAD")
    warning = " ".join(result.stderr.split())
    assert (
        "HEAD is detached" in warning
        and f"git switch -c <branch> {head[:12]}" in warning
    )


@pytest.mark.release
def test_commit_with_dry_run_says_what_conflicts(
    partial_copy: Callable[[str], Path],
) -> None:
    tree = _committed(partial_copy("0.20.2"))
    stderr = refused(
        cli("apply", "--vllm-src", str(tree), "--commit", "--dry-run"), "--dry-run"
    )
    assert "--allow-dirty" not in stderr


# -- 8. all the commits or none -------------------------------------------------

FAILING_SECOND_TIME = """#!/bin/sh
count=$(cat .git/hook-count 2>/dev/null || echo 0)
count=$((count + 1))
echo $count > .git/hook-count
[ $count -lt 2 ] || { echo "hook says no" >&2; exit 1; }
"""


@pytest.mark.release
def test_failing_hook_on_the_second_commit_undoes_the_first(
    partial_copy: Callable[[str], Path],
) -> None:
    tree = _committed(partial_copy("0.20.2"))
    hook = tree / ".git" / "hooks" / "prepare-commit-msg"
    hook.write_text(FAILING_SECOND_TIME)
    hook.chmod(0o755)
    head, before = _git(tree, "rev-parse", "HEAD"), snapshot(tree)
    stderr = refused(cli("apply", "--vllm-src", str(tree), "--commit"), "undid")
    assert (tree / ".git" / "hook-count").read_text().strip() == "2"  # 2nd failed
    assert _git(tree, "rev-parse", "HEAD") == head
    assert _git(tree, "status", "--porcelain") == ""
    assert snapshot(tree) == before
    assert "nothing was committed" in " ".join(stderr.split())


# -- 9. piped output ------------------------------------------------------------


@pytest.mark.release
def test_piped_output_is_neither_wrapped_nor_padded(
    partial_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    tree = partial_copy("0.20.2")
    result = cli("status", "--vllm-src", str(tree))
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert len(lines) > 10 and not [line for line in lines if line != line.rstrip()]
    long_location = (
        "vllm/model_executor/models/qwen3_vl.py:1904 "
        "Qwen3VLForConditionalGeneration.prepare_encoder_cudagraph_capture_inputs"
    )
    assert any(long_location in line for line in lines), result.stdout
    deep = tmp_path / ("a-long-folder-name-" * 6) / "vllm-src"
    error = cli("status", "--vllm-src", str(deep))
    assert error.returncode == 2
    assert not error.stderr.startswith("\n")
    assert str(deep) in error.stderr.splitlines()[0]


@pytest.mark.release
def test_backport_prints_progress_lines_when_piped(tmp_path: Path) -> None:
    cached("0.20.2")
    out = tmp_path / "backport"
    result = cli(
        "backport",
        "--release",
        "0.20.2",
        "--out",
        str(out),
        "--local-version",
        "DeepStack_2",
    )
    assert result.returncode == 0, result.stderr
    assert not result.stderr.startswith("\n")
    for step in ("vllm-0.20.2.tar.gz", "extracting", "repacking"):
        assert step in result.stderr, result.stderr
    # 10. the local version in PEP 440's normal form
    assert "0.20.2+deepstack.2" in result.stdout
    assert (out / "vllm-0.20.2+deepstack.2.tar.gz").is_file()


# -- 10. papercuts ----------------------------------------------------------------


def test_list_json_names_its_command() -> None:
    document = json.loads(cli("list", "--format", "json").stdout)
    assert document["command"] == "list" and document["schema"] == 1


def test_matrix_help_says_cache() -> None:
    text = " ".join(cli("matrix", "--help").stdout.split())
    assert "cache" in text and "temporary folder" not in text


@pytest.mark.release
def test_matrix_on_a_release_without_expectations_says_so(tmp_path: Path) -> None:
    cached("0.20.2")
    targets = tmp_path / "targets.toml"
    targets.write_text('releases = ["0.20.0"]\n')
    releases = tmp_path / "releases.txt"
    releases.write_text("0.20.2\n")
    args = ("matrix", "--releases", str(releases), "--targets", str(targets))
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    assert "no expectations for 0.20.2" in result.stdout
    assert "all as expected" not in result.stdout
    assert "matrix ... 1/1 (0.20.2 ok)" in result.stderr  # piped progress
    document = json.loads(cli(*args, "--format", "json").stdout)
    assert document["no_expectations"] == ["0.20.2"]


@pytest.mark.release
def test_tree_without_version_metadata_is_named_as_such(
    partial_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    tree = partial_copy("0.20.2")
    (tree / "PKG-INFO").unlink()
    (tree / "vllm" / "_version.py").unlink(missing_ok=True)
    result = cli("status", "--vllm-src", str(tree))
    assert result.returncode == 0
    assert "unknown" not in result.stdout.splitlines()[0]
    assert "no version metadata" in result.stdout
    series = tmp_path / "series"
    assert (
        cli("export", "--vllm-src", str(tree), "--series", str(series)).returncode == 0
    )
    texts = [path.read_text() for path in series.iterdir()]
    assert len(texts) > 1
    assert not [text for text in texts if "vLLM unknown" in text]
    assert any("an unversioned vLLM tree" in text for text in texts)


@pytest.mark.release
def test_status_release_reads_a_partial_extraction_and_says_where(
    tmp_path: Path,
) -> None:
    cached("0.20.2")
    result = cli("status", "--release", "0.20.2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing extracted here
    assert "partial extraction in the cache" in result.stderr


@pytest.mark.release
def test_speed_doc_row_counts_what_apply_does_on_0_20_2(tmp_path: Path) -> None:
    cached("0.20.2")
    result = cli("status", "--release", "0.20.2", "--format", "json", cwd=tmp_path)
    needed = [p for p in json.loads(result.stdout)["patches"] if p["state"] == "needed"]
    files = {path for patch in needed for path in patch["files"]}
    assert needed and files
    row = f"`apply` (fresh copy, {len(needed)} patches, {len(files)} files)"
    assert row in SPEED_DOC.read_text()


# -- issue 25: every error a user can meet has a hint ----------------------------


def test_every_error_raised_in_the_code_has_a_hint() -> None:
    """A DeepstackError without a hint prints ``error:`` and no ``hint:``
    (``apply --vllm-src T --out D``, ``watch --reviewed missing.toml``)."""
    import ast

    package = Path(__file__).resolve().parent.parent
    raised, without = 0, []
    for folder in ("rewriter", "patches"):
        for path in sorted((package / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                match node:
                    case ast.Call(func=ast.Name(id="DeepstackError")):
                        raised += 1
                        hints = [k.value for k in node.keywords if k.arg == "hint"]
                        hint = [*node.args[1:2], *hints]
                        if not hint or hint[0] == ast.Constant(""):
                            without.append(f"{path.name}:{node.lineno}")
    assert raised > 100  # the walk found the errors
    assert not without, f"DeepstackError without a hint: {without}"


@pytest.mark.parametrize(
    "args",
    [
        ("apply", "--vllm-src", "{tree}", "--out", "{tmp}/D"),
        ("status", "--installed", "--out", "{tmp}/D"),
        (
            "watch",
            "--since",
            "0.20.2",
            "--until",
            "0.20.2",
            "--reviewed",
            "{tmp}/no.toml",
        ),
        ("wheel", "--wheel", "{tmp}/vllm-0.20.2-py3-none-any.whl", "--platform", "x"),
        ("wheel", "--wheel", "{tmp}/vllm-0.20.2-py3-none-any.whl"),
        ("matrix", "--releases", "{tmp}/bad.toml"),
        ("apply", "--vllm-src", "{tree}", "--vllm-src", "{tmp}"),
        ("status", "--release", "0.20.2", "--release", "0.21.0"),
        ("apply", "--vllm-src", "{tree}"),  # no version, none of the files
        ("export", "--vllm-src", "{tree}", "--series", "{tmp}/series"),
        ("doctor", "--python", "/bin/ls"),
        ("apply", "--installed", "--python", "/bin/ls"),
    ],
)
def test_bad_input_is_an_error_with_a_hint_and_writes_nothing(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    """Issue 25's bad inputs: exit 2, ``error:`` and ``hint:``, nothing written
    (the tree is a stray ``vllm/__init__.py``, no vLLM tree)."""
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("")
    (tmp_path / "bad.toml").write_text("releases = [\n")
    before = support.snapshot(tmp_path)
    result = cli(*(a.format(tree=tree, tmp=tmp_path) for a in args), cwd=tmp_path)
    refused(result)
    assert support.snapshot(tmp_path) == before


def test_the_nearest_release_is_suggested() -> None:
    from deepstack_patch.fetch.index import nearest_release

    versions = ["0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0"]
    versions += ["0.22.0rc1", "0.22.0", "0.33.0"]
    for asked, nearest in [
        ("v0.20.2", "0.20.2"),  # a tag's name
        ("0.20", "0.20.2"),  # a partial version: the newest of that minor
        ("0.21", "0.21.0"),
        ("0.20.9", "0.20.2"),  # no such patch release: the closest before
        ("0.0.1", "0.19.0"),
        ("latest", "0.33.0"),  # no version at all: the newest
    ]:
        assert nearest_release(asked, versions) == nearest, asked
    assert nearest_release("0.20", []) is None


@pytest.mark.release
@pytest.mark.parametrize("asked", ["v0.20.2", "0.20"])
def test_a_release_not_on_the_index_suggests_the_nearest(
    asked: str, tmp_path: Path
) -> None:
    for args in (
        ["status", "--release", asked],
        ["apply", "--release", asked],
        ["wheel", "--release", asked, "--out", "wheels"],
    ):
        result = cli(*args, cwd=tmp_path)
        stderr = refused(result, "hint: did you mean 0.20.2?")
        assert stderr.startswith("error:"), stderr  # nothing downloaded, nor said
        assert list(tmp_path.iterdir()) == []


@pytest.mark.release
def test_a_refused_extraction_says_nothing_before_the_error(tmp_path: Path) -> None:
    cached("0.20.2")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    before = support.snapshot(tmp_path)
    result = cli("apply", "--release", "0.20.2", "--out", str(taken))
    stderr = refused(result, f"{taken} exists and is not an extraction")
    assert stderr.startswith("error:"), stderr  # no "extracting ... into ..."
    assert support.snapshot(tmp_path) == before


@pytest.mark.release
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only folder")
def test_a_read_only_destination_is_refused_before_any_progress(
    read_only_folder: Path,
) -> None:
    cached("0.20.2")
    for out in (read_only_folder, read_only_folder / "vllm-0.20.2"):
        result = cli("apply", "--release", "0.20.2", "--out", str(out))
        stderr = refused(result, f"hint: {read_only_folder} is on a read-only file")
        assert stderr.startswith("error: cannot extract into"), stderr
    assert list(read_only_folder.iterdir()) == []


@pytest.mark.release
def test_a_read_only_tree_names_every_unwritable_place_in_one_error(
    partial_copy: Callable[[str], Path],
) -> None:
    """Not the folder, then the file, then the next folder, one per run."""
    tree = partial_copy("0.20.2")
    needed = json.loads(
        cli("status", "--vllm-src", str(tree), "--format", "json").stdout
    )["patches"]
    files = sorted({f for p in needed if p["state"] == "needed" for f in p["files"]})
    folders = sorted({str(Path(f).parent) for f in files})
    assert len(files) > 1 and len(folders) > 1
    subprocess.run(["chmod", "-R", "a-w", str(tree)], check=True)
    try:
        before = snapshot(tree)
        result = cli("apply", "--vllm-src", str(tree))
        stderr = refused(result, f"{len(files) + len(folders)} places", "chmod u+w")
        error = stderr.split("hint:")[0]
        for place in [*files, *(f"{folder}/" for folder in folders)]:
            assert place in error, place
        assert snapshot(tree) == before
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(tree)], check=True)

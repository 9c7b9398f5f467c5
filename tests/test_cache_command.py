"""``deepstack-patch cache``: the cache's size per kind, and clearing it
(issue 36 item 7), as a user runs it, on a private cache made here.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deepstack_patch.fetch.cache_kinds import KINDS

from tests.test_json_schemas import errors as schema_errors

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400


def cli(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "cache", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DEEPSTACK_PATCH_CACHE": str(cache), "NO_COLOR": "1"},
    )


def age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then), follow_symlinks=False)


def read_only_tree(folder: Path, files: dict[str, bytes]) -> None:
    """An extracted tree as the cache keeps it: read-only."""
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    for path in sorted(folder.rglob("*"), reverse=True):
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
    folder.chmod(0o555)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """Two tarballs (one old), two commit trees (one old), an environment
    with its lock, a lock file and a folder this version does not know."""
    root = tmp_path / "cache"
    sdists = root / "sdists"
    sdists.mkdir(parents=True)
    for version, size, days in (("0.20.2", 3000, 1), ("0.19.1", 2000, 40)):
        tarball = sdists / f"vllm-{version}.tar.gz"
        tarball.write_bytes(b"x" * size)
        (sdists / f"vllm-{version}.tar.gz.sha256").write_text("0" * 64)
        (sdists / f"vllm-{version}.tar.gz.lock").write_text("")
        age(tarball, days)
        age(sdists / f"vllm-{version}.tar.gz.sha256", days)
    trees = root / "commit-trees"
    for name, days in (("6ea6c4265938-aaaa", 0), ("30e333ca5f01-bbbb", 45)):
        read_only_tree(trees / name, {"vllm/__init__.py": b"", "vllm/x.py": b"y" * 500})
        age(trees / name, days)
    env = root / "envs" / "cpu-1234"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_bytes(b"p" * 700)
    (root / "envs" / "cpu-1234.lock").write_text("")
    (root / "locks").mkdir()
    (root / "locks" / "extract-0000.lock").write_text("")
    (root / "mystery").mkdir()
    (root / "mystery" / "thing").write_bytes(b"m" * 10)
    return root


def kinds(result: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert schema_errors("cache", document) == []
    return {kind["kind"]: kind for kind in document["kinds"]}


def test_cache_shows_each_kinds_size_and_entries(cache: Path) -> None:
    found = kinds(cli(cache, "--format", "json"))
    # A tarball and its stamp are one entry; lock files are not entries.
    assert (found["sdists"]["entries"], found["sdists"]["bytes"]) == (2, 5128)
    assert (found["commit-trees"]["entries"], found["commit-trees"]["bytes"]) == (
        2,
        1000,
    )
    assert (found["envs"]["entries"], found["envs"]["bytes"]) == (1, 700)
    assert found["locks"]["entries"] == 0
    assert found["mystery"]["holds"].startswith("not known")
    text = cli(cache)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"cache: {cache} (")
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("commit-")]
    assert line.split()[:4] == ["commit-trees", "1.0", "kB", "2"], line
    assert "read again from the clone" in line


def test_clear_a_kind_removes_its_read_only_trees_and_nothing_else(
    cache: Path,
) -> None:
    result = cli(cache, "--clear", "commit-trees", "--format", "json")
    found = kinds(result)
    assert sorted(found["commit-trees"]["cleared"]) == [
        "30e333ca5f01-bbbb",
        "6ea6c4265938-aaaa",
    ]
    assert found["commit-trees"]["freed_bytes"] == 1000
    assert found["commit-trees"]["bytes"] == 0
    assert list((cache / "commit-trees").iterdir()) == []
    assert json.loads(result.stdout)["freed_bytes"] == 1000
    assert (cache / "sdists" / "vllm-0.19.1.tar.gz").is_file()  # other kinds kept
    assert (cache / "envs" / "cpu-1234" / "bin" / "python").is_file()
    text = cli(cache, "--clear", "commit-trees")
    assert "cleared commit-trees: 0 entries, 0 B freed" in text.stdout


def test_clear_all_older_than_removes_only_old_entries_and_never_locks(
    cache: Path,
) -> None:
    preview = kinds(cli(cache, "--older-than", "30", "--format", "json"))
    assert (preview["sdists"]["old_entries"], preview["sdists"]["old_bytes"]) == (
        1,
        2064,
    )
    assert (cache / "sdists" / "vllm-0.19.1.tar.gz").is_file()  # nothing removed
    found = kinds(
        cli(cache, "--clear", "all", "--older-than", "30", "--format", "json")
    )
    assert found["sdists"]["cleared"] == ["vllm-0.19.1.tar.gz"]
    assert found["commit-trees"]["cleared"] == ["30e333ca5f01-bbbb"]
    assert found["envs"]["cleared"] == []
    left = sorted(p.name for p in (cache / "sdists").iterdir())
    assert left == [
        "vllm-0.19.1.tar.gz.lock",  # a lock stays; the stamp went with its tarball
        "vllm-0.20.2.tar.gz",
        "vllm-0.20.2.tar.gz.lock",
        "vllm-0.20.2.tar.gz.sha256",
    ]
    assert (cache / "commit-trees" / "6ea6c4265938-aaaa").is_dir()
    assert (cache / "locks" / "extract-0000.lock").is_file()


def test_an_entry_another_run_holds_is_left_and_said(cache: Path) -> None:
    from filelock import FileLock

    lock = FileLock(str(cache / "envs" / "cpu-1234.lock"))
    with lock:  # as verify holds it while it builds or uses the environment
        result = cli(cache, "--clear", "envs")
    assert result.returncode == 0, result.stderr
    assert (cache / "envs" / "cpu-1234" / "bin" / "python").is_file()
    assert "left 1 envs entries another run holds: cpu-1234" in result.stdout
    again = kinds(cli(cache, "--clear", "envs", "--format", "json"))
    assert again["envs"]["cleared"] == ["cpu-1234"]


@pytest.mark.parametrize(
    ("kind", "said"),
    [("locks", "lock files are never cleared"), ("tarballs", "no such kind")],
)
def test_what_cannot_be_cleared_is_an_error(cache: Path, kind: str, said: str) -> None:
    result = cli(cache, "--clear", kind)
    assert result.returncode == 2
    assert said in result.stderr and "hint:" in result.stderr
    assert (cache / "locks" / "extract-0000.lock").is_file()


def test_every_folder_the_code_keeps_in_the_cache_is_a_known_kind() -> None:
    """The table of kinds stays true: a folder the code writes under the
    cache that ``cache`` does not describe fails here."""
    used: set[str] = set()
    for path in (ROOT / "rewriter").rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r'cache_dir\(\)\s*/\s*"([\w.-]+)', text))
        used |= set(re.findall(r'Path\(base\)\s*/\s*"([\w.-]+)"', text))
    # Folders named through a constant of their module.
    from deepstack_patch.fetch import cache, releases, wheels

    used |= {cache.SDISTS, wheels.WHEELS, releases.VERSIONS_FILE.split("/")[0]}
    assert {"commit-trees", "partial-trees", "envs", "live"} <= used
    assert used <= {kind.name for kind in KINDS}, used - {k.name for k in KINDS}

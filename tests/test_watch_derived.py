"""watch and derived patches (issue 36 item 4), through the command line.

- A derived patch's footprint is every unit it has: a fix that changes a
  class attribute (as vllm#51997 changes ``stop_sequences`` of a request
  model) is watched, and an upstream change to that attribute is reported.
- ``watch --vllm-git`` with a clone that lacks the release tags (a bare
  mirror whose tags stop long before) names the path given and is refused
  before any release is read.

The releases are two small synthetic sdists placed in a private cache as
verified downloads, with the cached list of versions, so neither the index
nor the network is asked.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

PROTOCOL = "vllm/entrypoints/toy/protocol.py"

#: Two releases of a request model; the second changes the watched attribute.
RELEASES = {
    "0.20.1": """from pydantic import BaseModel, Field


class ToyRequest(BaseModel):
    model: str
    stop_sequences: list[str] | None = None
""",
    "0.20.2": """from pydantic import BaseModel, Field


class ToyRequest(BaseModel):
    model: str
    stop_sequences: list[str] | None = Field(default=None, max_length=8)
""",
}

#: The fix, on 0.20.1: the class attribute gains a bound.
FIXED = RELEASES["0.20.1"].replace(
    "stop_sequences: list[str] | None = None",
    "stop_sequences: list[str] | None = Field(default=None, max_length=4)",
)


def sdist(version: str, files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def release_files(version: str) -> dict[str, str]:
    return {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        "vllm/__init__.py": "",
        "vllm/entrypoints/__init__.py": "",
        "vllm/entrypoints/toy/__init__.py": "",
        PROTOCOL: RELEASES[version],
    }


def cache_with_releases(cache: Path) -> None:
    """Both releases as verified downloads, and the list of versions."""
    folder = cache / "sdists"
    folder.mkdir(parents=True)
    for version in RELEASES:
        data = sdist(version, release_files(version))
        (folder / f"vllm-{version}.tar.gz").write_bytes(data)
        (folder / f"vllm-{version}.tar.gz.sha256").write_text(
            hashlib.sha256(data).hexdigest()
        )
    versions = cache / "index" / "vllm-source-versions.json"
    versions.parent.mkdir()
    versions.write_text(json.dumps({"versions": list(RELEASES)}))


def cli(
    cache: Path, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DEEPSTACK_PATCH_CACHE": str(cache),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",  # never asked
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )


def git_diff(path: str, before: str, after: str) -> str:
    import difflib

    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        f"a/{path}",
        f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


@pytest.fixture
def derived(tmp_path: Path) -> tuple[Path, Path]:
    """The cache, and a folder with the fix derived on 0.20.1 (``derive``)."""
    cache = tmp_path / "cache"
    cache_with_releases(cache)
    base = tmp_path / "base"
    for name, text in release_files("0.20.1").items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PROTOCOL, RELEASES["0.20.1"], FIXED))
    out = tmp_path / "patches"
    made = cli(
        cache, "derive", "--diff", str(diff), "--base-src", str(base),
        "--id", "acme#51", "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    assert "class-attribute ToyRequest.stop_sequences" in made.stdout, made.stdout
    return cache, out


def test_a_derived_patchs_footprint_is_every_unit_and_watch_sees_them(
    derived: tuple[Path, Path],
) -> None:
    cache, patches = derived
    listed = cli(
        cache, "list", "--footprint", "--release", "0.20.1", "--patches", str(patches),
        "--format", "json",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (found,) = [
        f for f in json.loads(listed.stdout)["footprints"] if f["id"] == "acme#51"
    ]
    assert found["functions"] == [
        {
            "path": PROTOCOL,
            "line": 6,
            "symbol": "ToyRequest.stop_sequences",
            "why": "rewritten by the patch",
            "kind": "statement",
        }
    ]
    text = cli(
        cache, "list", "--footprint", "--release", "0.20.1", "--patches", str(patches)
    )
    assert "acme#51  1 statement\n" in text.stdout, text.stdout
    assert f"statement ToyRequest.stop_sequences  {PROTOCOL}:6" in text.stdout

    watched = cli(
        cache, "watch", "--since", "0.20.1", "--until", "0.20.2",
        "--patches", str(patches), "--format", "json",
    )  # fmt: skip
    assert watched.returncode == 1, watched.stdout + watched.stderr  # new change
    document = json.loads(watched.stdout)
    (change,) = [c for c in document["changes"] if c["patch"] == "acme#51"]
    assert change["symbol"] == "ToyRequest.stop_sequences"
    assert change["class"] == "new"
    assert "max_length=8" in change["diff"]


def test_watch_vllm_git_without_the_tags_names_the_path_given_first(
    derived: tuple[Path, Path], tmp_path: Path
) -> None:
    pytest.importorskip("git")
    cache, patches = derived
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", "mirror.git"], cwd=work, check=True)
    result = cli(
        cache, "watch", "--since", "0.20.1", "--until", "0.20.2",
        "--patches", str(patches), "--vllm-git", "mirror.git", cwd=work,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: --vllm-git mirror.git: no tag v0.20.1, v0.20.2" in result.stderr
    assert "hint:" in result.stderr and "git fetch --tags" in result.stderr
    # Refused before any release was read: no partial extraction was made.
    assert "watching" not in result.stderr, result.stderr
    assert not (cache / "partial-trees").exists()

"""``status --release`` answers for the release as released (issue 36 item 2).

What a release needs must not depend on the folder the command runs in:
``apply --release 0.20.2`` leaves a patched ``./vllm-0.20.2``, and a later
``status --release 0.20.2`` in that folder still reads the release itself.
The release here is a small synthetic sdist placed in a private cache as a
verified download, so no index is asked and nothing is downloaded.
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

from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

VERSION = "0.20.2"
GRANITE = "vllm/model_executor/models/granite4_vision.py"


def cached_sdist(cache: Path) -> None:
    """A verified ``vllm-0.20.2.tar.gz`` in ``cache`` where vllm#40917 is needed."""
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n",
        "vllm/__init__.py": "",
        GRANITE: granite.BEFORE,
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sdist = cache / "sdists" / f"vllm-{VERSION}.tar.gz"
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(buffer.getvalue())
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    sdist.with_name(sdist.name + ".sha256").write_text(digest)


def cli(cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DEEPSTACK_PATCH_CACHE": str(cache),
        # An index nothing listens on: the verified tarball must be enough.
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",
    }
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def state(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    patches = json.loads(result.stdout)["patches"]
    (found,) = [p["state"] for p in patches if p["id"] == "vllm#40917"]
    return found


def test_status_release_does_not_read_a_patched_folder_here(tmp_path: Path) -> None:
    cache, patched_here, elsewhere = (tmp_path / n for n in ("c", "here", "other"))
    cached_sdist(cache)
    patched_here.mkdir()
    elsewhere.mkdir()
    applied = cli(patched_here, cache, "apply", "--release", VERSION)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (patched_here / f"vllm-{VERSION}" / GRANITE).read_text() == granite.AFTER

    json_status = ("status", "--release", VERSION, "--only", "vllm#40917")
    json_status += ("--format", "json")
    here = cli(patched_here, cache, *json_status)
    other = cli(elsewhere, cache, *json_status)
    # The same answer in both folders: the release as released needs the fix.
    assert state(here) == state(other) == "needed"
    # Which tree was read, and why the folder here was not, in one line each.
    text = ("status", "--release", VERSION, "--only", "vllm#40917")
    here, other = cli(patched_here, cache, *text), cli(elsewhere, cache, *text)
    assert "partial extraction in the cache" in here.stderr, here.stderr
    assert f"./vllm-{VERSION} is not read" in here.stderr, here.stderr
    assert f"--out vllm-{VERSION}" in here.stderr
    assert "is not read" not in other.stderr
    # --out names the patched folder: read as it is.
    named = cli(patched_here, cache, *json_status, "--out", f"vllm-{VERSION}")
    assert state(named) == "applied"


def test_status_help_says_the_release_is_read_as_released() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "status", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        check=True,
    )
    words = " ".join(result.stdout.split())
    assert "default ./vllm-VERSION" not in words
    assert "reads the release as released, whatever folder it runs in" in words

"""Output that says no more than is true (issue 36 item 5), as a user runs it.

- ``matrix --patches D``: a derived patch has no expectation in the targets
  file; the run says so, never "all as expected" for what it did not compare.
- ``backport --help`` names every output backport writes, and their number.
- ``status --only X``: the patches left out are one line, not a table.
- On an 80-column terminal (a pty), a part's state stays beside its part and
  no field (``import StageMissingLayer``, a ``path:line``) is broken.
- A part whose file the tree lacks is not-applicable because the file is
  absent, not because "no function X in path".

Releases are small synthetic sdists in a private cache, as verified
downloads: no index or network is asked.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import tarfile
import termios
from pathlib import Path

import pytest
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite
from deepstack_patch.patches import qwen3_vl_deepstack_without_vision as skipped_tower
from deepstack_patch.patches import sampler_batch_recompile as sampler

VERSION = "0.20.2"
GRANITE = "vllm/model_executor/models/granite4_vision.py"
TOY = "vllm/toy.py"
TOY_TEXT = "def answer():\n    return 41\n"


def write_files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def release_files() -> dict[str, str]:
    return {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n",
        "vllm/__init__.py": "",
        GRANITE: granite.BEFORE,
        TOY: TOY_TEXT,
    }


def cache_with_release(cache: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in release_files().items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sdist = cache / "sdists" / f"vllm-{VERSION}.tar.gz"
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(buffer.getvalue())
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    sdist.with_name(sdist.name + ".sha256").write_text(digest)


def environment(cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DEEPSTACK_PATCH_CACHE": str(cache),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",  # never asked
        "NO_COLOR": "1",
        "SOURCE_DATE_EPOCH": "1700000000",
    }


def cli(
    cache: Path, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment(cache),
        cwd=cwd,
    )


@pytest.fixture
def work(tmp_path: Path) -> tuple[Path, Path]:
    """The cache holding the release, and a folder with a derived patch
    (``acme#7``, made by ``derive`` on the release's toy module)."""
    cache = tmp_path / "cache"
    cache_with_release(cache)
    base = write_files(tmp_path / "base", release_files())
    after = TOY_TEXT.replace("41", "42")
    diff = tmp_path / "fix.diff"
    diff.write_text(
        f"diff --git a/{TOY} b/{TOY}\n"
        + "".join(
            difflib.unified_diff(
                TOY_TEXT.splitlines(True),
                after.splitlines(True),
                f"a/{TOY}",
                f"b/{TOY}",
            )
        )
    )
    out = tmp_path / "patches"
    made = cli(
        cache, "derive", "--diff", str(diff), "--base-src", str(base),
        "--id", "acme#7", "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    return cache, out


# -- matrix ----------------------------------------------------------------------


def test_matrix_says_no_expectation_for_a_derived_patch(
    work: tuple[Path, Path], tmp_path: Path
) -> None:
    cache, patches = work
    targets = tmp_path / "targets.toml"
    targets.write_text(
        f'releases = ["{VERSION}"]\n\n[patches."vllm#40917"]\ncpu_tests = []\n'
        f'gpu_tests = []\n\n[patches."vllm#40917".expected]\n"{VERSION}" = "needed"\n'
    )
    matrix = ("matrix", "--targets", str(targets), "--jobs", "1")
    matrix += ("--patches", str(patches))
    # The built-in patch is compared, the derived one only shown.
    both = cli(cache, *matrix, "--only", "vllm#40917", "--only", "acme#7")
    assert both.returncode == 0, both.stdout + both.stderr
    assert (
        "no expectation for acme#7: the targets file has no row for it, so its "
        "states are shown, not compared"
    ) in both.stdout, both.stdout
    assert both.stdout.rstrip().endswith(
        "all as expected (1 compared; no expectation for 1)"
    ), both.stdout
    # Only the derived one: nothing was compared, and nothing says otherwise.
    alone = cli(cache, *matrix, "--only", "acme#7")
    assert "as expected" not in alone.stdout, alone.stdout
    assert alone.stdout.rstrip().endswith("nothing to compare"), alone.stdout
    document = json.loads(
        cli(cache, *matrix, "--only", "acme#7", "--format", "json").stdout
    )
    assert document["patches_without_expectations"] == ["acme#7"]
    assert document["releases"][0]["states"]["acme#7"] == "needed"


# -- backport --help -----------------------------------------------------------------

NUMBERS = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def test_backport_help_names_every_output_it_writes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache_with_release(cache)
    out = tmp_path / "out"
    done = cli(cache, "backport", "--release", VERSION, "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    written = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert len(written) >= 4, written
    help_text = cli(cache, "backport", "--help").stdout
    label = f"{VERSION}+deepstack.1"
    for name in written:
        generic = name.replace(label, "VERSION+LABEL")
        shown = generic + ("/" if (out / name).is_dir() else "")
        assert shown in help_text, f"{shown} not in backport --help:\n{help_text}"
    assert f"0 all {NUMBERS[len(written)]} written" in " ".join(help_text.split())


# -- status --only -----------------------------------------------------------------


def test_status_only_shows_the_patches_left_out_in_one_line(tmp_path: Path) -> None:
    tree = write_files(tmp_path / "tree", release_files())
    done = cli(
        tmp_path / "cache", "status", "--vllm-src", str(tree), "--only", "vllm#40917"
    )
    assert done.returncode == 0, done.stderr
    from deepstack_patch.patches import SERIES

    others = [p.id for p in SERIES if p.id != "vllm#40917"]
    (line,) = [line for line in done.stdout.splitlines() if "skipped" in line]
    assert line == f"skipped (not selected): {', '.join(others)}"
    for patch_id in others:  # nowhere else: no rows, no locations
        assert done.stdout.count(patch_id) == 1, done.stdout


# -- not-applicable where the file is absent -----------------------------------------


def test_a_part_whose_file_is_absent_says_the_file_is_absent(
    work: tuple[Path, Path], tmp_path: Path
) -> None:
    cache, patches = work
    files = release_files()
    del files[TOY]
    tree = write_files(tmp_path / "other", files)
    done = cli(
        cache, "status", "--vllm-src", str(tree), "--patches", str(patches),
        "--only", "acme#7", "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (patch,) = [p for p in json.loads(done.stdout)["patches"] if p["selected"]]
    assert patch["state"] == "not-applicable"
    (part,) = patch["parts"]
    assert part["reason"] == f"target absent: {TOY} is not in this tree"
    # Where the file is there and the unit is not, the unit is named.
    files[TOY] = "def question():\n    return '?'\n"
    other = write_files(tmp_path / "lacks-the-unit", files)
    done = cli(
        cache, "status", "--vllm-src", str(other), "--patches", str(patches),
        "--only", "acme#7", "--format", "json",
    )  # fmt: skip
    (patch,) = [p for p in json.loads(done.stdout)["patches"] if p["selected"]]
    assert patch["parts"][0]["reason"] == (
        f"target absent: no function answer in {TOY} in this tree"
    )


# -- an 80-column terminal -------------------------------------------------------------

#: A model file whose path makes a location too long to sit beside the
#: other columns at 80: the table stacks its last column.
LONG_MODEL = "vllm/model_executor/models/qwen3_omni_moe_thinker_tiny.py"


def run_in_pty(argv: list[str], columns: int = 80) -> tuple[str, int]:
    """``argv`` on a pseudo-terminal ``columns`` wide: its output, exit code."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of that size, as a user's shell gives
        env = {**os.environ, "COLUMNS": str(columns), "LINES": "200", "TERM": "xterm"}
        env.pop("NO_COLOR", None)
        os.execvpe(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 200, columns, 0, 0))
    output = b""
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], 120)
            data = os.read(fd, 65536) if ready else b""
        except OSError:  # the child has gone: the terminal is closed
            break
        if not data:
            break
        output += data
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode("utf-8", "replace"))
    return text.replace("\r\n", "\n"), os.waitstatus_to_exitcode(status)


def test_an_80_column_terminal_breaks_no_field(tmp_path: Path) -> None:
    tree = write_files(
        tmp_path / "tree",
        {
            "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n",
            "vllm/__init__.py": "",
            "vllm/v1/sample/ops/logprobs.py": sampler.COMPILED_BEFORE,
            "vllm/v1/sample/sampler.py": sampler.CALLER_BEFORE,
            LONG_MODEL: skipped_tower.BEFORE,
        },
    )
    argv = [sys.executable, "-m", "deepstack_patch", "status", "--vllm-src", str(tree)]
    argv += ["--only", "vllm#38933", "--only", "vllm#49397"]
    text, code = run_in_pty(argv)
    assert code == 0, text
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    # The table is stacked (a location is too long to sit beside the others)...
    assert any(line.strip() == f"{LONG_MODEL}:6" for line in lines), text
    # ... and a part's state stays on its part's line.
    for part in ("compiled-count", "callers-mark-unbacked"):
        (line,) = [line for line in lines if f"part {part}" in line]
        assert line.split() == ["needed", "part", part], text
    # A symbol with a space is one field: whole on one line.
    assert any(line.strip() == "import StageMissingLayer" for line in lines), text
    assert not any(line.rstrip().endswith(" import") for line in lines), text
    for line in lines:  # every location's path:line is whole
        if LONG_MODEL[:20] in line:
            assert re.search(rf"{re.escape(LONG_MODEL)}:\d+", line), line

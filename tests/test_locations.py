"""Where the commands say a patch's code is (issue 31, items 2 and 3).

After ``apply`` writes, every ``file:line`` it prints is a line of the file
as written, the line ``status`` then reads (not the line before the write:
a patch earlier in the file moves what follows). A derived patch points at a
unit's ``def`` (or its first decorator), the line a hand-written patch
points at, never at the blank line above it. Run as a user runs them, on
the real release 0.20.2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import link_copy
from tests.support.derived_cli import cli, derived_folder

#: ``path:line symbol``, as the text table shows a location.
LOCATION = re.compile(r"^\s*(\S+\.py):(\d+) (\S.*)$")


def text_locations(output: str) -> list[tuple[str, int, str]]:
    found = [
        (m[1], int(m[2]), m[3]) for m in map(LOCATION.match, output.splitlines()) if m
    ]
    assert found, output
    return found


def json_locations(output: str) -> list[tuple[str, str, str, str, int]]:
    found = [
        (patch["id"], loc["path"], loc["symbol"], loc["part"], loc["line"])
        for patch in json.loads(output)["patches"]
        for loc in patch["locations"]
    ]
    assert found
    return found


@pytest.mark.release
def test_apply_prints_the_lines_of_the_files_it_wrote(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    """0.20.2: vllm#49397 adds lines to qwen3_vl.py's ``__init__``, so
    ``prepare_encoder_cudagraph_capture_inputs`` (vllm#38040, rewritten too)
    moves from line 1904 to 1907; apply says 1907, as status then does."""
    tree = link_copy(release_tree("0.20.2"), tmp_path / "text")
    applied = cli("apply", "--vllm-src", str(tree))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    status = cli("status", "--vllm-src", str(tree))
    assert status.returncode == 0, status.stderr
    assert text_locations(applied.stdout) == text_locations(status.stdout)
    moved = "vllm/model_executor/models/qwen3_vl.py:1907"
    assert f"{moved} Qwen3VLForConditionalGeneration.prepare_encoder" in applied.stdout

    tree = link_copy(release_tree("0.20.2"), tmp_path / "json")
    applied = cli("apply", "--vllm-src", str(tree), "--format", "json")
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["written"]
    status = cli("status", "--vllm-src", str(tree), "--format", "json")
    assert json_locations(applied.stdout) == json_locations(status.stdout)


def test_lines_after_follows_kept_lines_and_replaced_runs() -> None:
    from deepstack_patch.engine.apply import lines_after

    old = b"a\nb\nc\nd\ne\nf\n"
    new = b"a\nB\nB2\nB3\nc\ne\nf\nz\n"  # b replaced by three, d deleted
    moved = lines_after(old, new)
    assert [moved(line) for line in range(1, 7)] == [1, 2, 5, 6, 6, 7]


@pytest.mark.release
def test_a_derived_unit_is_where_the_hand_written_patch_says_it_is(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    """vllm#49397 derived from upstream's diff, on 0.20.2: each ``__init__``
    at its ``def`` line (qwen3_vl.py:1636), as the built-in vllm#49397
    says, not at the blank line above it (1635)."""
    folder = derived_folder("vllm#49397", "local#49397", release_tree, tmp_path)
    status = cli(
        "status", "--vllm-src", str(release_tree("0.20.2")), "--patches",
        str(folder), "--format", "json",
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    lines: dict[str, dict[tuple[str, str], int]] = {}
    for patch_id, path, symbol, _part, line in json_locations(status.stdout):
        lines.setdefault(patch_id, {})[path, symbol] = line
    derived, built_in = lines["local#49397"], lines["vllm#49397"]
    methods = [key for key in derived if key[1].endswith(".__init__")]
    assert len(methods) == 3, derived
    assert {key: derived[key] for key in methods} == {
        key: built_in[key] for key in methods
    }
    qwen3_vl = "vllm/model_executor/models/qwen3_vl.py"
    assert derived[qwen3_vl, "Qwen3VLForConditionalGeneration.__init__"] == 1636

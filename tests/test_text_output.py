"""Text output where it goes: a pipe is never padded, boxed or wrapped; an
80-column terminal breaks lines only between whole fields.

Each command runs on a real release (0.20.2), as a user runs it: piped
(``subprocess`` with captured output) and under a pseudo-terminal of 80
columns (``script``), and through rich's own console at width 80.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.distribution.matrix import ReleaseResult
from deepstack_patch.engine.plan import Plan
from deepstack_patch.output import tables
from deepstack_patch.output.plain import PlainConsole
from deepstack_patch.patches import SERIES
from rich.console import Console

from tests.support import TARGETS, link_copy, site_of
from tests.support.plans import ReleasePlans

WIDTH = 80
BOX_DRAWING = re.compile("[\u2500-\u257f]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
TIMING = re.compile(r"\b\d+(?:\.\d+)? m?s\b")
RULE = re.compile(r"([-=_~*#.])\1{9,}")


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "deepstack_patch", *args]


@pytest.fixture(scope="module")
def runs(
    release_tree: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every command with text output, as a user types it on 0.20.2: its
    words and its environment."""
    root = release_tree("0.20.2")
    work = tmp_path_factory.mktemp("text-output")
    env = dict(os.environ)
    site = site_of(root, work / "site")
    doctor_env = {**env, "PYTHONPATH": str(site)}
    doctor_env["DEEPSTACK_PATCH_CACHE"] = str(work / "doctor-cache")
    releases = work / "releases.txt"
    releases.write_text("0.20.2\n0.17.0\n")
    src = str(root)
    return {
        "list": (["list"], env),
        "list --footprint": (["list", "--footprint", "--vllm-src", src], env),
        "status": (["status", "--vllm-src", src], env),
        "status --verbose": (["status", "--vllm-src", src, "--verbose"], env),
        "apply --check": (["apply", "--vllm-src", src, "--check"], env),
        "apply": (["apply", "--vllm-src", "{copy}"], env),
        "export": (
            ["export", "--vllm-src", src, "--series", str(work / "series")],
            env,
        ),
        "matrix": (["matrix", "--releases", str(releases), "--jobs", "1"], env),
        "doctor": (["doctor"], doctor_env),
    }


def words_of(
    name: str,
    runs: dict[str, tuple[list[str], dict[str, str]]],
    release_tree: Callable[[str], Path],
    tmp_path: Path,
) -> tuple[list[str], dict[str, str]]:
    words, env = runs[name]
    copy = str(link_copy(release_tree("0.20.2"), tmp_path / "vllm-0.20.2"))
    return [copy if word == "{copy}" else word for word in words], env


@pytest.mark.release
def test_piped_apply_installed_and_revert_are_plain(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    site = str(site_of(release_tree("0.20.2"), tmp_path / "site"))
    for words in (["apply", "--vllm-src", site], ["revert", "--vllm-src", site]):
        result = subprocess.run(
            command(*words), capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stdout + result.stderr
        lines = (result.stdout + result.stderr).splitlines()
        assert lines
        assert [line for line in lines if line != line.rstrip()] == []
        assert [line for line in lines if BOX_DRAWING.search(line)] == []
    assert "reverted" in result.stdout


@pytest.mark.verify
def test_piped_verify_draws_no_box(proof_env: object, tmp_path: Path) -> None:
    """verify's table had a box and a rule in a pipe; it has neither now."""
    from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

    tree = tmp_path / "tree"
    model = tree / "vllm/model_executor/models/granite4_vision.py"
    model.parent.mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("")
    (tree / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    model.write_text(granite.AFTER)
    result = subprocess.run(
        command("verify", "--vllm-src", str(tree)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = result.stdout.splitlines()
    assert any(line.startswith("vllm#40917") for line in lines), result.stdout
    assert [line for line in lines if line != line.rstrip()] == []
    assert [line for line in lines if BOX_DRAWING.search(line)] == []


COMMANDS = [
    "list",
    "list --footprint",
    "status",
    "status --verbose",
    "apply --check",
    "apply",
    "export",
    "matrix",
    "doctor",
]


@pytest.mark.release
@pytest.mark.parametrize("name", COMMANDS)
def test_piped_text_is_never_padded_boxed_or_ruled(
    name: str,
    runs: dict[str, tuple[list[str], dict[str, str]]],
    release_tree: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    words, env = words_of(name, runs, release_tree, tmp_path)
    result = subprocess.run(
        command(*words), capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    for stream in (result.stdout, result.stderr):
        lines = stream.splitlines()
        assert [line for line in lines if line != line.rstrip()] == []
        assert [line for line in lines if BOX_DRAWING.search(line)] == []
        assert [line for line in lines if RULE.search(line)] == []
    assert result.stdout.strip(), f"{name} printed nothing"


def ends_of_locations(plan: Plan) -> list[str]:
    found = [
        f"{loc.path}:{loc.finding.line}"
        for report in plan.reports
        for loc in report.locations
    ]
    assert found
    return found


@pytest.mark.release
@pytest.mark.skipif(shutil.which("script") is None, reason="no `script` here")
@pytest.mark.parametrize("name", COMMANDS)
def test_an_80_column_terminal_splits_no_field(
    name: str,
    runs: dict[str, tuple[list[str], dict[str, str]]],
    release_tree: Callable[[str], Path],
    release_plan: ReleasePlans,
    tmp_path: Path,
) -> None:
    """Under a pseudo-terminal of 80 columns: no line is wider, no whitespace
    token of the piped output is cut, and every ``file:line`` is whole."""
    words, env = words_of(name, runs, release_tree, tmp_path)
    piped = subprocess.run(
        command(*words), capture_output=True, text=True, env=env, timeout=600
    ).stdout
    if name == "apply":  # the first run applied; run on a fresh copy
        shutil.rmtree(tmp_path / "vllm-0.20.2")
        words, env = words_of(name, runs, release_tree, tmp_path)
    line = " ".join(subprocess.list2cmdline([word]) for word in command(*words))
    result = subprocess.run(
        ["script", "-qec", line, "/dev/null"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": str(WIDTH), "LINES": "50", "TERM": "xterm"},
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    assert result.returncode in (0, 1), result.stdout
    shown = ANSI.sub("", result.stdout).replace("\r", "")
    lines = shown.split("\n")
    assert [line for line in lines if len(line) > WIDTH] == []
    # durations differ from run to run
    piped, shown = TIMING.sub("N s", piped), TIMING.sub("N s", shown)
    tokens = [token for token in piped.split() if len(token) <= WIDTH]
    assert tokens, f"{name} printed nothing"
    shown_tokens = set(shown.split())
    # The progress lines a terminal gets on stderr are not in the pipe.
    assert [token for token in tokens if token not in shown_tokens] == []
    if name.startswith("status"):
        for location in ends_of_locations(release_plan("0.20.2")):
            assert any(location in line.split() for line in lines), location


def rich_at(width: int) -> Console:
    return Console(
        file=io.StringIO(), width=width, force_terminal=True, highlight=False
    )


def shown_lines(console: Console) -> list[str]:
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return ANSI.sub("", text).split("\n")


@pytest.mark.release
def test_rich_at_80_columns_keeps_every_location_whole(
    release_plan: ReleasePlans,
) -> None:
    """The table code itself (not a command) at 80 columns keeps every
    ``file:line`` of the 0.20.2 plan whole: this test's fact; the plan is
    the run's shared one."""
    plan = release_plan("0.20.2")
    console = rich_at(WIDTH)
    tables.print_tree_header(console, plan.tree)
    tables.print_plan_table(console, plan)
    tables.print_series(console, SERIES)
    lines = shown_lines(console)
    assert [line for line in lines if len(line) > WIDTH] == []
    locations = ends_of_locations(plan)
    for location in locations:
        assert any(location in line.split() for line in lines), location
    # the long Qwen3-Omni location the issue saw cut at `:17` / `73`
    assert any(":1773" in location for location in locations)
    # the same words as in a pipe, none of them cut
    piped = io.StringIO()
    plain = PlainConsole(piped)
    tables.print_tree_header(plain, plan.tree)
    tables.print_plan_table(plain, plan)
    tables.print_series(plain, SERIES)
    assert sorted("\n".join(lines).split()) == sorted(piped.getvalue().split())


def matrix_results(error: str) -> list[ReleaseResult]:
    results = [
        ReleaseResult(
            version,
            states={
                pid: state.value for pid, state in TARGETS.expected(version).items()
            },
        )
        for version in TARGETS.releases[:3]
    ]
    return [*results, ReleaseResult("0.99.0", error=error)]


def test_a_matrix_error_row_keeps_the_columns_narrow() -> None:
    error = (
        "no source release vllm-0.99.0.tar.gz on https://pypi.org/simple/vllm/: "
        "the index lists 0.17.0 to 0.33.0\nsecond line"
    )
    results = matrix_results(error)
    out = io.StringIO()
    ids = [patch.id for patch in SERIES]
    tables.print_matrix(PlainConsole(out), results, [], ids, False, 1.0, 1, TARGETS)
    lines = out.getvalue().splitlines()
    header = lines[0]
    assert header.split() == ["release", *ids]
    # the release column is as wide as a version, whatever the error says
    assert header.index(ids[0]) == len("release  ")
    [row] = [line for line in lines if line.startswith("0.99.0 ")]
    assert len(row) <= len(header)
    assert f"error: 0.99.0: {error}" in out.getvalue()
    # and on an 80-column terminal the table comes in groups, no cell cut
    console = rich_at(WIDTH)
    tables.print_matrix(console, results, [], ids, False, 1.0, 1, TARGETS)
    shown = shown_lines(console)
    table = shown[: next(i for i, s in enumerate(shown) if s.startswith("error"))]
    piped_table = lines[: next(i for i, s in enumerate(lines) if s.startswith("error"))]
    assert [line for line in table if len(line) > WIDTH] == []
    assert set(" ".join(table).split()) == set(" ".join(piped_table).split())

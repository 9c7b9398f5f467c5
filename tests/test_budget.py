"""The guard against a slower suite (issue 35): each run's wall time, each
tier's share, and the budget it is held to (tests/support/budget.py), as
docs/testing.md names them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.support import budget, workers

ROOT = Path(__file__).resolve().parent.parent


def test_a_run_is_held_to_its_tiers_budget() -> None:
    """The whole suite (README's ``python -m pytest``) to the full budget,
    the fast tier's command to the fast budget, anything narrower to none."""
    assert budget.budget_for(True, "", "") == budget.FULL_BUDGET_S == 30 * 60
    fast = budget.budget_for(True, "not  release and not verify", "")
    assert fast == budget.FAST_BUDGET_S == 3 * 60
    assert budget.budget_for(False, "", "") is None  # a file or a node id
    assert budget.budget_for(True, "release", "") is None
    assert budget.budget_for(True, "", "drift") is None


def test_a_test_is_in_the_tier_its_markers_name() -> None:
    assert budget.tier_of(["parametrize", "release", "verify"]) == "verify"
    assert budget.tier_of(["release", "skipif"]) == "release"
    assert budget.tier_of(["parametrize", "usefixtures"]) == "fast"


def test_the_summary_counts_tiers_by_markers_not_by_names() -> None:
    """A test whose id says ``verify`` (a parametrized command) is in the
    fast tier unless it is marked: the tier comes from the markers."""
    named = "tests/test_closed_pipe.py::test_every_commands_help_takes_a_closed_pipe"
    out = pytest_in(f"{named}[verify]", f"{named}[apply]", workers_env=None)
    (passed,) = re.findall(r"(\d+) passed", out)
    assert re.search(rf"^  fast +{passed} tests", out, re.M), out
    assert not re.search(r"^  (verify|release) ", out, re.M), out


def test_the_summary_counts_each_test_once_and_says_over_budget() -> None:
    clock = budget.RunClock(started=budget.time.monotonic() - 125)
    for _phase in ("setup", "call", "teardown"):
        clock.add("t.py::slow", "release", 20.0)
        clock.add("t.py::quick", "fast", 0.5)
    lines = clock.lines(budget_s=60)
    assert lines[0] == "wall time 2m05s for 2 tests", lines
    assert lines[1] == "  fast         1 tests       2s (2% of the tests' time)", lines
    assert lines[2].startswith("  release      1 tests    1m00s (98%"), lines
    assert lines[-1].startswith("OVER this run's budget of 1m00s"), lines
    assert clock.lines(budget_s=3600)[-1].startswith("within this run's budget")
    assert not clock.lines(budget_s=None)[-1].startswith(("OVER", "within"))


def test_testing_md_names_the_budgets() -> None:
    """docs/testing.md's budgets are the ones the summary holds runs to."""
    text = " ".join((ROOT / "docs" / "testing.md").read_text().split())
    found = re.findall(r"budget: (\d+) min", text)
    assert found == [
        str(budget.FAST_BUDGET_S // 60),
        str(budget.FULL_BUDGET_S // 60),
    ], found


# --- two workers, the shared work on one (tests/support/workers.py) ----------


def fake_item(nodeid: str, uses: dict[str, tuple[str, str]]) -> SimpleNamespace:
    """An item using fixtures ``name -> (scope, where defined)``."""
    definitions = {
        name: [SimpleNamespace(scope=scope, baseid=where)]
        for name, (scope, where) in uses.items()
    }
    item = SimpleNamespace(
        nodeid=nodeid,
        fixturenames=list(uses),
        _fixtureinfo=SimpleNamespace(name2fixturedefs=definitions),
        marks=[],
    )
    item.add_marker = item.marks.append
    return item


def test_tests_that_share_a_sessions_work_share_a_worker() -> None:
    """The drift corpus, the comparison and the official wheel's venv each
    keep their tests on one worker, as does a module's own module-scoped
    fixture; a conftest fixture shared by every worker (a release) does not
    tie a test to one; the longest group is handed out first."""
    module = "tests/test_wheel.py"
    items = [
        fake_item("tests/test_a.py::t", {"release_tree": ("session", "tests")}),
        fake_item(f"{module}::t", {"patched_wheel": ("module", module)}),
        fake_item("tests/test_x.py::t", {"official_venv": ("session", "tests")}),
        fake_item("tests/test_b.py::t", {"tmp_path": ("function", "")}),
        fake_item("tests/test_c.py::t", {"comparison": ("session", "tests/test_c.py")}),
        fake_item("tests/test_d.py::t", {"drift_corpus": ("session", "tests")}),
    ]
    groups = [workers.group_of(item) for item in items]  # type: ignore[arg-type]
    assert groups == [
        None,
        module,
        "official-wheel",
        None,
        "drift-corpus",
        "drift-corpus",
    ]
    workers.order_for_workers(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items[:2]] == [
        "tests/test_c.py::t",
        "tests/test_d.py::t",
    ]
    assert [mark.args for mark in items[3].marks] == [(module,)]
    assert items[2].marks == [] and items[5].marks == []


def pytest_in(*args: str, workers_env: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop(workers.WORKERS_ENV, None)
    if workers_env is not None:
        env[workers.WORKERS_ENV] = workers_env
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_whole_run_takes_two_workers_and_a_named_file_one_process() -> None:
    """What README's ``python -m pytest`` does (its own testpaths, here made
    small) runs on two workers; naming a file runs in one process, and so
    does ``DEEPSTACK_PATCH_TEST_WORKERS=0``; the summary counts each test
    once either way."""
    this = "tests/test_budget.py::" + sys._getframe().f_code.co_name
    whole = ("-o", "testpaths=tests/test_budget.py", "--deselect", this)
    named = ("tests/test_budget.py", "--deselect", this)
    runs = {
        "whole": pytest_in(*whole, workers_env="2"),
        "named": pytest_in(*named, workers_env="2"),
        "none": pytest_in(*whole, workers_env="0"),
    }
    assert re.search(r"^created: 2/2 workers", runs["whole"], re.M), runs["whole"]
    assert "workers" not in runs["named"] + runs["none"], runs
    for out in runs.values():
        (passed,) = re.findall(r"(\d+) passed", out)
        assert re.search(rf"^wall time \S+ for {passed} tests$", out, re.M), out

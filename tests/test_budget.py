"""The guard against a slower suite (issue 35): each run's wall time, each
tier's share, and the budget it is held to (tests/support/budget.py), as
docs/testing.md names them."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import budget

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
    assert budget.tier_of({"release": 1, "test_drift.py": 1}) == "release"
    assert budget.tier_of(["test_x", "usefixtures"]) == "fast"


def test_the_summary_counts_each_test_once_and_says_over_budget() -> None:
    clock = budget.RunClock(started=budget.time.monotonic() - 125)
    for _phase in ("setup", "call", "teardown"):
        clock.add("t.py::slow", ["release"], 20.0)
        clock.add("t.py::quick", [], 0.5)
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

"""The test suite's time budget: each tier's share of a run, and the limits.

conftest.py's hooks feed every test's report to a :class:`RunClock`; the
summary at the end of a run prints the wall time, each tier's tests and
time, and whether the run kept its tier's budget (docs/testing.md, issue 35).
A run that adds ten minutes then says so in CI's own output, not a round
later.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

#: The tiers, named by the markers that put a test in them (pyproject.toml).
#: A test marked both ``release`` and ``verify`` is in ``verify``, the tier
#: that needs the most.
TIERS = ("fast", "release", "verify")
#: The fast tier's command line (README, docs/testing.md).
FAST_EXPRESSION = "not release and not verify"
#: Seconds: the fast tier alone, and the whole suite with warm caches, on a
#: 2-core machine (docs/testing.md).
FAST_BUDGET_S = 3 * 60
FULL_BUDGET_S = 30 * 60


def tier_of(markers: Iterable[str]) -> str:
    names = set(markers)
    match names:
        case _ if "verify" in names:
            return "verify"
        case _ if "release" in names:
            return "release"
        case _:
            return "fast"


@dataclass
class TierTime:
    tests: int = 0
    seconds: float = 0.0


@dataclass
class RunClock:
    """Wall time since the session started, and each tier's test time."""

    started: float = field(default_factory=time.monotonic)
    tiers: dict[str, TierTime] = field(
        default_factory=lambda: {tier: TierTime() for tier in TIERS}
    )
    seen: set[str] = field(default_factory=set)

    def add(self, nodeid: str, tier_name: str, took: float) -> None:
        """One phase (setup, call or teardown) of one test in a tier."""
        tier = self.tiers[tier_name]
        tier.seconds += took
        if nodeid not in self.seen:
            self.seen.add(nodeid)
            tier.tests += 1

    def lines(self, budget_s: float | None) -> list[str]:
        wall = time.monotonic() - self.started
        total = sum(t.seconds for t in self.tiers.values()) or 1.0
        ran = sum(t.tests for t in self.tiers.values())
        out = [f"wall time {clock(wall)} for {ran} tests"]
        for name, tier in self.tiers.items():
            if tier.tests:
                out.append(
                    f"  {name:8} {tier.tests:5} tests {clock(tier.seconds):>8} "
                    f"({100 * tier.seconds / total:.0f}% of the tests' time)"
                )
        if budget_s is not None:
            verdict = "within" if wall <= budget_s else "OVER"
            out.append(
                f"{verdict} this run's budget of {clock(budget_s)} "
                "(docs/testing.md: fast tier 3 min, full suite 30 min on 2 cores)"
            )
        return out


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def budget_for(whole_suite: bool, markexpr: str, keyword: str) -> float | None:
    """The budget a run is held to: the whole suite's, the fast tier's, or
    none (a file, a ``-k`` selection: no budget to compare with)."""
    match (whole_suite, " ".join(markexpr.split()), keyword):
        case (True, "", ""):
            return FULL_BUDGET_S
        case (True, expression, "") if expression == FAST_EXPRESSION:
            return FAST_BUDGET_S
        case _:
            return None

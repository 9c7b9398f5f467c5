"""A pytest plugin that writes each test's result as JSON; verify loads it with -p.

pytest runs in the proof environment, where deepstack-patch is not
installed, so this file is copied next to the run and loaded as
``-p deepstack_patch_results --deepstack-results=PATH``. It uses pytest's own
reports (node id, outcome, duration, the crash message), so nothing is
reconstructed from JUnit class names. Standard library and pytest only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if "pytest" in sys.modules:  # loaded as pytest's plugin
    import pytest

    _around = pytest.hookimpl(hookwrapper=True)
else:  # deepstack-patch reads this file's names: no pytest to import
    _around = lambda hook: hook  # noqa: E731

#: The name the copy of this file is loaded under.
MODULE = "deepstack_patch_results"
OPTION = "--deepstack-results"
#: A JSON list of node ids: only those tests (and their parametrizations)
#: run. verify gives pytest whole files with it, since a node id in a file
#: that cannot be imported is a usage error that ends the session.
SELECT_OPTION = "--deepstack-select"
#: Seconds one test (its setup, call and teardown) may take; past them it
#: fails with :data:`RAN_PAST`. Many patches' tests share one run, and a
#: test that hangs (a server that never answers) must not take the others'
#: time.
LIMIT_OPTION = "--deepstack-test-limit"
#: What a test stopped at the limit fails with.
RAN_PAST = "deepstack: the test ran past its time limit"

_results: dict[str, dict[str, Any]] = {}
_config: Any = None


def pytest_addoption(parser: Any) -> None:
    parser.addoption(OPTION, default=None, help="write each test's result here")
    parser.addoption(SELECT_OPTION, default=None, help="run only these node ids")
    parser.addoption(LIMIT_OPTION, default=None, help="seconds a test may take")


class RanPastLimit(Exception):
    """A test stopped at its time limit."""


def _stop(_signum: int, _frame: Any) -> None:
    raise RanPastLimit(RAN_PAST)


@_around
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    """SIGALRM (Unix, the main thread) stops a test at the limit, as
    pytest-timeout's signal method does; elsewhere tests run unlimited."""
    limit = item.config.getoption(LIMIT_OPTION)
    if not limit or not hasattr(signal, "setitimer"):
        yield
        return
    previous = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, float(limit))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    path = config.getoption(SELECT_OPTION)
    if not path:
        return
    wanted = json.loads(Path(path).read_text())

    def chosen(nodeid: str) -> bool:
        return any(
            nodeid == w or nodeid.startswith((w + "[", w + "::")) for w in wanted
        )

    kept = [item for item in items if chosen(item.nodeid)]
    config.hook.pytest_deselected(items=[i for i in items if not chosen(i.nodeid)])
    items[:] = kept


def _message(report: Any) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        return reason.removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(report.longrepr or "")


def _outcome(report: Any, before: str) -> str:
    """The test's outcome so far, given this phase's report."""
    if report.when == "call":
        return report.outcome  # passed, failed, skipped (xfail counts as skipped)
    if report.failed:  # setup or teardown: an error, not a test failure
        return "error" if before in ("", "passed") else before
    if report.skipped:
        return "skipped"
    return before


def pytest_runtest_logreport(report: Any) -> None:
    result = _results.setdefault(
        report.nodeid,
        {"nodeid": report.nodeid, "outcome": "", "message": "", "seconds": 0.0},
    )
    result["seconds"] = round(result["seconds"] + report.duration, 3)
    outcome = _outcome(report, result["outcome"])
    if outcome != result["outcome"] and outcome != "passed":
        result["message"] = _message(report)
    result["outcome"] = outcome
    if report.when == "teardown":
        _write(_config)


def pytest_collectreport(report: Any) -> None:
    if report.failed:  # a module that does not import: its tests never ran
        _results[report.nodeid] = {
            "nodeid": report.nodeid,
            "outcome": "error",
            "message": _message(report),
            "seconds": 0.0,
        }


def pytest_configure(config: Any) -> None:
    global _config
    _config = config


def pytest_sessionfinish(session: Any) -> None:
    _write(session.config)


def _write(config: Any) -> None:
    """The results so far: after each test too, so that a run stopped at its
    time limit still tells the tests that finished."""
    path = config.getoption(OPTION) if config is not None else None
    if path:
        done = [r for r in _results.values() if r["outcome"]]
        # Whole or not at all: a run stopped mid-write leaves the last file.
        partial = Path(f"{path}.partial")
        partial.write_text(json.dumps(done))
        os.replace(partial, path)

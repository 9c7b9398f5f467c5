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
from pathlib import Path
from typing import Any

#: The name the copy of this file is loaded under.
MODULE = "deepstack_patch_results"
OPTION = "--deepstack-results"
#: A JSON list of node ids: only those tests (and their parametrizations)
#: run. verify gives pytest whole files with it, since a node id in a file
#: that cannot be imported is a usage error that ends the session.
SELECT_OPTION = "--deepstack-select"

_results: dict[str, dict[str, Any]] = {}
_config: Any = None


def pytest_addoption(parser: Any) -> None:
    parser.addoption(OPTION, default=None, help="write each test's result here")
    parser.addoption(SELECT_OPTION, default=None, help="run only these node ids")


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

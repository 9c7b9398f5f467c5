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
import threading
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
#: A JSON object: file (relative to the rootdir) -> ``[first, last, part]``
#: line ranges (``executed.py``); each test's result then says which parts
#: it executed (``"reached"``).
WATCH_OPTION = "--deepstack-watch"

_results: dict[str, dict[str, Any]] = {}
_config: Any = None


def pytest_addoption(parser: Any) -> None:
    parser.addoption(OPTION, default=None, help="write each test's result here")
    parser.addoption(SELECT_OPTION, default=None, help="run only these node ids")
    parser.addoption(LIMIT_OPTION, default=None, help="seconds a test may take")
    parser.addoption(WATCH_OPTION, default=None, help="report these lines' parts")


class RanPastLimit(Exception):
    """A test stopped at its time limit."""


def _stop(_signum: int, _frame: Any) -> None:
    raise RanPastLimit(RAN_PAST)


@_around
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    """The test within its limit, and traced where lines are watched.

    SIGALRM (Unix, the main thread) stops a test at the limit, as
    pytest-timeout's signal method does; elsewhere tests run unlimited."""
    limit = item.config.getoption(LIMIT_OPTION)
    timed = bool(limit) and hasattr(signal, "setitimer")
    if timed:
        previous = signal.signal(signal.SIGALRM, _stop)
        signal.setitimer(signal.ITIMER_REAL, float(limit))
    reached: set[str] = set()
    tracing = _watched(item.config)
    if tracing:
        trace = _tracer(tracing, reached)
        threading.settrace(trace)
        sys.settrace(trace)
    try:
        yield
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if tracing:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
            result = _results.get(item.nodeid)
            if result is not None:
                result["reached"] = sorted(reached)
                _write(item.config)


_watch: dict[str, list[tuple[int, int, str]]] | None = None


def _watched(config: Any) -> dict[str, list[tuple[int, int, str]]]:
    """The watched line ranges by the file's path as code objects name it
    (the rootdir's path, and its real path)."""
    global _watch
    if _watch is None:
        _watch = {}
        path = config.getoption(WATCH_OPTION)
        if path:
            root = Path(str(config.rootpath))
            for relpath, spans in json.loads(Path(path).read_text()).items():
                ranges = [(int(a), int(b), str(part)) for a, b, part in spans]
                for name in {str(root / relpath), os.path.realpath(root / relpath)}:
                    _watch[name] = ranges
    return _watch


def _tracer(watch: dict[str, list[tuple[int, int, str]]], reached: set[str]) -> Any:
    """A trace function that looks at lines only in the watched files' frames
    (every other call returns at once) and adds the parts whose lines run."""

    def lines(frame: Any, event: str, _arg: Any) -> Any:
        if event == "line":
            line = frame.f_lineno
            for first, last, part in watch[frame.f_code.co_filename]:
                if first <= line <= last:
                    reached.add(part)
        return lines

    def calls(frame: Any, _event: str, _arg: Any) -> Any:
        return lines if frame.f_code.co_filename in watch else None

    return calls


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
    # A module that does not import, or that skips itself at import
    # (``pytest.skip(..., allow_module_level=True)``, as vLLM's CUDA-only
    # files do): its tests never ran, and this says why.
    if report.failed or report.skipped:
        _results[report.nodeid] = {
            "nodeid": report.nodeid,
            "outcome": "error" if report.failed else "skipped",
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

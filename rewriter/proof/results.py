"""Test results from pytest's own reports (see ``pytest_results.py``)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.proof import code_cache, pytest_results


@dataclass
class TestCase:
    """One test: pytest's node id, its outcome and why."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: str  # passed, failed, error, skipped
    message: str = ""
    seconds: float = 0.0
    #: The changed units it executed (``executed.py``); None: not watched.
    reached: tuple[str, ...] | None = None

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]

    @property
    def name(self) -> str:
        return self.nodeid.rsplit("::", 1)[-1]

    @property
    def classname(self) -> str:
        """JUnit's class name: ``tests.v1.test_x.TestY`` for ``...::TestY::test``."""
        module = self.file.removesuffix(".py").replace("/", ".")
        return ".".join([module, *self.nodeid.split("::")[1:-1]])

    def json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "outcome": self.outcome,
            "message": self.message,
            "seconds": self.seconds,
        }


def plugin_args(results: Path) -> list[str]:
    """pytest's arguments that load the plugins and have one write ``results``."""
    return [
        *("-p", code_cache.MODULE),
        *("-p", pytest_results.MODULE, f"{pytest_results.OPTION}={results}"),
    ]


def copy_plugin(folder: Path) -> Path:
    """The plugins as importable modules in ``folder`` (to put on PYTHONPATH)."""
    shutil.copyfile(code_cache.__file__, folder / f"{code_cache.MODULE}.py")
    target = folder / f"{pytest_results.MODULE}.py"
    shutil.copyfile(pytest_results.__file__, target)
    return target


def read_results(path: Path) -> list[TestCase]:
    """The test cases the plugin wrote to ``path``."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeepstackError(
            f"{path}: cannot read pytest's results: {exc}",
            "pytest stopped before writing them: run again; if it happens "
            "again, run the tests with pytest directly to see why",
        ) from None
    return [
        TestCase(
            r["nodeid"], r["outcome"], r["message"], r["seconds"],
            tuple(r["reached"]) if "reached" in r else None,
        )
        for r in rows
    ]  # fmt: skip

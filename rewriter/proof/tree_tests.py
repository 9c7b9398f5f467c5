"""The tree's own tests: which to run for which patch, and running them.

pytest runs in a subprocess of the proof environment with the tree as its
root; its results come from :mod:`deepstack_patch.proof.results` (a pytest
plugin writing JSON), never from pytest's stdout.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.targets import Targets
from deepstack_patch.proof.forkserver import Spawn, run_subprocess
from deepstack_patch.proof.proofs import TIMEOUT_S, output_text
from deepstack_patch.proof.results import (
    TestCase,
    copy_plugin,
    plugin_args,
    read_results,
)


@dataclass
class TestRun:
    """One pytest run: its command, its cases, and the tests it could not run."""

    __test__ = False

    command: list[str]
    selected: dict[str, list[str]] = field(default_factory=dict)  # nodeid -> ids
    absent: list[str] = field(default_factory=list)
    cases: list[TestCase] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return sum(case.outcome == outcome for case in self.cases)

    @property
    def ok(self) -> bool:
        return not self.error and not any(
            c.outcome in ("failed", "error") for c in self.cases
        )

    def cases_of(self, patch_id: str) -> list[TestCase]:
        mine = [n for n, ids in self.selected.items() if patch_id in ids]
        return [c for c in self.cases if any(_belongs(c, n) for n in mine)]

    def json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "selected": sorted(self.selected),
            "absent": self.absent,
            "tests": len(self.cases),
            "passed": self.count("passed"),
            "failed": self.count("failed"),
            "errors": self.count("error"),
            "skipped": self.count("skipped"),
            "error": self.error,
            "seconds": self.seconds,
            "cases": [c.json() for c in self.cases],
        }


def _belongs(case: TestCase, nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    if case.file != path.split(" ")[0]:
        return False
    own = case.nodeid.partition("::")[2]
    # A module that did not import is reported as one case without a name.
    return not rest or not own or own.startswith(rest)


def select_tests(
    tree: Path,
    targets: Targets,
    patch_ids: Sequence[str],
    kind: str,
    version: str = "",
) -> tuple[dict[str, list[str]], list[str]]:
    """The ``{kind}_tests`` of the patches that exist in ``tree``, and the rest.

    A listed test whose file this release lacks (it came later), or that
    targets.toml limits to other releases, is returned in the second list
    with the reason: reported, never run and never counted as passed.
    """
    selected: dict[str, list[str]] = {}
    absent: list[str] = []
    for patch_id in patch_ids:
        rows = targets.patches.get(patch_id)
        if rows is None:
            continue
        for nodeid in getattr(rows, f"{kind}_tests"):
            runs, why = rows.runs_on(nodeid, version) if version else (True, "")
            if not (tree / nodeid.split("::")[0]).is_file():
                why = "not in this release"
            if not why:
                selected.setdefault(nodeid, []).append(patch_id)
            elif f"{nodeid}: {why}" not in absent:
                absent.append(f"{nodeid}: {why}")
    return selected, absent


#: pytest's option that leaves every conftest.py unloaded.
NO_CONFTEST = "--noconftest"


def pytest_command(
    python: Path,
    tree: Path,
    nodeids: Sequence[str],
    results: Path,
    *,
    gpu: bool = False,
    options: Sequence[str] = (),
    conftest: bool = False,
) -> list[str]:
    """pytest on the tree's own tests, its plugin writing ``results``.

    On CPU the tree's conftest.py is not loaded (``--noconftest``): it imports
    much of vLLM's GPU stack, and its autouse fixtures run around every
    test. ``conftest``: load it all the same (the release tests' round for
    the tests that need its fixtures, release_tests.py). The GPU stage runs
    in an environment with the full wheel, so it keeps the tree's conftest
    and fixtures.
    """
    command = [str(python), "-m", "pytest"]
    command += ["-p", "no:cacheprovider", "-o", "addopts=", "-rs", "-q"]
    if not gpu and not conftest:
        command.append(NO_CONFTEST)
    command += [*options, *plugin_args(results), "--rootdir", str(tree), *nodeids]
    return command


def run_pytest(
    python: Path,
    tree: Path,
    selected: dict[str, list[str]],
    absent: list[str],
    *,
    env: dict[str, str],
    gpu: bool = False,
    timeout: float = TIMEOUT_S,
    spawn: Spawn = run_subprocess,
    options: Sequence[str] = (),
    conftest: bool = False,
) -> TestRun:
    nodeids = sorted(selected)
    with tempfile.TemporaryDirectory(prefix="deepstack-pytest-") as scratch:
        results = Path(scratch) / "results.json"
        command = pytest_command(
            python, tree, nodeids, results, gpu=gpu, options=options,
            conftest=conftest,
        )  # fmt: skip
        run = TestRun(command=command, selected=selected, absent=absent)
        if not nodeids:
            return run
        copy_plugin(Path(scratch))
        path = [env.get("PYTHONPATH", ""), scratch]
        env = dict(env, PYTHONPATH=os.pathsep.join(p for p in path if p))
        started = time.monotonic()
        try:
            done = spawn(command, cwd=tree, env=env, timeout=timeout)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            output = output_text(exc.stdout) + f"\ntimed out after {timeout:.0f} s"
            code = -1
        run.seconds = round(time.monotonic() - started, 1)
        if results.is_file():
            run.cases = read_results(results)
        tail = "\n".join(output.strip().splitlines()[-20:])
        if not run.cases:
            run.error = f"pytest ran no test (exit code {code}):\n{tail}"
        elif code not in (0, 1):
            # 2 interrupted, 3 internal error, 4 usage error: results incomplete.
            run.error = f"pytest stopped with exit code {code}:\n{tail}"
    return run

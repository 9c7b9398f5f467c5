"""The whole suite on two cores: pytest-xdist, the shared work done once.

README's ``python -m pytest`` (CI's) runs on two pytest-xdist workers when
the machine has two cores or more (``DEEPSTACK_PATCH_TEST_WORKERS`` names
another number; ``-n 0`` runs in one process); a run of named files, node
ids or ``-k`` stays in one process, as a developer's loop wants it (``--pdb``
works, the output is in order). What a run computes once stays computed once:

- the releases are extracted once into a folder both workers share (the
  tool's own extraction takes a lock and reuses a finished one);
- the tests that share a session's work run on one worker: every test of
  the drift corpus and the derived-vs-series comparison (``drift-corpus``),
  every test of the official wheel's venv (``official-wheel``), and the
  tests of a module with a module-scoped fixture of its own (that module);
- the facts each worker asserted are written beside the shared folder and
  counted by the run's summary (tests/support/facts.py).

The groups that take longest are handed out first, so that neither worker
is left with a long group at the end of the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

#: The variable naming how many workers a whole run uses (0: one process).
WORKERS_ENV = "DEEPSTACK_PATCH_TEST_WORKERS"
#: Two cores: the machine CI and docs/testing.md's budgets are measured on.
DEFAULT_WORKERS = 2
#: A session fixture whose work must not be repeated per worker -> the group
#: of every test that uses it.
SHARED = {
    "drift_corpus": "drift-corpus",
    "comparison": "drift-corpus",
    "official_venv": "official-wheel",
}
#: Groups handed out first (the longest); the rest keep collection order.
FIRST = ("drift-corpus",)


def workers_for(config: pytest.Config) -> int:
    """How many xdist workers this run gets (0: none)."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return 0
    options = config.option
    narrowed = config.args_source is not pytest.Config.ArgsSource.TESTPATHS
    if (
        getattr(options, "numprocesses", None) is not None  # -n given: theirs
        or narrowed
        or options.keyword
        or options.collectonly
        or options.usepdb
    ):
        return 0
    wanted = os.environ.get(WORKERS_ENV)
    if wanted is not None:
        return int(wanted)
    return DEFAULT_WORKERS if (os.cpu_count() or 1) >= DEFAULT_WORKERS else 0


def group_of(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must share a worker with, or None."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs if info is not None else {}
    for name in item.fixturenames:
        if name in SHARED:
            return SHARED[name]
    module = item.nodeid.partition("::")[0]
    for name in item.fixturenames:
        for definition in definitions.get(name, ()):
            if definition.scope != "function" and definition.baseid == module:
                return module
    return None


def order_for_workers(items: list[pytest.Item]) -> None:
    """Group each item that shares work (xdist's ``loadgroup``) and hand the
    longest groups out first."""
    first: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        (first if group in FIRST else rest).append(item)
    items[:] = first + rest


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def shared_folder(factory: pytest.TempPathFactory, config: pytest.Config) -> Path:
    """The run's folder every worker sees: the controller's base temporary
    folder (a worker's own is inside it)."""
    base = factory.getbasetemp()
    return base.parent if is_worker(config) else base


def write_facts(folder: Path, worker: str, asserted: set[tuple[str, str, str]]) -> None:
    (folder / f"facts-{worker}.json").write_text(json.dumps(sorted(asserted)))


def read_facts(folder: Path) -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for path in folder.glob("facts-*.json"):
        found.update(tuple(fact) for fact in json.loads(path.read_text()))
    return found

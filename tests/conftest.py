"""Shared fixtures: real vLLM releases, fetched once and cached.

Release tarballs come from the package index pip is configured for, through
the tool's own fetching code, into the user cache (``DEEPSTACK_PATCH_CACHE``
overrides it), so a second test run downloads nothing. Each test session
extracts the pristine trees it needs once; tests that write get a copy made
of hard links, which is cheap and safe because the tool only ever replaces
files (write to a temporary file, then rename), never writes into them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.targets import Targets
from deepstack_patch.fetch.releases import (
    download_release,
    extract_release,
    find_release,
)
from deepstack_patch.proof import envs

from tests.support import TARGETS, budget, facts, link_copy, workers
from tests.support.drift import DriftCorpus
from tests.support.plans import ReleasePlans

#: The session's clock: each tier's tests and time (tests/support/budget.py).
CLOCK = budget.RunClock()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The whole suite on two workers (tests/support/workers.py)."""
    count = workers.workers_for(config)
    if count:
        config.option.numprocesses = count
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "loadgroup"  # also for -n N given by hand


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if workers.is_worker(config):
        workers.order_for_workers(items)


def pytest_sessionstart(session: pytest.Session) -> None:
    CLOCK.started = time.monotonic()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker leaves the facts it asserted for the run's summary."""
    config = session.config
    if workers.is_worker(config):
        folder = workers.shared_folder(config._tmp_path_factory, config)
        workers.write_facts(folder, config.workerinput["workerid"], facts.FACTS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Each report names its test's tier, from its markers (the report
    travels from an xdist worker with its attributes)."""
    report = yield
    report.tier = budget.tier_of(mark.name for mark in item.iter_markers())
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    CLOCK.add(report.nodeid, getattr(report, "tier", "fast"), report.duration)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """The run's wall time, each tier's share, its budget; the facts asserted."""
    whole = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    limit = budget.budget_for(whole, config.option.markexpr, config.option.keyword)
    terminalreporter.section("time budget (docs/testing.md)")
    for line in CLOCK.lines(limit):
        terminalreporter.write_line(line)
    folder = workers.shared_folder(config._tmp_path_factory, config)
    facts.FACTS.update(workers.read_facts(folder))
    terminalreporter.write_line(
        f"release x patch facts asserted: {len(facts.FACTS)} "
        f"({facts.FACTS_FILE}=FILE lists them)"
    )
    if (path := facts.facts_file()) is not None:
        facts.write_facts(path)


@pytest.fixture(scope="session")
def targets() -> Targets:
    return TARGETS


@pytest.fixture(scope="session")
def release_tree(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Callable[[str], Path]:
    """``release_tree("0.20.2")``: a pristine extracted release; do not write.

    Extracted once per run, into a folder every worker shares (the
    extraction takes a lock and reuses a finished one)."""
    trees: dict[str, Path] = {}
    root = workers.shared_folder(tmp_path_factory, pytestconfig) / "releases"

    def get(version: str) -> Path:
        if version not in trees:
            archive = download_release(find_release(version))
            tree = extract_release(archive, version, root / f"vllm-{version}")
            trees[version] = tree.root
        return trees[version]

    return get


@pytest.fixture(scope="session")
def release_plan(release_tree: Callable[[str], Path]) -> ReleasePlans:
    """``release_plan("0.20.2", selected, rewrite=True)``: the built-in series
    planned on a pristine release, once per run (tests/support/plans.py);
    read it, never change it."""
    return ReleasePlans(release_tree)


@pytest.fixture(scope="session")
def drift_corpus(
    release_tree: Callable[[str], Path],
    release_plan: ReleasePlans,
    tmp_path_factory: pytest.TempPathFactory,
) -> DriftCorpus:
    """``drift_corpus(patch_id, release)``: the drifted copies of the patch's
    target files on that release, and the series' plan of each, built once
    per run for every file that judges them (tests/support/drift.py)."""
    return DriftCorpus(release_tree, release_plan, tmp_path_factory.mktemp("drift"))


@pytest.fixture
def patched_copy(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> Callable[[str], Path]:
    """``patched_copy("0.20.2")``: a writable hard-link copy of a release."""

    def get(version: str) -> Path:
        return link_copy(release_tree(version), tmp_path / f"vllm-{version}")

    return get


@pytest.fixture(scope="session")
def official_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the official vLLM 0.20.2 wheel installed, once per run for
    every file that needs one; never written to: a test that changes it takes
    a hard-link copy (``tests.support.installed.link_copy_venv``)."""
    from tests.support.installed import install_wheel, make_venv, official_wheel

    root = tmp_path_factory.mktemp("installed") / "venv"
    install_wheel(make_venv(root), official_wheel())
    return root


@pytest.fixture(scope="session")
def proof_env() -> envs.ProofEnv:
    """The managed proof environment (torch on CPU), built on first use.

    Built through the product's own code, as `deepstack-patch verify` builds
    it; ``DEEPSTACK_PATCH_SKIP_VERIFY=1`` skips the tests that need it.
    """
    if os.environ.get("DEEPSTACK_PATCH_SKIP_VERIFY") == "1":
        pytest.skip("DEEPSTACK_PATCH_SKIP_VERIFY=1")
    return envs.ensure_env(
        "cpu", envs.CPU_REQUIREMENTS, lambda line: print(line, file=sys.stderr)
    )

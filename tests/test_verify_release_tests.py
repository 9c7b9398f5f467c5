"""The release's own tests of what a derived patch changes (issue 42, item 1):
selected from ``tests/`` by import and by name (``proof/impact.py``), run
on the pristine tree and on the patched one, each test compared
(``proof/release_tests.py``).

The fast tier selects on small synthetic trees and runs their tests with
this interpreter (no vLLM, no managed environment): a fix that changes a
return value passes the tests that hold the old one on the pristine tree
and fails them after, and verify says so (pass-to-fail, exit 1). The
release tier does it on vLLM 0.20.2 in the managed proof environment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.apply import WRITE, apply_tree
from deepstack_patch.engine.derived import write_derived
from deepstack_patch.engine.series import assemble_series, patches_from_folder
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.proof.envs import ProofEnv
from deepstack_patch.proof.impact import ChangedUnit, select
from deepstack_patch.proof.release_tests import (
    CANNOT_RUN,
    collect,
    compare,
    submit,
)
from deepstack_patch.proof.results import TestCase
from deepstack_patch.proof.tree_tests import TestRun

from tests.support import TARGETS
from tests.test_json_schemas import errors as schema_errors
from tests.test_verify_imports import git_diff

SHAPES = """\
def _area(w, h):
    return w * h


class Box:
    def __init__(self, w, h):
        self.w, self.h = w, h

    def area(self):
        return _area(self.w, self.h)

    def describe(self):
        return f"box of {self.area()}"

    def name(self):
        return "box"


def perimeter(w, h):
    return 2 * (w + h)


def unrelated():
    return 0
"""

#: Each test's name says whether it reaches ``Box.area``.
TEST_SHAPES = """\
import pytest
from vllm.shapes import Box, perimeter, unrelated


@pytest.fixture
def box():
    return Box(2, 3)


def test_reaches_area(box):
    assert box.area() == 6


def test_reaches_area_through_describe():
    assert Box(1, 1).describe() == "box of 1"


def test_names_box_but_not_area():
    assert Box(1, 1).name() == "box"


def test_not_perimeter():
    assert perimeter(1, 2) == 6


def test_not_unrelated():
    assert unrelated() == 0


class TestBox:
    def _make(self):
        return Box(4, 5)

    def test_reaches_area_through_a_helper(self):
        assert self._make().area() == 20

    def test_not_in_class(self):
        assert self._make().name() == "box"
"""

#: Imports the module object: names can still be told by attribute.
TEST_MODULE_OBJECT = """\
from vllm import shapes


def test_reaches_area_by_attribute():
    assert shapes.Box(1, 2).area() == 2


def test_not_by_attribute():
    assert shapes.unrelated() == 0
"""

TEST_NOT_IMPORTING = """\
def test_not_importing():
    assert True
"""


def make_tree(root: Path, shapes: str = SHAPES) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "shapes.py").write_text(shapes)
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_shapes.py").write_text(TEST_SHAPES)
    (root / "tests" / "test_module_object.py").write_text(TEST_MODULE_OBJECT)
    (root / "tests" / "test_other.py").write_text(TEST_NOT_IMPORTING)
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    return root


AREA = ChangedUnit("vllm/shapes.py", "method", "Box.area")


def test_selection_by_import_then_by_name(tmp_path: Path) -> None:
    selection = select(make_tree(tmp_path), [AREA])
    assert sorted(selection.tests) == [
        "tests/test_module_object.py::test_reaches_area_by_attribute",
        "tests/test_shapes.py::TestBox::test_reaches_area_through_a_helper",
        "tests/test_shapes.py::test_reaches_area",
        "tests/test_shapes.py::test_reaches_area_through_describe",
    ]
    assert all(parts == [AREA.part] for parts in selection.tests.values())
    assert selection.importers == [
        "tests/test_module_object.py",
        "tests/test_shapes.py",
    ]
    assert selection.unreached == [] and selection.reason == ""


def test_a_hand_written_patch_s_units_are_where_it_was_found(tmp_path: Path) -> None:
    """A patch with no derived units (a built-in one) changes the functions
    and methods its findings name; a changed file where none was named, or
    only an import, changes as a whole."""
    from deepstack_patch.proof.impact import units_of

    units = units_of(
        object(),
        ["vllm/shapes.py", "vllm/other.py"],
        [("vllm/shapes.py", "Box.area"), ("vllm/other.py", "import StageMissingLayer")],
    )
    assert units == [AREA, ChangedUnit("vllm/other.py", "module-statement", "")]
    assert (
        select(make_tree(tmp_path), units[:1]).tests
        == select(make_tree(tmp_path / "again"), [AREA]).tests
    )


def test_a_changed_helper_is_reached_through_the_names_that_call_it(
    tmp_path: Path,
) -> None:
    """``_area`` is private: a test reaches it through ``Box``'s methods."""
    helper = ChangedUnit("vllm/shapes.py", "function", "_area")
    selection = select(make_tree(tmp_path), [helper])
    # Box's code calls _area: a test that names Box reaches it, whichever
    # method (the method narrowing is for a changed method alone).
    assert "tests/test_shapes.py::test_names_box_but_not_area" in selection.tests
    assert "tests/test_shapes.py::test_not_perimeter" not in selection.tests
    assert "tests/test_module_object.py::test_not_by_attribute" not in (selection.tests)


def test_a_module_statement_is_reached_by_every_name_of_the_module(
    tmp_path: Path,
) -> None:
    statement = ChangedUnit("vllm/shapes.py", "module-statement", "LIMIT")
    selection = select(make_tree(tmp_path), [statement])
    assert len(selection.tests) == 9  # every test of the two importing files
    assert "tests/test_other.py::test_not_importing" not in selection.tests


def test_a_star_import_takes_every_test_that_may_use_the_names(
    tmp_path: Path,
) -> None:
    tree = make_tree(tmp_path)
    (tree / "tests" / "test_star.py").write_text(
        "from vllm.shapes import *\n\n\ndef test_star():\n"
        "    assert Box(1, 1).area() == 1\n\n\ndef test_no_name():\n"
        "    assert 1\n"
    )
    selection = select(tree, [AREA])
    assert "tests/test_star.py::test_star" in selection.tests
    assert "tests/test_star.py::test_no_name" not in selection.tests
    assert "import *" in selection.coarse["tests/test_star.py"]


#: A module of the package one import from the changed one, and a package
#: that passes the changed class on.
CRATES = """\
from vllm.shapes import Box, unrelated


class Crate(Box):
    pass


def stacked(crates):
    return [crate.area() for crate in crates]


def untouched():
    return unrelated()
"""

TEST_CRATES = """\
from vllm.crates import Crate, untouched
from vllm.boxes import Box as Reexported


def test_reaches_area_through_a_subclass():
    assert Crate(1, 2).area() == 2


def test_reaches_area_through_a_package():
    assert Reexported(1, 2).area() == 2


def test_not_untouched():
    assert untouched() == 0
"""


def test_a_test_reaches_a_unit_through_a_module_that_imports_it(
    tmp_path: Path,
) -> None:
    """One import further, where the changed module's own tests reach
    nothing: ``vllm/crates.py`` subclasses the changed class, and
    ``vllm/boxes/__init__.py`` passes it on; a test that names either
    reaches ``Box.area`` through them, and one that names a name of theirs
    that does not reach it is left out."""
    tree = make_tree(tmp_path)
    (tree / "vllm" / "crates.py").write_text(CRATES)
    (tree / "vllm" / "boxes").mkdir()
    (tree / "vllm" / "boxes" / "__init__.py").write_text(
        "from vllm.shapes import Box\n"
    )
    (tree / "tests" / "test_crates.py").write_text(TEST_CRATES)
    # Where the changed module's own tests reach the unit, they are taken:
    # no import further.
    assert select(tree, [AREA]).through == {}
    assert not any("test_crates" in n for n in select(tree, [AREA]).tests)
    # Where none does, one import further.
    (tree / "tests" / "test_shapes.py").unlink()
    (tree / "tests" / "test_module_object.py").unlink()
    selection = select(tree, [AREA])
    crates = sorted(n for n in selection.tests if "test_crates" in n)
    assert crates == [
        "tests/test_crates.py::test_reaches_area_through_a_package",
        "tests/test_crates.py::test_reaches_area_through_a_subclass",
    ]
    assert selection.through == {
        "vllm.boxes": ["vllm.shapes"],
        "vllm.crates": ["vllm.shapes"],
    }
    # Never two imports further: a module that imports vllm.crates is not
    # one that imports the changed module.
    (tree / "vllm" / "pallets.py").write_text(
        "from vllm.crates import Crate\n\n\nclass Pallet(Crate):\n    pass\n"
    )
    (tree / "tests" / "test_pallets.py").write_text(
        "from vllm.pallets import Pallet\n\n\n"
        "def test_two_imports_away():\n    assert Pallet(1, 2).area() == 2\n"
    )
    assert (
        "tests/test_pallets.py::test_two_imports_away" not in select(tree, [AREA]).tests
    )


def test_nothing_to_select_says_why(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    unreached = ChangedUnit("vllm/other.py", "function", "f")
    assert select(tree, [unreached]).reason == (
        "no test module of tests/ imports a module the patch changes, "
        "nor a module that imports one"
    )
    shutil.rmtree(tree / "tests")
    assert select(tree, [AREA]).reason == f"{tree} has no tests/ folder"


# -- comparing the two runs ------------------------------------------------------


def run_of(*cases: TestCase, error: str = "") -> TestRun:
    """A run on the CPU, as verify starts it (the tree's conftest.py not loaded)."""
    return TestRun(command=["pytest", "--noconftest"], cases=list(cases), error=error)


def test_each_test_is_compared_on_both_trees() -> None:
    from deepstack_patch.proof.impact import Selection

    names = ["p2p", "f2p", "p2f", "both", "skip", "net", "fixture", "late", "flaky"]
    selection = Selection(tests={f"tests/t.py::{n}": [] for n in names})
    c = TestCase
    before = run_of(
        c("tests/t.py::p2p[1]", "passed"),
        c("tests/t.py::p2p[2]", "passed"),
        c("tests/t.py::f2p", "failed", "AssertionError: assert 41 == 42"),
        c("tests/t.py::p2f", "passed"),
        c("tests/t.py::both", "failed", "TypeError: unexpected keyword 'x'"),
        c("tests/t.py::skip", "skipped", "needs CUDA"),
        c("tests/t.py::net", "failed", "socket.gaierror: Name or service not known"),
        c("tests/t.py::fixture", "error", "fixture 'vllm_runner' not found"),
        c("tests/t.py::late", "passed"),
        c("tests/t.py::flaky", "passed"),
    )
    after = run_of(
        c("tests/t.py::p2p[1]", "passed"),
        c("tests/t.py::p2p[2]", "passed"),
        c("tests/t.py::f2p", "passed"),
        c("tests/t.py::p2f", "failed", "AssertionError: assert -1 == 6"),
        c("tests/t.py::both", "failed", "TypeError: unexpected keyword 'x'"),
        c("tests/t.py::skip", "skipped", "needs CUDA"),
        c("tests/t.py::net", "failed", "socket.gaierror: Name or service not known"),
        c("tests/t.py::fixture", "error", "fixture 'vllm_runner' not found"),
        c("tests/t.py::flaky", "failed", "requests.exceptions.ConnectionError: x"),
        error="pytest stopped with exit code -1:\ntimed out after 5 s",
    )
    found = {o.nodeid.split("::")[1]: o for o in compare(selection, before, after, 5)}
    assert sorted(found) == sorted(["p2p[1]", "p2p[2]", *names[1:]])
    assert found["p2f"].reason == "AssertionError: assert -1 == 6"
    assert found["both"].reason == "TypeError: unexpected keyword 'x'"
    assert found["skip"].reason == CANNOT_RUN + "skipped (needs CUDA)"
    assert found["net"].reason == CANNOT_RUN + "no network"
    assert found["fixture"].reason == CANNOT_RUN + (
        "it needs the fixture 'vllm_runner', which verify does not load on the "
        "CPU (the tree's conftest.py)"
    )
    assert found["late"].reason == CANNOT_RUN + (
        "the time budget (5 s) ran out before it ran"
    )

    class Done:
        def __init__(self, run: TestRun) -> None:
            self.run = run

        def result(self) -> TestRun:
            return self.run

    from deepstack_patch.proof.release_tests import Pending

    result = collect(Pending(selection, (Done(before), Done(after))), 5)  # type: ignore[arg-type]
    counts = [
        [o.nodeid.split("::")[1] for o in bucket]
        for bucket in (
            result.pass_to_pass,
            result.fail_to_pass,
            result.pass_to_fail,
            result.fails_on_both,
        )
    ]
    assert counts == [["p2p[1]", "p2p[2]"], ["f2p"], ["p2f"], ["both"]]
    # Passed before, the network missing after: no regression, nothing shown.
    assert found["flaky"].reason == CANNOT_RUN + "no network"
    assert len(result.could_not_run) == 5 and result.ran == 5
    assert result.problem.startswith(
        "release tests: 1 pass on the pristine tree and fail after the fix "
        "(pass-to-fail), e.g. tests/t.py::p2f: AssertionError: assert -1 == 6"
    )
    assert result.summary == (
        "2 pass-to-pass, 1 fail-to-pass, 1 pass-to-fail, 1 fail on both, "
        "5 could not run"
    )


# -- running them, with this interpreter ----------------------------------------


def run_beside(tmp_path: Path, name: str, text: str, budget_s: float = 60):
    """The release tests of ``Box.area`` on a synthetic tree with one more
    test file, tests/``name``, the same tree as pristine and fixed."""
    tree = make_tree(tmp_path / "tree")
    (tree / "tests" / name).write_text(text)
    env = ProofEnv(Path(sys.executable))
    with ThreadPoolExecutor(2) as pool:
        pending = submit(pool, env, tree, tree, [AREA], budget_s=budget_s)
        return collect(pending, budget_s)


def test_the_budget_stops_a_run_and_keeps_what_finished(tmp_path: Path) -> None:
    """The results are written after each test: a run stopped at its budget
    still tells the tests that finished; the rest could not run."""
    slow = (
        "import time\nfrom vllm.shapes import Box\n\n\n"
        "def test_a_fast():\n    assert Box(1, 1).area() == 1\n\n\n"
        "def test_b_slow():\n    time.sleep(600)\n    assert Box(1, 1).area() == 1\n"
    )
    # Enough for pytest to start and run the fast one on a loaded machine.
    result = run_beside(tmp_path, "test_slow.py", slow, budget_s=20)
    assert "tests/test_slow.py::test_a_fast" in [o.nodeid for o in result.pass_to_pass]
    (late,) = [o for o in result.could_not_run if "test_b_slow" in o.nodeid]
    assert late.reason == CANNOT_RUN + "the time budget (20 s) ran out before it ran"


def test_every_patchs_tests_run_in_one_pytest_process_per_tree(
    tmp_path: Path,
) -> None:
    """A batch's patches are applied to the same two trees: their tests run in
    one pytest process on each (each run imports torch and vLLM once), and
    each patch is told only the tests of its own units."""
    from deepstack_patch.proof.forkserver import run_subprocess
    from deepstack_patch.proof.release_tests import submit_together

    tree = make_tree(tmp_path / "tree")
    perimeter = ChangedUnit("vllm/shapes.py", "function", "perimeter")
    spawned: list[Path] = []

    def spawn(command, cwd, env, timeout):  # type: ignore[no-untyped-def]
        spawned.append(Path(cwd))
        return run_subprocess(command, cwd=cwd, env=env, timeout=timeout)

    env = ProofEnv(Path(sys.executable))
    with ThreadPoolExecutor(2) as pool:
        pending = submit_together(
            pool, env, tree, tree, {"acme#1": [AREA], "acme#2": [perimeter]},
            budget_s=60, spawn=spawn,
        )  # fmt: skip
        results = {key: collect(one, 60) for key, one in pending.items()}
    assert sorted(spawned) == [tree, tree]
    passed = {
        key: sorted(o.nodeid.split("::", 1)[1] for o in result.pass_to_pass)
        for key, result in results.items()
    }
    assert passed == {
        "acme#1": [
            "TestBox::test_reaches_area_through_a_helper",
            "test_reaches_area",
            "test_reaches_area_by_attribute",
            "test_reaches_area_through_describe",
        ],
        "acme#2": ["test_not_perimeter"],
    }
    assert all(not result.could_not_run for result in results.values())


def test_a_test_that_hangs_stops_at_its_patchs_budget_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """In a run shared by many patches, one test that hangs must not take
    the others' time: it stops at its patch's budget, could not run, and the
    tests after it run."""
    from deepstack_patch.proof.release_tests import submit_together

    tree = make_tree(tmp_path / "tree")
    (tree / "tests" / "test_a_hang.py").write_text(
        "import time\nfrom vllm.shapes import Box\n\n\n"
        "def test_hangs():\n    time.sleep(600)\n    assert Box(1, 1).area() == 1\n"
    )
    perimeter = ChangedUnit("vllm/shapes.py", "function", "perimeter")
    env = ProofEnv(Path(sys.executable))
    with ThreadPoolExecutor(2) as pool:
        pending = submit_together(
            pool, env, tree, tree, {"acme#1": [AREA], "acme#2": [perimeter]},
            budget_s=15,
        )  # fmt: skip
        results = {key: collect(one, 15) for key, one in pending.items()}
    (hung,) = [o for o in results["acme#1"].could_not_run if "hangs" in o.nodeid]
    assert hung.reason == CANNOT_RUN + (
        "it ran past its time limit (its patch's time budget, a test)"
    )
    assert [o.nodeid for o in results["acme#2"].pass_to_pass] == [
        "tests/test_shapes.py::test_not_perimeter"
    ]


def test_a_test_that_names_the_changed_method_but_never_runs_it_is_no_evidence(
    tmp_path: Path,
) -> None:
    """Selection reads names: a test that names ``Box.area`` is selected. The
    patched tree's run watches the changed method's lines, and a test that
    passes on both trees without executing them is counted apart, not as
    pass-to-pass; one that calls it from a thread counts."""
    tree = make_tree(tmp_path / "tree")
    (tree / "tests" / "test_names_only.py").write_text(
        "import threading\nfrom vllm.shapes import Box\n\n\n"
        "def test_only_names_area():\n    assert callable(Box.area)\n\n\n"
        "def test_calls_area_in_a_thread():\n    found = []\n"
        "    worker = threading.Thread(target=lambda: found.append(Box(2, 2).area()))\n"
        "    worker.start()\n    worker.join()\n    assert found == [4]\n"
    )
    env = ProofEnv(Path(sys.executable))
    with ThreadPoolExecutor(2) as pool:
        result = collect(submit(pool, env, tree, tree, [AREA], budget_s=60), 60)
    assert [o.nodeid for o in result.not_reached] == [
        "tests/test_names_only.py::test_only_names_area"
    ]
    passed = [o.nodeid for o in result.pass_to_pass]
    assert "tests/test_names_only.py::test_calls_area_in_a_thread" in passed
    assert "tests/test_shapes.py::test_reaches_area_through_describe" in passed
    assert result.summary == "5 pass-to-pass, 1 pass without running the changed code"
    assert result.json()["not_reached"] == [
        "tests/test_names_only.py::test_only_names_area"
    ]


def test_the_lines_watched_are_the_changed_functions_bodies(tmp_path: Path) -> None:
    """A function's or method's body as the tree has it (its ``def`` line runs
    at import), each method of a changed class; a module-level statement is
    not watched: it runs at whichever test imports the module first."""
    from deepstack_patch.proof.executed import watched_lines

    tree = make_tree(tmp_path / "tree")
    units = [
        AREA,
        ChangedUnit("vllm/shapes.py", "function", "perimeter"),
        ChangedUnit("vllm/shapes.py", "class", "Box"),
        ChangedUnit("vllm/shapes.py", "module-statement", "LIMIT"),
        ChangedUnit("vllm/shapes.py", "method", "Box.absent"),
    ]
    found = watched_lines(tree, units)
    lines = SHAPES.splitlines()
    spans = {(lines[a - 1].strip(), lines[b - 1].strip(), part.split("::")[1])
             for a, b, part in found["vllm/shapes.py"]}  # fmt: skip
    assert spans == {
        ("return _area(self.w, self.h)", "return _area(self.w, self.h)", "Box.area"),
        ("return 2 * (w + h)", "return 2 * (w + h)", "perimeter"),
        ("self.w, self.h = w, h", "self.w, self.h = w, h", "Box"),
        ("return _area(self.w, self.h)", "return _area(self.w, self.h)", "Box"),
        ('return f"box of {self.area()}"', 'return f"box of {self.area()}"', "Box"),
        ('return "box"', 'return "box"', "Box"),
    }


def test_a_shared_run_that_runs_out_of_time_says_the_whole_budget() -> None:
    """The shared run's time is the sum of its patches' budgets: a test it
    never reached says so, with both figures."""
    from deepstack_patch.proof.impact import Selection

    selection = Selection(tests={"tests/t.py::late": ["vllm/shapes.py::Box.area"]})
    stopped = TestRun(command=[], error="pytest ran no test:\ntimed out after 360 s")
    (late,) = compare(selection, stopped, stopped, 120)
    assert late.reason == CANNOT_RUN + (
        "the time budget (120 s a patch, 360 s for the 3 patches whose tests "
        "ran together) ran out before it ran"
    )


def test_a_file_that_cannot_import_stops_none_of_the_others(tmp_path: Path) -> None:
    """pytest ends a session at a collection error unless told otherwise: a
    test file short of a package could not run, the others run."""
    needing = (
        "import deepstack_no_such_package\nfrom vllm.shapes import Box\n\n\n"
        "def test_needs():\n    assert Box(1, 1).area() == 1\n"
    )
    result = run_beside(tmp_path, "test_needs.py", needing)
    assert len(result.pass_to_pass) == 4
    (needs,) = result.could_not_run
    assert (needs.nodeid, needs.before, needs.after) == (
        "tests/test_needs.py::test_needs",
        "error",
        "error",
    )
    assert needs.reason == CANNOT_RUN + (
        "the package 'deepstack_no_such_package' is not installed"
    )


def test_a_file_that_skips_itself_says_why_its_tests_did_not_run(
    tmp_path: Path,
) -> None:
    """A test file that skips at import (vLLM's CUDA-only files do) is one
    skipped report, not a test pytest did not report."""
    cuda_only = (
        "import pytest\nfrom vllm.shapes import Box\n\n"
        'pytest.skip(reason="only on CUDA", allow_module_level=True)\n\n\n'
        "def test_needs_cuda():\n    assert Box(1, 1).area() == 1\n"
    )
    result = run_beside(tmp_path, "test_cuda_only.py", cuda_only)
    assert len(result.pass_to_pass) == 4
    (skipped,) = result.could_not_run
    assert skipped.nodeid == "tests/test_cuda_only.py::test_needs_cuda"
    assert skipped.reason == CANNOT_RUN + "skipped (only on CUDA)"


#: A fix that changes ``Box.area``'s value: the tests that hold the old one
#: pass on the pristine tree and fail after.
BROKEN = SHAPES.replace("return _area(self.w, self.h)", "return -1")
#: A fix that keeps the value (a refactoring).
KEPT = SHAPES.replace("return _area(self.w, self.h)", "return self.w * self.h")


def verified(
    tmp_path: Path, fixed: str, budget: float = 60, extra: str = "", conftest: str = ""
):
    """derive ``fixed`` on a pristine synthetic tree, apply it to a copy,
    verify the copy against the pristine tree: the report and the verdict.
    ``extra``: one more test file, tests/test_extra.py, in both trees;
    ``conftest``: their tests/conftest.py."""
    from deepstack_patch.proof import verify

    before = make_tree(tmp_path / "pristine")
    after = make_tree(tmp_path / "fixed")
    for tree in (before, after):
        if extra:
            (tree / "tests" / "test_extra.py").write_text(extra)
        if conftest:
            (tree / "tests" / "conftest.py").write_text(conftest)
    diff = git_diff("vllm/shapes.py", SHAPES, fixed)
    result = derive_patch_from_text(diff, VllmTree.open(before), "acme#7")
    folder = tmp_path / "patches"
    folder.mkdir()
    write_derived(result.patch, folder)
    series = assemble_series(SERIES, patches_from_folder(folder))
    apply_tree(VllmTree.open(after), series, {"acme#7"}, WRITE)
    assert (after / "vllm" / "shapes.py").read_text() == fixed
    report = verify.verify_tree(
        VllmTree.open(after),
        series,
        {"acme#7"},
        ProofEnv(Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(before),
        test_budget=budget,
    )
    (verdict,) = report.verdicts
    return report, verdict


def test_a_fix_that_changes_a_return_value_is_a_regression(tmp_path: Path) -> None:
    from deepstack_patch.output.documents import verify_json
    from deepstack_patch.output.junit import junit_xml

    report, verdict = verified(tmp_path, BROKEN)
    stage = verdict.release_tests
    assert stage is not None and stage.not_run == ""
    assert sorted(o.nodeid for o in stage.pass_to_fail) == [
        "tests/test_module_object.py::test_reaches_area_by_attribute",
        "tests/test_shapes.py::TestBox::test_reaches_area_through_a_helper",
        "tests/test_shapes.py::test_reaches_area",
        "tests/test_shapes.py::test_reaches_area_through_describe",
    ]
    assert stage.pass_to_pass == [] and stage.could_not_run == []
    assert stage.problem in verdict.problems and report.exit_code == 1

    document = json.loads(json.dumps(verify_json(report)))
    assert schema_errors("verify", document) == []
    (patch,) = document["patches"]
    assert len(patch["release_tests"]["pass_to_fail"]) == 4
    assert patch["release_tests"]["pass_to_fail"][0]["before"] == "passed"
    assert stage.problem in patch["problems"]
    cases = {
        c.get("classname"): c for c in ET.fromstring(junit_xml(report)).iter("testcase")
    }
    assert cases["release-tests.0.20.2"].find("failure").get("message") == (
        stage.problem
    )
    # The proof's own case does not say it again.
    proof = cases["proof.0.20.2"].find("error")
    assert proof is None or "release tests" not in proof.get("message")


def test_a_fix_that_keeps_the_values_passes_them_before_and_after(
    tmp_path: Path,
) -> None:
    from deepstack_patch.output.tables import print_verify_report
    from rich.console import Console

    report, verdict = verified(tmp_path, KEPT)
    stage = verdict.release_tests
    assert stage is not None and len(stage.pass_to_pass) == 4
    assert stage.pass_to_fail == [] and stage.problem == ""
    assert not any("release tests" in p for p in verdict.problems)
    console = Console(record=True, width=300)
    print_verify_report(console, report)
    assert "acme#7 release tests: 4 pass-to-pass (" in console.export_text()


def test_a_budget_of_none_runs_no_release_test(tmp_path: Path) -> None:
    report, verdict = verified(tmp_path, BROKEN, budget=0)
    assert verdict.release_tests is None and verdict.unit_tests is None
    assert report.exit_code == 1  # nothing shows the broken fix: not verified


def test_without_a_pristine_tree_nothing_is_compared(tmp_path: Path) -> None:
    from deepstack_patch.proof import verify

    tree = make_tree(tmp_path / "tree")
    before = make_tree(tmp_path / "before")
    diff = git_diff("vllm/shapes.py", SHAPES, KEPT)
    patch = derive_patch_from_text(diff, VllmTree.open(before), "acme#8").patch
    folder = tmp_path / "patches"
    folder.mkdir()
    write_derived(patch, folder)
    series = assemble_series(SERIES, patches_from_folder(folder))
    apply_tree(VllmTree.open(tree), series, {"acme#8"}, WRITE)
    report = verify.verify_tree(
        VllmTree.open(tree), series, {"acme#8"}, ProofEnv(Path(sys.executable)),
        TARGETS,
    )  # fmt: skip
    assert report.verdicts[0].release_tests is None


def test_the_budget_option_reaches_the_stage(tmp_path: Path) -> None:
    """``--test-budget`` is given to verify; its default is the stage's."""
    from deepstack_patch.proof.release_tests import DEFAULT_BUDGET_S

    done = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "verify", "--help"],
        capture_output=True,
        text=True,
    )
    assert "--test-budget SECONDS" in done.stdout
    assert f"(default: {DEFAULT_BUDGET_S:.0f})" in " ".join(done.stdout.split())


def test_a_package_verify_cannot_add_says_why(tmp_path: Path) -> None:
    """A test short of a package the interpreter lacks: with an interpreter
    the user gave (here this one) verify installs nothing, and says so."""
    from deepstack_patch.output.documents import verify_json

    needs = (
        "import deepstack_no_such_package\nfrom vllm.shapes import Box\n\n\n"
        "def test_needs():\n    assert Box(1, 1).area() == 1\n"
    )
    report, verdict = verified(tmp_path, KEPT, extra=needs)
    stage = verdict.release_tests
    assert stage is not None and len(stage.pass_to_pass) == 4
    (needing,) = stage.could_not_run
    assert needing.reason == (
        "could not run: the package 'deepstack_no_such_package' is not "
        f"installed (--python {sys.executable} is your environment: verify "
        "installs nothing into it)"
    )
    assert report.extras is not None and report.extras.env is None
    assert list(report.extras.refused) == ["deepstack_no_such_package"]
    document = json.loads(json.dumps(verify_json(report)))
    assert schema_errors("verify", document) == []
    extras = document["environment"]["extras"]
    assert extras["installed"] == {} and extras["python"] is None
    assert "installs nothing" in extras["refused"]["deepstack_no_such_package"]


#: A test that fails the first time it runs on the fixed tree only, as a
#: distributed test can beside another run (shared memory, ports).
UNSTEADY = """\
from pathlib import Path

from vllm.shapes import Box


def test_area_unlucky_once():
    here = Path(__file__).parent
    unlucky = here.parent.name == "fixed" and not (here / "ran").exists()
    (here / "ran").touch()
    assert Box(1, 1).area() == 1 and not unlucky
"""


def test_a_test_that_differs_only_once_is_neither_regression_nor_fix(
    tmp_path: Path,
) -> None:
    """A test that passed on one tree and failed on the other is run again
    alone, one tree after the other; where it does not do the same again it
    could not run, and says both outcomes. A steady one stays (the broken
    fix's tests above stay pass-to-fail)."""
    report, verdict = verified(tmp_path, KEPT, extra=UNSTEADY)
    stage = verdict.release_tests
    assert stage is not None and stage.pass_to_fail == []
    assert len(stage.pass_to_pass) == 4
    (unsteady,) = stage.could_not_run
    assert unsteady.nodeid == "tests/test_extra.py::test_area_unlucky_once"
    assert unsteady.reason == (
        "could not run: beside the other tests it passed on the pristine tree "
        "and failed after the fix; run again alone, passed and passed: its "
        "outcome depends on what runs beside it"
    )
    assert stage.problem == ""


#: A fixture of the tree's conftest.py, as vLLM's ``default_vllm_config``.
CONFTEST = """\
import pytest
from vllm.shapes import Box


@pytest.fixture
def unit_box():
    return Box(1, 1)
"""
NEEDS_FIXTURE = """\
from vllm.shapes import Box


def test_area_of_the_conftest_box(unit_box):
    assert isinstance(unit_box, Box) and unit_box.area() == 1
"""


def test_a_test_that_needs_a_conftest_fixture_runs_again_with_it_loaded(
    tmp_path: Path,
) -> None:
    """The tree's conftest.py is not loaded on the CPU; a selected test that
    needs one of its fixtures runs once more with it loaded, and shows the
    broken fix like the others. The other tests are not run again."""
    _, verdict = verified(tmp_path, BROKEN, extra=NEEDS_FIXTURE, conftest=CONFTEST)
    stage = verdict.release_tests
    assert stage is not None and stage.could_not_run == []
    assert "tests/test_extra.py::test_area_of_the_conftest_box" in {
        o.nodeid for o in stage.pass_to_fail
    }
    assert len(stage.pass_to_fail) == 5


def test_a_conftest_that_does_not_import_says_why_its_tests_could_not_run(
    tmp_path: Path,
) -> None:
    broken = "import deepstack_no_such_package\n" + CONFTEST
    _, verdict = verified(tmp_path, KEPT, extra=NEEDS_FIXTURE, conftest=broken)
    stage = verdict.release_tests
    assert stage is not None and len(stage.pass_to_pass) == 4
    (needing,) = stage.could_not_run
    assert needing.reason.startswith(
        "could not run: it needs the fixture 'unit_box' of the tree's "
        "conftest.py, which does not import here: ModuleNotFoundError: No "
        "module named 'deepstack_no_such_package' (at "
    )


def test_a_fixture_the_conftest_does_not_define_says_so(tmp_path: Path) -> None:
    """Loaded, the tree's conftest.py lacks the fixture too: the reason no
    longer says verify did not load it."""
    lacking = NEEDS_FIXTURE.replace("unit_box", "no_such_box")
    _, verdict = verified(tmp_path, KEPT, extra=lacking, conftest=CONFTEST)
    stage = verdict.release_tests
    assert stage is not None and len(stage.pass_to_pass) == 4
    (needing,) = stage.could_not_run
    assert needing.reason == (
        "could not run: it needs the fixture 'no_such_box', which neither the "
        "test file nor the tree's conftest.py defines"
    )


# -- a real release, in the managed proof environment ---------------------------

KV_CACHE_UTILS = "vllm/v1/core/kv_cache_utils.py"
#: ``is_kv_cache_spec_uniform``'s answer for specs that do not merge.
NOT_UNIFORM = "    except AssertionError:\n        return False\n"


@pytest.mark.release
@pytest.mark.verify
def test_a_broken_fix_on_0_20_2_is_caught_by_the_release_tests(
    proof_env: object,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """A derived fix that changes a return value (made here from the
    release's own file: ``is_kv_cache_spec_uniform`` says True where specs
    do not merge): the release's test of that function passes on 0.20.2
    and fails after, pass-to-fail, and verify exits 1 naming it. The tests
    of kv_cache_utils that do not reach it are not selected."""
    pristine = release_tree("0.20.2")
    text = (pristine / KV_CACHE_UTILS).read_text()
    assert text.count(NOT_UNIFORM) == 1
    broken = text.replace(NOT_UNIFORM, NOT_UNIFORM.replace("False", "True"))
    diff = tmp_path / "broken.diff"
    diff.write_text(git_diff(KV_CACHE_UTILS, text, broken))
    out = tmp_path / "patches"
    made = cli(
        "derive", "--diff", str(diff), "--base-src", str(pristine),
        "--id", "local#broken", "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    tree = patched_copy("0.20.2")
    patches = ("--patches", str(out), "--only", "local#broken")
    done = cli("apply", "--vllm-src", str(tree), *patches)
    assert done.returncode == 0, done.stderr
    verify = cli(
        "verify", "--vllm-src", str(tree), *patches, "--against-pristine",
        "--pristine", str(pristine), "--test-budget", "600", "--format", "json",
    )  # fmt: skip
    assert verify.returncode == 1, verify.stdout + verify.stderr
    (patch,) = json.loads(verify.stdout)["patches"]
    stage = patch["release_tests"]
    uniform = "tests/v1/core/test_kv_cache_utils.py::test_is_kv_cache_spec_uniform"
    assert uniform in stage["selected"]
    # Selected by name: a test of the module that never calls it is not;
    # one that reloads the module object and uses it is, said as coarse.
    selected = stage["selected"]
    assert "tests/v1/core/test_kv_cache_utils.py::test_kv_cache_block" not in selected
    assert "tests/v1/core/test_kv_cache_utils.py::test_none_hash" in selected
    assert (
        "vllm.v1.core.kv_cache_utils itself"
        in (stage["coarse"]["tests/v1/core/test_kv_cache_utils.py"])
    )
    regressions = {o["nodeid"]: o for o in stage["pass_to_fail"]}
    assert regressions[uniform]["before"] == "passed"
    assert regressions[uniform]["after"] == "failed"
    assert regressions[uniform]["reason"].startswith("AssertionError: assert not True")
    assert any(p.startswith("release tests: ") for p in patch["problems"])
    assert patch["ok"] is False


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_an_offline_model_or_a_missing_async_plugin_could_not_run() -> None:
    """Two failures seen on 0.20.2's tests that are the environment's, not
    the code's: a model config Hugging Face cannot give offline, and an
    ``async def`` test without pytest-asyncio (which the release pins)."""
    from deepstack_patch.proof.failures import environment_cause

    offline = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
        "ModelConfig Value error, Invalid repository ID or local directory "
        "specified: 'Qwen/Qwen3-0.6B'."
    )
    assert environment_cause(offline) == "no network"
    snapshot = (
        "Cannot find an appropriate cached snapshot folder for the specified "
        "revision on the local disk and outgoing traffic has been disabled."
    )
    assert environment_cause(snapshot) == "no network"
    unplugged = (
        "Failed: async def functions are not natively supported. You need to "
        "install a suitable plugin for your async framework"
    )
    assert environment_cause(unplugged) == (
        "the package 'pytest_asyncio' is not installed"
    )


def test_a_later_round_runs_only_the_tests_that_could_not_run(tmp_path: Path) -> None:
    """A round with added packages runs again only what could not run: a
    parametrized test by its own id, every test of a file that did not
    import; the others keep their outcomes (extras' kept_with)."""
    from deepstack_patch.proof.release_tests import (
        ReleaseTests,
        TestOutcome,
        _could_not_run,
    )

    selection = select(make_tree(tmp_path), [AREA])
    earlier = ReleaseTests(selection, budget_s=1.0)
    lacking = "could not run: the package 'x' is not installed"
    earlier.pass_to_pass = [
        TestOutcome(
            "tests/test_shapes.py::test_reaches_area_through_describe",
            "passed",
            "passed",
        )
    ]
    earlier.could_not_run = [
        TestOutcome("tests/test_shapes.py::test_reaches_area[1]", "", "", lacking),
        TestOutcome("tests/test_module_object.py", "error", "error", lacking),
    ]
    assert sorted(_could_not_run(selection, earlier)) == [
        "tests/test_module_object.py::test_reaches_area_by_attribute",
        "tests/test_shapes.py::test_reaches_area",
    ]


def test_a_later_round_adds_its_seconds_as_the_first_round_gives_them(
    tmp_path: Path,
) -> None:
    """A round's seconds are to a tenth, and so is their sum with the
    earlier round's: the text said ``(26.700000000000003 s)``."""
    from deepstack_patch.proof.release_tests import (
        ReleaseTests,
        TestOutcome,
        kept_with,
    )

    selection = select(make_tree(tmp_path), [AREA])
    earlier = ReleaseTests(selection, budget_s=1.0)
    earlier.pass_to_pass = [
        TestOutcome("tests/test_shapes.py::test_a", "passed", "passed")
    ]
    earlier.seconds = 0.1
    later = ReleaseTests(selection, budget_s=1.0)
    later.seconds = 0.2
    assert kept_with(earlier, later).seconds == 0.3

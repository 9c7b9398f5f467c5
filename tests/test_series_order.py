"""Issue 40 items 1 and 9: a derived patch is judged on the tree as the
earlier patches of the series leave it, in every file: the names its fix
imports, what it reads at run time (ty included), in status as in apply;
where it needs a name another patch of the series adds, the reason says
which and in what order. The series-order context is a module of its own
(engine/context.py), which the derived checks read without importing the
plan.

The fast tier runs on small whole trees (their ``pyproject.toml``), where
the patch that needs the name sorts, by file, before the one that adds it;
the release tier on 0.20.2's own files, with two fixes made up here.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.apply import apply_tree
from deepstack_patch.engine.derived import DerivedPatch, tyfolders
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import VllmTree

from tests.support import link_copy
from tests.support.toys import derived_patch, toy_tree
from tests.support.ty_runs import checks_handed_to_ty


def derived(
    patch_id: str, path: str, before: str, after: str, requires: tuple[str, ...] = ()
) -> DerivedPatch:
    return derived_patch(patch_id, (path, before, after), requires=requires)


def whole_tree(root: Path, files: dict[str, str]) -> VllmTree:
    """A whole vLLM tree (its pyproject.toml: every file of the release)."""
    return toy_tree(root, files)


# -- a name one patch adds and the next imports ---------------------------------

#: vllm/zshm.py sorts after vllm/alpha.py: a plan that went file by file
#: would judge the patch of alpha.py before the one of zshm.py is applied.
RING = """class Ring:
    def __init__(self, size):
        self.size = size
"""
RING_FIXED = """class Ring:
    def __init__(self, size):
        self.size = size
        self.free = size > 0


def check_free(size):
    if size <= 0:
        raise RuntimeError("no space")
"""
MAKE = """from vllm.zshm import Ring


def make(size):
    return Ring(size)
"""
MAKE_FIXED = """from vllm.zshm import Ring, check_free


def make(size):
    check_free(size)
    return Ring(size)
"""
ADDS = derived("local#adds", "vllm/zshm.py", RING, RING_FIXED)


def needs(requires: tuple[str, ...] = ()) -> DerivedPatch:
    return derived("local#needs", "vllm/alpha.py", MAKE, MAKE_FIXED, requires)


def ring_tree(root: Path) -> VllmTree:
    return whole_tree(root, {"vllm/zshm.py": RING, "vllm/alpha.py": MAKE})


def test_status_judges_a_patch_on_the_names_an_earlier_one_adds(
    tmp_path: Path,
) -> None:
    plan = plan_tree(ring_tree(tmp_path), [ADDS, needs()], rewrite=False)
    assert [(r.patch.id, r.state) for r in plan.reports] == [
        ("local#adds", PatchState.NEEDED),
        ("local#needs", PatchState.NEEDED),
    ], plan.report("local#needs").reason
    assert not plan.edits  # status writes nothing, and shows no edit


def test_apply_writes_both_and_then_both_are_applied(tmp_path: Path) -> None:
    tree = ring_tree(tmp_path)
    series = [ADDS, needs()]
    result = apply_tree(tree, series, {p.id for p in series})
    assert not result.drifted, [r.reason for r in result.drifted]
    assert sorted(result.written) == ["vllm/alpha.py", "vllm/zshm.py"]
    assert (tmp_path / "vllm/alpha.py").read_text() == MAKE_FIXED
    assert (tmp_path / "vllm/zshm.py").read_text() == RING_FIXED
    again = plan_tree(tree, series, rewrite=False)
    assert {r.state for r in again.reports} == {PatchState.APPLIED}


def test_requires_orders_the_series_and_the_later_patch_is_needed(
    tmp_path: Path,
) -> None:
    """``requires`` puts the required patch first, whatever order the
    folders gave (engine/series.py), and the plan honours that order."""
    from deepstack_patch.engine.series import assemble_series

    series = assemble_series([], [needs(("local#adds",)), ADDS])
    assert [p.id for p in series] == ["local#adds", "local#needs"]
    plan = plan_tree(ring_tree(tmp_path), series, rewrite=False)
    assert plan.report("local#needs").state is PatchState.NEEDED


def test_a_patch_left_out_is_named_as_the_one_that_adds_the_name(
    tmp_path: Path,
) -> None:
    plan = plan_tree(
        ring_tree(tmp_path), [ADDS, needs()], {"local#needs"}, rewrite=False
    )
    report = plan.report("local#needs")
    assert report.state is PatchState.DRIFTED
    assert report.part_state("vllm/alpha.py::make")[1] == (
        "the fix needs `check_free` from `vllm.zshm`, which this release lacks; "
        "local#adds, earlier in the series, adds `check_free`: select "
        "local#adds too"
    )


def test_a_patch_later_in_the_series_is_named_with_the_order_to_apply(
    tmp_path: Path,
) -> None:
    plan = plan_tree(ring_tree(tmp_path), [needs(), ADDS], rewrite=False)
    report = plan.report("local#needs")
    assert report.state is PatchState.DRIFTED
    assert report.part_state("vllm/alpha.py::make")[1].endswith(
        "; local#adds adds `check_free`, and comes after local#needs in the "
        'series: apply local#adds first (`requires = ["local#adds"]` in '
        "local#needs's data file orders them)"
    )


def test_an_earlier_patch_that_drifted_is_named_with_its_state_to_see(
    tmp_path: Path,
) -> None:
    tree = whole_tree(
        tmp_path,
        {"vllm/zshm.py": RING.replace("= size", "= size * 2"), "vllm/alpha.py": MAKE},
    )
    plan = plan_tree(tree, [ADDS, needs()], rewrite=False)
    assert plan.report("local#adds").state is PatchState.DRIFTED
    assert plan.report("local#needs").part_state("vllm/alpha.py::make")[1] == (
        "the fix needs `check_free` from `vllm.zshm`, which this release lacks; "
        "local#adds, earlier in the series, adds `check_free`, but has not added "
        "it here (see its state)"
    )


def test_no_patch_adds_it_and_the_reason_says_nothing_more(tmp_path: Path) -> None:
    other = derived("local#other", "vllm/zshm.py", RING, RING + "\n\nLIMIT = 4\n")
    plan = plan_tree(ring_tree(tmp_path), [other, needs()], rewrite=False)
    assert plan.report("local#needs").part_state("vllm/alpha.py::make")[1] == (
        "the fix needs `check_free` from `vllm.zshm`, which this release lacks"
    )


# -- what the fix reads at run time, through the type checker ----------------------

USE = """from vllm.zshm import Ring


def make(size):
    ring = Ring(size)
    return ring
"""
USE_FIXED = """from vllm.zshm import Ring


def make(size):
    ring = Ring(size)
    if not ring.free:
        raise RuntimeError("full")
    return ring
"""
#: Another class has a ``free``: only the type checker can tell that
#: ``Ring`` lacks it before local#adds.
ELSEWHERE = "class Pool:\n    free: bool = True\n"


def test_the_type_checker_sees_the_attribute_an_earlier_patch_adds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ty runs on the tree as the earlier patches leave it, and its cached
    verdict on the tree without them is never taken for the tree with them."""
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    runs = checks_handed_to_ty(monkeypatch)
    tree = whole_tree(
        tmp_path / "tree",
        {"vllm/zshm.py": RING, "vllm/alpha.py": USE, "vllm/pool.py": ELSEWHERE},
    )
    reader = derived("local#reads", "vllm/alpha.py", USE, USE_FIXED)
    alone = plan_tree(tree, [ADDS, reader], {"local#reads"}, rewrite=False)
    report = alone.report("local#reads")
    assert report.state is PatchState.DRIFTED
    assert report.reason.startswith(
        "the fix reads `Ring.free`, which this release lacks (ty: Object of "
        "type `Ring` has no attribute `free` [missing-attribute])"
    )
    both = plan_tree(tree, [ADDS, reader], rewrite=False)
    assert both.report("local#reads").state is PatchState.NEEDED, both.report(
        "local#reads"
    ).reason
    # A new key for vllm/alpha.py: the verdict on the overlay is its own
    # (local#adds' own verdict, on the tree as it is, is read from the cache).
    assert runs == ["vllm/zshm.py", "vllm/alpha.py", "vllm/alpha.py"]
    assert apply_tree(tree, [ADDS, reader], {"local#adds", "local#reads"}).written
    assert (tree.root / "vllm/alpha.py").read_text() == USE_FIXED


#: local#strict gives ``Ring`` a parameter that local#passes passes (as
#: vllm#41061 gives ``DeepseekV4DecoderLayer`` the ``aux_stream_list`` that
#: vllm#41171 passes).
RING_STRICT = RING.replace("size):", "size, strict=False):")
PASS = USE.replace("Ring(size)", "Ring(size, strict=True)")


def test_ty_s_verdict_names_the_patch_that_adds_the_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    tree = whole_tree(tmp_path / "tree", {"vllm/zshm.py": RING, "vllm/alpha.py": USE})
    strict = derived("local#strict", "vllm/zshm.py", RING, RING_STRICT)
    passes = derived("local#passes", "vllm/alpha.py", USE, PASS)
    alone = plan_tree(tree, [strict, passes], {"local#passes"}, rewrite=False)
    report = alone.report("local#passes")
    assert report.state is PatchState.DRIFTED
    assert "[unknown-argument]" in report.reason
    assert report.reason.endswith(
        "; local#strict, earlier in the series, adds `strict`: select local#strict too"
    )
    both = plan_tree(tree, [strict, passes], rewrite=False)
    assert both.report("local#passes").state is PatchState.NEEDED


def test_the_type_checker_s_folder_never_writes_through_into_the_tree(
    tmp_path: Path,
) -> None:
    """The files laid over the tree are written in folders of their own,
    nested ones too; the rest are links to the tree's."""
    tree = whole_tree(
        tmp_path / "tree",
        {"vllm/a.py": "A = 1\n", "vllm/sub/b.py": "B = 1\n", "vllm/sub/c.py": ""},
    )
    out = tmp_path / "out"
    tyfolders.overlay(
        tree.root, out, {"vllm/sub/b.py": b"B = 2\n", "vllm/a.py": b"A = 2\n"}
    )
    assert (out / "vllm/sub").is_dir() and not (out / "vllm/sub").is_symlink()
    assert (out / "vllm/sub/b.py").read_text() == "B = 2\n"
    assert (out / "vllm/a.py").read_text() == "A = 2\n"
    assert (out / "vllm/sub/c.py").is_symlink()
    assert (out / "vllm/__init__.py").is_symlink()
    assert (tree.root / "vllm/sub/b.py").read_text() == "B = 1\n"
    assert (tree.root / "vllm/a.py").read_text() == "A = 1\n"


# -- item 9: the layers ---------------------------------------------------------------


def test_the_derived_checks_do_not_import_the_plan() -> None:
    """The checks read the series-order context (engine/context.py), which
    the plan fills: an import of the plan from them would close a circle."""
    import deepstack_patch.engine.derived as derived_package

    folder = Path(derived_package.__file__).parent
    imported = {
        (file.name, node.module)
        for file in sorted(folder.glob("*.py"))
        for node in ast.walk(ast.parse(file.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert len({name for name, _ in imported}) > 10  # every module was read
    assert [
        name for name, module in imported if module == "deepstack_patch.engine.plan"
    ] == []


# -- a real release ----------------------------------------------------------------

#: Two fixes made up here on 0.20.2's own files: the first adds a function to
#: shm_broadcast.py, the second (in a file that sorts before it) calls it.
SHM = "vllm/distributed/device_communicators/shm_broadcast.py"
CALLER = "vllm/beam_search.py"
PROBE = "\n\ndef deepstack_series_probe(size: int) -> bool:\n    return size >= 0\n"
CALL = (
    "\n\ndef deepstack_series_caller(size: int) -> bool:\n"
    "    from vllm.distributed.device_communicators.shm_broadcast import (\n"
    "        deepstack_series_probe,\n"
    "    )\n\n"
    "    return deepstack_series_probe(size)\n"
)


@pytest.mark.release
def test_a_release_patch_calls_what_an_earlier_one_adds_in_another_file(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    root = release_tree("0.20.2")
    shm, caller = (root / SHM).read_text(), (root / CALLER).read_text()
    adds = derived("local#probe", SHM, shm, shm + PROBE)
    calls = derived("local#caller", CALLER, caller, caller + CALL)
    series = [adds, calls]
    plan = plan_tree(VllmTree.open(root), series, rewrite=False)
    assert [r.state for r in plan.reports] == [PatchState.NEEDED] * 2, [
        r.reason for r in plan.reports
    ]
    alone = plan_tree(VllmTree.open(root), series, {"local#caller"}, rewrite=False)
    assert alone.report("local#caller").reason == (
        "the fix needs `deepstack_series_probe` from "
        "`vllm.distributed.device_communicators.shm_broadcast`, which this "
        "release lacks; local#probe, earlier in the series, adds "
        "`deepstack_series_probe`: select local#probe too"
    )
    copy = VllmTree.open(link_copy(root, tmp_path / "vllm-0.20.2"))
    result = apply_tree(copy, series, {p.id for p in series})
    assert sorted(result.written) == [CALLER, SHM]
    assert (copy.root / CALLER).read_text() == caller + CALL
    assert (copy.root / SHM).read_text() == shm + PROBE
    after = plan_tree(copy, series, rewrite=False)
    assert [r.state for r in after.reports] == [PatchState.APPLIED] * 2

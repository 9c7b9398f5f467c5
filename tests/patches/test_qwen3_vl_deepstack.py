"""vllm#40932 and vllm#43617 together, on real releases.

What the generic harness does not check: the two patches' interplay. On
0.20.0 and 0.20.1 both apply, and the result must be upstream 0.23.0's
methods; vllm#40932 alone must give 0.20.2's; vllm#43617 alone is refused;
and every class that defines the methods is found, none that inherits them.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.syntax import iter_functions
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import patch_by_id

pytestmark = pytest.mark.release

BOUNDS_CHECK = patch_by_id("vllm#40932")
RESIZE = patch_by_id("vllm#43617")
PAIR = [BOUNDS_CHECK, RESIZE]
METHODS = (
    "_get_deepstack_input_embeds",
    "_resize_deepstack_input_embeds",
    "_set_deepstack_input_embeds",
    "_clear_deepstack_input_embeds",
)
MODEL_FILES = (
    "vllm/model_executor/models/qwen3_vl.py",
    "vllm/model_executor/models/qwen3_omni_moe_thinker.py",
)


def deepstack_methods(source: bytes | str) -> dict[str, str]:
    """``Class.method`` -> ast dump, for the deepstack methods of a file."""
    return {
        qualname: ast.dump(function)
        for qualname, function in iter_functions(ast.parse(source))
        if qualname.rsplit(".", 1)[-1] in METHODS
    }


def edited(plan: Plan) -> dict[str, bytes]:
    return {edit.relpath: edit.new for edit in plan.edits}


def assert_same_methods(plan: Plan, upstream: Path, label: str) -> None:
    new = edited(plan)
    assert sorted(new) == sorted(MODEL_FILES), f"edited {sorted(new)}"
    for relpath in MODEL_FILES:
        ours = deepstack_methods(new[relpath])
        theirs = deepstack_methods((upstream / relpath).read_bytes())
        assert ours.keys() == theirs.keys(), f"{relpath}: methods differ"
        for qualname in ours:
            assert ours[qualname] == theirs[qualname], (
                f"{relpath}: {qualname} differs from {label}'s"
            )


@pytest.mark.parametrize(
    "version", ["0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1"]
)
def test_both_give_upstream_0_23_methods(
    version: str, release_tree: Callable[[str], Path]
) -> None:
    plan = plan_tree(VllmTree.open(release_tree(version)), PAIR)
    assert_same_methods(plan, release_tree("0.23.0"), "0.23.0")


@pytest.mark.parametrize("version", ["0.20.0", "0.20.1"])
def test_bounds_check_alone_gives_upstream_0_20_2_methods(
    version: str, release_tree: Callable[[str], Path]
) -> None:
    plan = plan_tree(
        VllmTree.open(release_tree(version)), PAIR, selected={BOUNDS_CHECK.id}
    )
    assert_same_methods(plan, release_tree("0.20.2"), "0.20.2")


def test_resize_alone_is_blocked_where_the_bounds_check_is_needed(
    release_tree: Callable[[str], Path],
) -> None:
    # Without vllm#40932 the profiling run would meet the bounds check with
    # nothing stored and raise, instead of tracing zeros. The code is
    # recognised, so the patch is needed, not drifted: it waits for the one it
    # requires (`apply` refuses it, tests/test_robustness.py).
    plan = plan_tree(VllmTree.open(release_tree("0.20.0")), PAIR, selected={RESIZE.id})
    report = plan.report(RESIZE.id)
    assert report.state is PatchState.NEEDED
    assert report.blocked_by == [BOUNDS_CHECK.id]
    assert BOUNDS_CHECK.id in report.blocked_reason


@pytest.mark.parametrize("version", ["0.20.0", "0.22.1", "0.33.0"])
def test_every_defining_class_is_found(
    version: str, release_tree: Callable[[str], Path]
) -> None:
    root = release_tree(version)
    plan = plan_tree(VllmTree.open(root), PAIR, rewrite=False)
    defining = set()
    for path in sorted((root / "vllm").rglob("*.py")):
        text = path.read_bytes()
        if b"def _get_deepstack_input_embeds" not in text:
            continue
        for qualname, _ in iter_functions(ast.parse(text)):
            if qualname.endswith("._get_deepstack_input_embeds"):
                defining.add((path.relative_to(root).as_posix(), qualname))
    for patch in PAIR:
        found = {
            (loc.path, loc.finding.symbol) for loc in plan.report(patch.id).locations
        }
        assert found == defining, patch.id
        # Subclasses that only inherit the methods have nothing to fix.
        assert not any(path.endswith("qwen3_vl_moe.py") for path, _ in found)


@pytest.mark.parametrize("version", ["0.17.0", "0.19.1"])
def test_before_the_counter_nothing_is_written(
    version: str, release_tree: Callable[[str], Path]
) -> None:
    plan = plan_tree(VllmTree.open(release_tree(version)), PAIR)
    assert plan.edits == []
    for patch in PAIR:
        report = plan.report(patch.id)
        assert report.state is PatchState.NOT_APPLICABLE
        assert report.reason == "bug not present in this release"

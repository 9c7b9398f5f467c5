"""A fix never ships without the companion that repairs what it breaks
(engine.plan: ``Patch.companions``), on a toy series: no network, no vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
from deepstack_patch.engine.apply import WRITE, apply_tree
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import VllmTree

from tests.test_verify import _ReturnsOne, make_tree

SOURCE = "def fix():\n    return 0\n\n\ndef repair():\n    return 0\n"


def toy_tree(root: Path, source: str = SOURCE) -> VllmTree:
    make_tree(root, [])
    (root / "vllm" / "toy.py").write_text(source)
    return VllmTree.open(root)


SERIES = [_ReturnsOne("fix", companions=("repair",)), _ReturnsOne("repair")]


def test_the_fix_waits_for_its_needed_companion(tmp_path: Path) -> None:
    tree = toy_tree(tmp_path / "t")
    plan = plan_tree(tree, SERIES, {"fix"}, rewrite=False)
    report = plan.report("fix")
    assert report.state is PatchState.NEEDED
    assert report.blocked_by == ["repair"]
    assert "ships only with its companion repair" in report.reason
    with pytest.raises(DeepstackError) as refused:
        apply_tree(tree, SERIES, {"fix"}, WRITE)
    assert "nothing was written" in str(refused.value)
    assert "select repair too" in (refused.value.hint or "")
    assert (tree.root / "vllm" / "toy.py").read_text() == SOURCE


def test_both_apply_and_the_companion_alone_is_fine(tmp_path: Path) -> None:
    tree = toy_tree(tmp_path / "both")
    apply_tree(tree, SERIES, {"fix", "repair"}, WRITE)
    assert (tree.root / "vllm" / "toy.py").read_text().count("return 1") == 2
    alone = toy_tree(tmp_path / "alone")
    apply_tree(alone, SERIES, {"repair"}, WRITE)
    assert plan_tree(alone, SERIES, rewrite=False).report("repair").state is (
        PatchState.APPLIED
    )


def test_a_companion_already_applied_blocks_nothing(tmp_path: Path) -> None:
    tree = toy_tree(
        tmp_path / "t",
        SOURCE.replace("repair():\n    return 0", "repair():\n    return 1"),
    )
    plan = plan_tree(tree, SERIES, {"fix"}, rewrite=False)
    assert plan.report("fix").blocked_by == []
    apply_tree(tree, SERIES, {"fix"}, WRITE)
    assert (tree.root / "vllm" / "toy.py").read_text().count("return 1") == 2

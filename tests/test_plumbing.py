"""The plumbing under the commands, called directly (no command line).

Each command is a thin click function over one of these; here they run on a
small synthetic tree built from a patch's own examples, without the network.
"""

from __future__ import annotations

from pathlib import Path

from deepstack_patch.distribution.quilt import SERIES_MARKER, export_series
from deepstack_patch.engine.apply import CHECK, DRY_RUN, WRITE, apply_tree
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

MODEL = "vllm/model_executor/models/granite4_vision.py"
ALL = {patch.id for patch in SERIES}


def make_tree(root: Path, model_source: str) -> VllmTree:
    (root / "vllm" / "model_executor" / "models").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (root / MODEL).write_text(model_source)
    return VllmTree.open(root)


def test_apply_tree_modes_and_exit_codes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", granite.BEFORE)
    check = apply_tree(tree, SERIES, ALL, CHECK)
    assert check.exit_code == 1 and not check.written and not check.plan.edits
    dry = apply_tree(tree, SERIES, ALL, DRY_RUN)
    assert dry.exit_code == 0 and not dry.written and len(dry.plan.edits) == 1
    assert (tree.root / MODEL).read_text() == granite.BEFORE
    done = apply_tree(tree, SERIES, ALL, WRITE)
    assert done.exit_code == 0 and done.written == [MODEL]
    assert (tree.root / MODEL).read_bytes() == dry.plan.edits[0].new
    again = apply_tree(tree, SERIES, ALL, CHECK)
    assert again.exit_code == 0 and not again.plan.needed


def test_apply_tree_refuses_drifted_and_writes_nothing(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", granite.SLICED_OTHERWISE)
    result = apply_tree(tree, SERIES, ALL, WRITE)
    assert [r.patch.id for r in result.drifted] == [granite.PATCH.id]
    assert result.exit_code == 2 and result.written == []
    assert (tree.root / MODEL).read_text() == granite.SLICED_OTHERWISE


def test_export_series_writes_one_patch_per_needed_patch(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", granite.BEFORE)
    result = export_series(tree, SERIES, ALL, tmp_path / "series")
    assert not result.drifted and len(result.names) == 1
    assert [step.patch.id for step in result.steps] == [granite.PATCH.id]
    series_file = (tmp_path / "series" / "series").read_text().splitlines()
    assert series_file[0].startswith(SERIES_MARKER) and series_file[1:] == result.names
    patch_text = (tmp_path / "series" / result.names[0]).read_text()
    assert f"diff --git a/{MODEL} b/{MODEL}" in patch_text
    assert (tree.root / MODEL).read_text() == granite.BEFORE  # tree not modified
    drifted = make_tree(tmp_path / "d", granite.SLICED_OTHERWISE)
    refused = export_series(drifted, SERIES, ALL, tmp_path / "none")
    assert refused.drifted and refused.names == []
    assert not (tmp_path / "none").exists()

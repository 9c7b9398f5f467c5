"""What the generic harnesses do not check for vllm#38040.

- vllm#38040 ports the fix, not its neighbours: on 0.20.x and 0.21.0 each
  rewritten function equals 0.22.0's once 0.22.0's unrelated changes in it
  (the max_frames_per_video refactor, an MLA fusion warning) are taken out;
  the generic upstream comparison cannot see that, because those functions'
  findings name no upstream function (they can never equal 0.22.0's).
- On 0.19.x the rewrite uses that release's own names.
- The proof fails on the pristine release and passes on the patched one: the
  rewritten code on 0.20.x and 0.21.0 runs its own configuration paths on the
  CPU and enforces max_batch_size <= min(token budgets). This needs torch: it
  runs in the managed proof environment that `deepstack-patch verify` builds
  (the ``proof_env`` fixture in conftest.py).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.syntax import iter_functions
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import patch_by_id

from tests.support import apply_one as _apply
from tests.support import run_proof as _prove

BUDGETS = "vllm#38040"


def _functions(path: Path) -> dict[str, ast.AST]:
    return dict(iter_functions(ast.parse(path.read_bytes())))


class _WithoutNeighbours(ast.NodeTransformer):
    """0.22.0's functions with the changes vllm#38040 did not make taken out."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.body = [
            s
            for s in node.body
            if not ast.unparse(s).startswith(
                # get_encoder_cudagraph_config: frames for the config field.
                ("max_frames = ", "if self.fuse_rope_kvcache_cat_mla")
            )
        ]
        self.generic_visit(node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.Call:
        # get_encoder_cudagraph_config: the new EncoderCudaGraphConfig field.
        node.keywords = [k for k in node.keywords if k.arg != "max_frames_per_video"]
        self.generic_visit(node)
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.stmt:
        # __init__: 0.22.0 reads the frame count from the config, not the model.
        if (
            ast.unparse(node)
            == "max_frames_per_video = self.config.max_frames_per_video"
        ):
            return ast.parse(
                "max_frames_per_video = self.model.get_max_frames_per_video()"
            ).body[0]
        return node


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.20.0", "0.20.1", "0.20.2", "0.21.0"])
def test_budgets_equal_upstream_without_its_neighbours(
    version: str, release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    root = _apply(BUDGETS, release_tree(version), tmp_path / version)
    plan = plan_tree(VllmTree.open(release_tree(version)), [patch_by_id(BUDGETS)])
    needed = [
        loc for loc in plan.reports[0].locations if loc.state is PatchState.NEEDED
    ]
    assert {loc.finding.part for loc in needed} == set(patch_by_id(BUDGETS).parts)
    for loc in needed:
        upstream = _functions(release_tree("0.22.0") / loc.path)[loc.finding.symbol]
        patched = _functions(root / loc.path)[loc.finding.symbol]
        expected = _WithoutNeighbours().visit(upstream)
        assert ast.dump(patched) == ast.dump(expected), (
            f"{loc.path} {loc.finding.symbol}: differs from 0.22.0's without the "
            "max_frames_per_video refactor"
        )
        assert "self.config.max_frames_per_video" not in ast.unparse(patched)


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.19.0", "0.19.1"])
def test_budgets_on_019_use_that_release_names(
    version: str, release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    root = _apply(BUDGETS, release_tree(version), tmp_path / version)
    manager = ast.unparse(
        _functions(root / "vllm/v1/worker/encoder_cudagraph.py")[
            "EncoderCudaGraphManager.__init__"
        ]
    )
    assert "encoder_cudagraph_max_images_per_batch (" in manager
    assert "vision_items" not in manager
    qwen = _functions(root / "vllm/model_executor/models/qwen3_vl.py")
    cls = "Qwen3VLForConditionalGeneration"
    capture = ast.unparse(qwen[f"{cls}.prepare_encoder_cudagraph_capture_inputs"])
    assert (
        "per_image_output = (token_budget + max_batch_size - 1) // max_batch_size"
        in (capture)
    )
    config = ast.unparse(qwen[f"{cls}.get_encoder_cudagraph_config"])
    assert (
        "modalities=[] if self.is_multimodal_pruning_enabled else ['image']" in config
    )
    after = plan_tree(VllmTree.open(root), [patch_by_id(BUDGETS)])
    assert after.reports[0].state is PatchState.APPLIED
    assert after.edits == []


# --- proofs ---------------------------------------------------------------


@pytest.mark.verify
@pytest.mark.release
@pytest.mark.parametrize("version", ["0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.19.1"])
def test_proof_fails_before_and_passes_after(
    version: str,
    proof_env: object,
    release_tree: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    pristine = release_tree(version)
    status, message = _prove(proof_env, pristine, BUDGETS)
    assert status == "failed", (
        f"the proof does not fail on pristine {version}: {message}"
    )
    assert f"{BUDGETS} not in effect" in message
    # The invariant on every configuration path, the config check, ceil, pruning.
    for words in (
        "automatic budgets and batch size",
        "user budgets [64] with batch size 256",
        "CompilationConfig accepted",
        "floor division",
        "pruning on",
    ):
        assert words in message
    patched = _apply(BUDGETS, pristine, tmp_path / version)
    status, message = _prove(proof_env, patched, BUDGETS)
    assert status == "passed", f"the proof fails on patched {version}: {message}"

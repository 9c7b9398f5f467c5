"""vllm#49397's proof on real releases, in verify's managed environment.

The proof builds each deepstack class through its real ``__init__`` with
image and video limits 0 and runs the deepstack step. It passes on 0.20.2 as
released (``_get_`` returns None while nothing is stored, so the meta-device
buffers stay latent), fails once vllm#43617 alone is applied (the buffers
reach the decoder: vllm#49384), and passes with vllm#49397 too. 0.25.0 fails
natively; 0.28.0, which carries upstream's fix, passes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.apply import WRITE, apply_tree
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.proof import envs
from deepstack_patch.proof.proofs import run_proofs

PATCH_ID = "vllm#49397"
FIX_ID = "vllm#43617"
CLASSES = (
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3OmniMoeThinkerForConditionalGeneration",
)

pytestmark = [pytest.mark.release, pytest.mark.verify]


def _prove(env: envs.ProofEnv, tree: Path) -> tuple[str, str]:
    result = run_proofs(env, tree, [PATCH_ID])[PATCH_ID]
    return result.status, result.message


def _apply(tree: Path, patch_ids: set[str]) -> None:
    # A series of just these patches: the whole series refuses vllm#43617
    # without its companion, which is the tree this test needs to see fail.
    series = [patch for patch in SERIES if patch.id in patch_ids]
    result = apply_tree(VllmTree.open(tree), series, patch_ids, WRITE)
    assert set(result.applied_now) == patch_ids, result.applied_now


def test_0_20_2_passes_pristine_fails_with_the_fix_alone_passes_with_both(
    proof_env: envs.ProofEnv,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
) -> None:
    assert _prove(proof_env, release_tree("0.20.2")) == ("passed", "")

    fix_alone = patched_copy("0.20.2")
    _apply(fix_alone, {FIX_ID})
    status, message = _prove(proof_env, fix_alone)
    assert status == "failed", message
    assert "Tensor on device meta is not on the expected device cpu" in message
    assert "vllm#49384" in message
    for name in CLASSES:
        assert name in message, f"{name} did not crash: {message}"

    _apply(fix_alone, {PATCH_ID})
    assert _prove(proof_env, fix_alone) == ("passed", "")


@pytest.mark.parametrize(
    ("release", "expected"), [("0.25.0", "failed"), ("0.28.0", "passed")]
)
def test_upstream_releases(
    proof_env: envs.ProofEnv,
    release_tree: Callable[[str], Path],
    release: str,
    expected: str,
) -> None:
    """Before 0.28.0 the crash is native; 0.28.0 carries upstream's fix."""
    status, message = _prove(proof_env, release_tree(release))
    assert status == expected, message
    if expected == "failed":
        for name in CLASSES:
            assert name in message, f"{name} did not crash on {release}: {message}"

"""The series: every upstream fix this tool carries, in the order it applies them.

Order matters where two patches touch the same function: a later patch sees
the code as the earlier ones left it.
"""

from __future__ import annotations

from deepstack_patch.engine.protocol import Patch

from . import (
    encoder_cudagraph_budgets,
    granite4_vision_deepstack_slice,
    qwen3_vl_deepstack_bounds_check,
    qwen3_vl_deepstack_resize,
    qwen3_vl_deepstack_without_vision,
    sampler_batch_recompile,
)

SERIES: tuple[Patch, ...] = (
    sampler_batch_recompile.PATCH,
    encoder_cudagraph_budgets.PATCH,
    qwen3_vl_deepstack_bounds_check.PATCH,
    granite4_vision_deepstack_slice.PATCH,
    # After vllm#40932, which it requires: both rewrite _get_deepstack_input_embeds.
    qwen3_vl_deepstack_resize.PATCH,
    # vllm#43617's companion: with the buffers always returned, a skipped
    # vision tower's meta buffers reach the decoder (vllm#49384).
    qwen3_vl_deepstack_without_vision.PATCH,
)


def patch_by_id(patch_id: str) -> Patch:
    for patch in SERIES:
        if patch.id == patch_id:
            return patch
    raise KeyError(patch_id)

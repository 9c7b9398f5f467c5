"""The proof of vllm#43617: ``_get_`` returns zeros while nothing is stored."""

from __future__ import annotations

from pathlib import Path

from .._deepstack_buffer.proof import bare_model, model_classes


def prove_zeros_while_profiling(tree: Path) -> None:
    """After a clear, ``_get_`` returns zeros, growing on demand."""
    import torch

    for name, cls in model_classes(tree):
        model = bare_model(cls, rows=4, hidden=8, levels=2, dtype=torch.float16)
        device = model.deepstack_input_embeds[0].device
        model._set_deepstack_input_embeds(torch.ones(2, 3, 8))
        model._get_deepstack_input_embeds(3)
        model._clear_deepstack_input_embeds(3)
        # What the profiling run, which torch.compile traces, sees: nothing
        # stored, rows asked for.
        for rows in (3, 6):
            got = model._get_deepstack_input_embeds(rows)
            assert got is not None, (
                f"{name}._get_deepstack_input_embeds({rows}) returned None "
                "with nothing stored (as in the profiling run torch.compile "
                "traces): the compiled graph drops the deepstack branch"
            )
            assert len(got.tensors) == 2, f"{name}: {len(got.tensors)} levels"
            for key in got.tensors:
                tensor = got[key]
                assert tensor.shape == (rows, 8), (
                    f"{name}._get_deepstack_input_embeds({rows}): {key} has "
                    f"shape {tuple(tensor.shape)}, expected ({rows}, 8); the "
                    "buffers (4 rows) must grow on demand"
                )
                assert bool(tensor.eq(0).all()), f"{name}: {key} is not zeros"
                assert tensor.dtype == torch.float16, (
                    f"{name}: growing the buffers changed their dtype to {tensor.dtype}"
                )
                assert tensor.device == device, f"{name}: buffers moved device"
        model._set_deepstack_input_embeds(torch.ones(2, 10, 8))
        for buffer in model.deepstack_input_embeds:
            assert buffer.size(0) >= 10 and buffer.dtype == torch.float16, (
                f"{name}._set_deepstack_input_embeds did not grow the buffers "
                "keeping their dtype"
            )

"""The proof of vllm#40932: a padded step must not raise."""

from __future__ import annotations

from pathlib import Path

from .._deepstack_buffer.proof import bare_model, model_classes


def prove_padded_steps(tree: Path) -> None:
    """A padded step (more rows asked for than stored) must not raise."""
    import torch

    for name, cls in model_classes(tree):
        model = bare_model(cls, rows=8, hidden=4, levels=2, dtype=torch.float32)
        model._set_deepstack_input_embeds(torch.ones(2, 3, 4))
        try:
            padded = model._get_deepstack_input_embeds(5)
        except ValueError as exc:
            raise AssertionError(
                f"{name}._get_deepstack_input_embeds(5) with 3 rows stored "
                f"raised ValueError: {exc} (the vllm#40145 bounds check)"
            ) from None
        assert padded is not None, (
            f"{name}._get_deepstack_input_embeds(5) returned None with 3 rows stored"
        )
        for key in padded.tensors:
            rows = padded[key]
            assert rows.shape == (5, 4), f"{name}: {key} has shape {rows.shape}"
            assert bool(rows[:3].eq(1).all() and rows[3:].eq(0).all()), (
                f"{name}: {key} does not hold the 3 stored rows then zeros"
            )
        try:
            model._clear_deepstack_input_embeds(5)
        except ValueError as exc:
            raise AssertionError(
                f"{name}._clear_deepstack_input_embeds(5) with 3 rows stored "
                f"raised ValueError: {exc} (the vllm#40145 bounds check)"
            ) from None
        for buffer in model.deepstack_input_embeds:
            assert bool(buffer.eq(0).all()), f"{name}: clear left rows behind"

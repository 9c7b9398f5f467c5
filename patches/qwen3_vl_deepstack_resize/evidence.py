"""The evidence of vllm#43617: what the compiled graph does with a payload.

vLLM traces the language model once, in the profiling run, with no
deepstack payload stored, then runs the compiled code for every step without
re-checking dynamo's guards. This measurement does the same with the tree's
deepstack methods (compiled from its file) and a stand-in decoder that adds
each deepstack level to the hidden states: the decoder is compiled with
Inductor in a profiling step (nothing stored), its compiled code is then
dispatched to directly (as vLLM's compilation wrapper does) for a step with a
payload, and its output is compared with the eager decoder's on that payload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.proof.measure import measurement

from .._deepstack_buffer import CLEAR, GET, SET
from .._deepstack_buffer.evidence import deepstack_class, model_on

ROWS, HIDDEN, LEVELS = 16, 64, 3


def measure(tree: Path, patch: Patch, device: str) -> dict[str, Any]:
    import torch

    where, cls = deepstack_class(tree)
    model = model_on(
        cls, device, rows=ROWS, hidden=HIDDEN, levels=LEVELS, dtype=torch.float32
    )
    torch.manual_seed(0)
    weight = torch.randn(HIDDEN, HIDDEN, device=device) / HIDDEN**0.5

    def decoder(hidden_states: Any, deepstack: Any) -> Any:
        if deepstack is not None:
            for tensor in deepstack.values():
                hidden_states = hidden_states + tensor
        return hidden_states @ weight

    def deepstack_of(rows: int) -> Any:
        levels = model._get_deepstack_input_embeds(rows)
        return None if levels is None else dict(levels.tensors)

    traced = _compiled_code(decoder)
    hidden_states = torch.randn(ROWS, HIDDEN, device=device)
    # The profiling run: nothing stored; dynamo traces what _get_ returns.
    model._clear_deepstack_input_embeds(ROWS)
    profiled = deepstack_of(ROWS)
    traced.trace(hidden_states, profiled)
    # A real step: the vision encoder stored a payload.
    payload = torch.randn(LEVELS, ROWS, HIDDEN, device=device)
    model._set_deepstack_input_embeds(payload)
    step = deepstack_of(ROWS)
    compiled_out = traced.dispatch(hidden_states, step)
    eager_out = decoder(hidden_states, step)
    difference = float((compiled_out - eager_out).abs().max())
    scale = float(eager_out.abs().max())
    symptom = difference > 1e-3 * max(scale, 1.0)
    traced_levels = 0 if profiled is None else len(profiled)
    return measurement(
        what=(
            f"{where} {CLEAR}, {GET} (profiling step, nothing stored) traced "
            f"into a stand-in decoder compiled with Inductor; then {SET} with "
            f"a payload ({LEVELS} levels x {ROWS} x {HIDDEN}) and the compiled "
            "code run without guards, as vLLM dispatches it"
        ),
        symptom=symptom,
        mechanism=(
            f"the profiling trace saw {traced_levels} deepstack levels; largest "
            f"difference compiled vs eager {difference:.3g}"
        ),
        figures={
            "max_abs_difference": difference,
            "max_abs_output": scale,
            "levels_traced": traced_levels,
            "levels_with_payload": len(step or {}),
        },
    )


class _compiled_code:
    """A function compiled by dynamo once, then run through its compiled code
    directly: vLLM's ``TorchCompileWrapperWithCustomDispatcher`` skips the
    guards that would otherwise recompile it for a different input."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self.original = function.__code__
        self.code: Any = None

    def trace(self, *args: Any) -> Any:
        import torch

        def hook(old: Any, new: Any) -> None:
            if old is self.original:
                self.code = new

        torch._dynamo.reset()
        handle = torch._dynamo.convert_frame.register_bytecode_hook(hook)
        try:
            return torch.compile(self.function, backend="inductor")(*args)
        finally:
            handle.remove()

    def dispatch(self, *args: Any) -> Any:
        assert self.code is not None, "dynamo compiled nothing"
        self.function.__code__ = self.code
        try:
            return self.function(*args)
        finally:
            self.function.__code__ = self.original

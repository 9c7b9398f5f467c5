"""The evidence of vllm#40932: a padded step, accepted or rejected.

With CUDA graphs, a step runs padded to the captured size: more tokens than
the deepstack payload stored. The tree's ``_set_``, ``_get_`` and ``_clear_``
deepstack methods (compiled from its file) run on buffers on the device: a
payload of 3 tokens, then a step padded to 5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.proof.measure import measurement

from .._deepstack_buffer import CLEAR, GET, SET
from .._deepstack_buffer.evidence import deepstack_class, model_on

STORED, PADDED, HIDDEN, LEVELS, BUFFER_ROWS = 3, 5, 64, 3, 16


def measure(tree: Path, patch: Patch, device: str) -> dict[str, Any]:
    import torch

    where, cls = deepstack_class(tree)
    model = model_on(
        cls, device, rows=BUFFER_ROWS, hidden=HIDDEN, levels=LEVELS,
        dtype=torch.float32,
    )  # fmt: skip
    model._set_deepstack_input_embeds(torch.ones(LEVELS, STORED, HIDDEN, device=device))
    error = ""
    rows = None
    try:
        padded = model._get_deepstack_input_embeds(PADDED)
        rows = sorted({int(t.shape[0]) for t in padded.tensors.values()})
        model._clear_deepstack_input_embeds(PADDED)
    except ValueError as exc:
        error = f"ValueError: {exc}"
    symptom = bool(error)
    return measurement(
        what=(
            f"{where} {SET} with {STORED} tokens, then {GET}({PADDED}) and "
            f"{CLEAR}({PADDED}) (a step padded to {PADDED} tokens), buffers on "
            "the device"
        ),
        symptom=symptom,
        mechanism="padded step rejected: " + error
        if symptom
        else f"padded step accepted ({rows} rows per level)",
        figures={"accepted": not symptom, "error": error, "rows": rows},
    )

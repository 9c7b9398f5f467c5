"""vllm#40917 beyond the example harness: a forward that slices what it built.

Issue 12 item 5: a vendor that slices the ``IntermediateTensors`` after
building it from the whole buffers has the fix; the patch must call that
``applied`` and leave it alone, never slice the buffers a second time.
"""

from __future__ import annotations

import ast

import pytest
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.patches import patch_by_id

PATCH = patch_by_id("vllm#40917")
FORWARD = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None):
        ds = IntermediateTensors(
            {{
                f"ds_{{l}}": self._ds_buffers[i]
                for i, l in enumerate(self._ds_layer_indices)
            }}
        ){direct}
{after}        return self.language_model.model(deepstack_input_embeds=ds)
"""


def states(code: str) -> list[PatchState]:
    return [f.state for f in PATCH.recognise(ast.parse(code), "x.py")]


@pytest.mark.parametrize(
    ("direct", "after"),
    [
        ("", "        ds = ds[: inputs_embeds.size(0)]\n"),
        ("", "        rows = inputs_embeds.shape[0]\n        ds = ds[:rows]\n"),
        ("[: inputs_embeds.size(0)]", ""),
    ],
    ids=[
        "ds = ds[:size]",
        "rows then ds = ds[:rows]",
        "IntermediateTensors(...)[:size]",
    ],
)
def test_sliced_after_building_is_applied_not_sliced_twice(
    direct: str, after: str
) -> None:
    code = FORWARD.format(direct=direct, after=after)
    assert states(code) == [PatchState.APPLIED]
    assert rewrite_text(PATCH, code) == code


def test_slice_by_another_bound_after_building_is_still_needed() -> None:
    # Not the step's rows: the buffers still reach the model whole-sized.
    code = FORWARD.format(direct="", after="        ds = ds[: self.max_rows]\n")
    assert states(code) == [PatchState.NEEDED]

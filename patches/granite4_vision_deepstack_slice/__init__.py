"""vllm#40917: Granite4Vision hands the compiled model full-size deepstack buffers.

Symptom: Granite4Vision decode about 5x slower: Inductor compiles for the full
max_num_batched_tokens deepstack buffer on every step

Why: ``forward`` builds the ``IntermediateTensors`` it passes to the language
model from the persistent buffers ``self._ds_buffers[lvl]``, which hold
``max_num_batched_tokens`` rows. Inductor specialises on that size and
generates kernels for the whole buffer on every step, however few tokens
there are. The fix slices each buffer to the rows of this step,
``n = inputs_embeds.size(0)``.

Fix safety: Adds ``n = inputs_embeds.size(0)`` before the IntermediateTensors
is built, and slices each buffer in that build to the step's rows
(``self._ds_buffers[lvl]`` becomes ``self._ds_buffers[lvl][:n]``); nothing
else in forward changes.

A build is rewritten only in the shape upstream has: assigned to a name
(``ds = IntermediateTensors(...)``, annotated or not), one dict comprehension
over ``enumerate(self._ds_layer_indices)``, and as its value exactly the
level's buffer ``self._ds_buffers[lvl]``. A later ``n = ...`` in upstream's
``forward`` (the buffer clearing) assigns ``n`` again before reading it, so
it is unaffected. If ``n`` is read before that point the code is reported
drifted, since the new assignment could change its meaning.

Fixed already, and never sliced again: each level's buffer cut to the step's
rows, ``[:rows]``, ``[0:rows]`` or ``.narrow(0, 0, rows)``, with ``rows``
``inputs_embeds.size(0)``, ``inputs_embeds.shape[0]`` or a name whose last
assignment before the build is one of them; or what was built sliced to the
rows (``ds = ds[:n]``, or ``IntermediateTensors(...)[:n]``). Anything else
around the buffer (``.clone()``, ``* 0``, another call or bound, another
level), another iteration, or a build not assigned to a name is drifted, at
the line of what was found, quoting it.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import (
    called_name,
    finding,
    iter_functions,
    parameter_names,
    rewrite_definitions,
)

from .._follow_ups import FOLLOW_UPS
from .recognise import (
    BufferForm,
    Unknown,
    build_form,
    mentions_buffers,
    name_free_at,
    own_nodes,
    sliced_after_building,
)
from .rewrite import slice_buffers

if TYPE_CHECKING:
    import libcst

BEFORE = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None,
                inputs_embeds=None, **kwargs):
        if (
            inputs_embeds is not None
            and get_pp_group().is_first_rank
            and self._ds_layer_indices
        ):
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": self._ds_buffers[lvl]
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

AFTER = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None,
                inputs_embeds=None, **kwargs):
        if (
            inputs_embeds is not None
            and get_pp_group().is_first_rank
            and self._ds_layer_indices
        ):
            n = inputs_embeds.size(0)
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": self._ds_buffers[lvl][:n]
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

# A vendor renamed the loop variables and the embeddings are positional: the
# fix follows the names the code uses.
RENAMED_BEFORE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        if inputs_embeds is not None:
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i]  # deepstack level i
                for i, layer in enumerate(self._ds_layer_indices)
            })
        return ds
"""

RENAMED_AFTER = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        if inputs_embeds is not None:
            n = inputs_embeds.size(0)
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i][:n]  # deepstack level i
                for i, layer in enumerate(self._ds_layer_indices)
            })
        return ds
"""

# A vendor's layout (another line length, single quotes, comments inside the
# comprehension, no blank lines): the fix goes in the same place, comments stay.
VENDOR_LAYOUT_BEFORE = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        # vendor: deepstack only on the first pipeline rank
        if inputs_embeds is not None and self._ds_layer_indices:
            # vendor: persistent buffers, see VENDOR-123
            ds: IntermediateTensors | None = IntermediateTensors({
                # one entry per deepstack level
                f'ds_{llm_layer}': self._ds_buffers[lvl]
                for lvl, llm_layer in enumerate(self._ds_layer_indices)
            })
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

VENDOR_LAYOUT_AFTER = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        # vendor: deepstack only on the first pipeline rank
        if inputs_embeds is not None and self._ds_layer_indices:
            # vendor: persistent buffers, see VENDOR-123
            n = inputs_embeds.size(0)
            ds: IntermediateTensors | None = IntermediateTensors({
                # one entry per deepstack level
                f'ds_{llm_layer}': self._ds_buffers[lvl][:n]
                for lvl, llm_layer in enumerate(self._ds_layer_indices)
            })
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

# Sliced by something else: neither the bug nor the fix, so nothing is touched.
SLICED_OTHERWISE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i][: self.max_tokens]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds
"""

# `n` already holds something the function returns: assigning it would
# change what the function returns.
N_IN_USE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        n = len(input_ids)
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds, n
"""


# A vendor slices what it built (IntermediateTensors slices every tensor it
# holds): fixed already, and slicing the buffers as well would slice twice.
SLICED_AFTER_BUILDING = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        if inputs_embeds is not None and self._ds_layer_indices:
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": self._ds_buffers[lvl]
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
            n = inputs_embeds.size(0)
            ds = ds[:n]  # vendor: only this step's rows reach the compiled model
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""


# A vendor's forward with one line for the row count and the comprehension's
# value left open: the variants below fill them in.
VENDOR_FORWARD = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        if inputs_embeds is not None and self._ds_layer_indices:
            ROWS
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": VALUE
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""


def vendor_forward(value: str, rows: str = "pass") -> str:
    return VENDOR_FORWARD.replace("VALUE", value).replace("ROWS", rows)


# A vendor's own forms of the fix: each level's buffer cut to the step's rows,
# by the row count or a name assigned from it. Fixed: never sliced again.
NARROWED = vendor_forward("self._ds_buffers[lvl].narrow(0, 0, inputs_embeds.shape[0])")
NARROWED_BY_NAME = vendor_forward(
    "self._ds_buffers[lvl].narrow(0, 0, rows)", "rows = inputs_embeds.size(0)"
)
SLICED_FROM_ZERO = vendor_forward(
    "self._ds_buffers[lvl][0:rows]", "rows = inputs_embeds.shape[0]"
)

# Something else around the buffer: neither the bug nor the fix. Slicing it
# would write `self._ds_buffers[lvl][:n].clone()`, code nobody reviewed.
CLONED = vendor_forward("self._ds_buffers[lvl].clone()")
ZEROED = vendor_forward("self._ds_buffers[lvl] * 0")
NARROWED_OTHERWISE = vendor_forward("self._ds_buffers[lvl].narrow(0, 0, self.max_rows)")
# `n` is not the step's row count where the build reads it.
SLICED_BY_STALE_ROWS = vendor_forward(
    "self._ds_buffers[lvl][:n]", "n = inputs_embeds.size(0); n = self.max_rows"
)
# Another level of the buffers than the comprehension's own.
OTHER_LEVEL = vendor_forward("self._ds_buffers[llm_layer]")

# The build's context is not the known one: other levels, or the build not
# assigned to a name (here passed straight on, or chosen by a condition).
OTHER_LEVELS = (
    VENDOR_FORWARD.replace("VALUE", "self._ds_buffers[lvl]")
    .replace(
        "enumerate(self._ds_layer_indices)", "enumerate(self._ds_layer_indices[1:])"
    )
    .replace("ROWS", "pass")
)
BUILT_IN_THE_CALL = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        return self.language_model.model(
            input_ids,
            positions,
            deepstack_input_embeds=IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i]
                for i, layer in enumerate(self._ds_layer_indices)
            }),
        )
"""
BUILT_UNDER_A_CONDITION = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i]
            for i, layer in enumerate(self._ds_layer_indices)
        }) if self._ds_buffers[0].numel() else None
        return ds
"""


# A build in a nested function is its own finding: the enclosing function's
# rewrite leaves it to that finding, so each is sliced once.
NESTED_BUILD_BEFORE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        def deepstack(inputs_embeds):
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i]
                for i, layer in enumerate(self._ds_layer_indices)
            })
            return ds

        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds, deepstack(inputs_embeds)
"""

NESTED_BUILD_AFTER = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        def deepstack(inputs_embeds):
            n = inputs_embeds.size(0)
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i][:n]
                for i, layer in enumerate(self._ds_layer_indices)
            })
            return ds

        n = inputs_embeds.size(0)
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i][:n]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds, deepstack(inputs_embeds)
"""


class Granite4VisionDeepstackSlice(Patch):
    id = "vllm#40917"
    title = "Granite4Vision: slice deepstack buffers to the step's tokens"
    upstream_url = "https://github.com/vllm-project/vllm/pull/40917"
    fixed_in = "0.21.0"
    # The module docstring (the class has none) is the one source of both.
    symptom = section(__doc__, "Symptom")
    also_changes = section(__doc__, "Fix safety")
    paths = ("vllm/model_executor/models/*.py",)
    markers = (b"_ds_buffers",)
    follow_ups = FOLLOW_UPS["vllm#40917"]
    parts = {"": "method that builds IntermediateTensors from self._ds_buffers"}
    examples = (
        Example("upstream 0.20.x forward", BEFORE, AFTER),
        Example(
            "renamed loop variables, trailing comment", RENAMED_BEFORE, RENAMED_AFTER
        ),
        Example(
            "vendor layout and comments", VENDOR_LAYOUT_BEFORE, VENDOR_LAYOUT_AFTER
        ),
        Example("already sliced (upstream 0.21.0)", AFTER, state=PatchState.APPLIED),
        Example(
            "sliced after building (vendor)",
            SLICED_AFTER_BUILDING,
            state=PatchState.APPLIED,
        ),
        Example("sliced by another bound", SLICED_OTHERWISE, state=PatchState.DRIFTED),
        Example(
            "n read before the fix's assignment", N_IN_USE, state=PatchState.DRIFTED
        ),
        Example(
            "a build in a nested function too", NESTED_BUILD_BEFORE, NESTED_BUILD_AFTER
        ),
        Example("narrowed to the rows (vendor)", NARROWED, state=PatchState.APPLIED),
        Example(
            "narrowed by a name for the rows (vendor)",
            NARROWED_BY_NAME,
            state=PatchState.APPLIED,
        ),
        Example("sliced [0:rows] (vendor)", SLICED_FROM_ZERO, state=PatchState.APPLIED),
        Example("buffer cloned", CLONED, state=PatchState.DRIFTED),
        Example("buffer multiplied", ZEROED, state=PatchState.DRIFTED),
        Example(
            "narrowed by another bound", NARROWED_OTHERWISE, state=PatchState.DRIFTED
        ),
        Example(
            "sliced by a name no longer the rows",
            SLICED_BY_STALE_ROWS,
            state=PatchState.DRIFTED,
        ),
        Example("another level's buffer", OTHER_LEVEL, state=PatchState.DRIFTED),
        Example("other levels", OTHER_LEVELS, state=PatchState.DRIFTED),
        Example("built inside the call", BUILT_IN_THE_CALL, state=PatchState.DRIFTED),
        Example(
            "built under a condition",
            BUILT_UNDER_A_CONDITION,
            state=PatchState.DRIFTED,
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        findings = []
        for qualname, function in iter_functions(tree):
            builds = [
                call
                for call in own_nodes(function)
                if called_name(call) == "IntermediateTensors"
                and any(mentions_buffers(arg) for arg in call.args)
            ]
            if builds:
                findings.append(self._recognise_function(qualname, function, builds))
        return findings

    def _recognise_function(
        self, qualname: str, function: ast.FunctionDef, builds: list[ast.Call]
    ) -> Finding:
        if "inputs_embeds" not in parameter_names(function):
            return finding(
                PatchState.DRIFTED,
                qualname,
                function,
                f"no inputs_embeds parameter to size the slice by; {EXPECTED}",
            )
        forms = []
        for build in builds:
            form = build_form(function, build)
            if isinstance(form, Unknown):
                # The line of what was found; the function is the span.
                return finding(
                    PatchState.DRIFTED,
                    qualname,
                    [form.node, function],
                    f"found {form.found} at line {form.node.lineno}; "
                    f"expected {form.expected}",
                )
            forms.append(form)
        if all(form is BufferForm.WHOLE for form in forms):
            if sliced_after_building(function, builds):
                # Fixed another way: slicing the buffers too would slice twice.
                return finding(PatchState.APPLIED, qualname, function, rewrites=())
            first_build = min(call.lineno for call in builds)
            if not name_free_at(function, "n", first_build):
                return finding(
                    PatchState.DRIFTED,
                    qualname,
                    function,
                    f"`n` already has a meaning in {qualname} around line "
                    f"{first_build}, where the fix would assign it",
                )
            return finding(PatchState.NEEDED, qualname, function)
        if BufferForm.WHOLE not in forms:
            # A vendor's equivalent is the fix, but never upstream's code.
            upstream = all(form is BufferForm.UPSTREAM for form in forms)
            rewrites = None if upstream else ()
            return finding(PatchState.APPLIED, qualname, function, rewrites=rewrites)
        return finding(
            PatchState.DRIFTED,
            qualname,
            function,
            "some IntermediateTensors builds in it slice the buffers to the "
            f"step's rows and some do not; {EXPECTED}",
        )

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        return rewrite_definitions(module, {f.symbol: slice_buffers for f in needed})

    def prove(self, tree: Path) -> None:
        """``forward`` hands the language model buffers of the step's rows."""
        from .proof import prove_forward

        prove_forward(tree, self)


EXPECTED = (
    "expected ds = IntermediateTensors({...: self._ds_buffers[lvl] for lvl, "
    "layer in enumerate(self._ds_layer_indices)}) (needed), or each buffer "
    "sliced to the step's rows, self._ds_buffers[lvl][:n] after "
    "n = inputs_embeds.size(0) or .narrow(0, 0, n) (applied)"
)


PATCH = Granite4VisionDeepstackSlice()

"""vllm#43617: Qwen3-VL deepstack features vanish from the compiled graph.

Symptom: Qwen3-VL / Qwen3-Omni accuracy drop under torch.compile (Geo3K 0.205
compiled vs 0.291 eager): _get_deepstack_input_embeds returns None in the
profiling run, so the compiled decoder has no deepstack branch

Why: on vLLM 0.20.0 to 0.22.1 the default torch.compile path loses accuracy.
Since vllm#40145, ``_get_deepstack_input_embeds`` returns ``None`` while the
buffers' token counter is 0, and it is 0 during the profiling run that
torch.compile traces: the compiled decoder has no deepstack branch, and every
later step runs without the vision features it should add. The fix makes
``_get_`` always return ``IntermediateTensors`` (zeros add nothing), growing
the buffers when a step needs more rows than they hold.

Fix safety: Adds a method _resize_deepstack_input_embeds after
_get_deepstack_input_embeds, moving into it the buffer growth
_set_deepstack_input_embeds had inline; _set_ calls it instead, and _get_
calls it in place of its early ``return None`` on an empty counter.

In detail, in each class that defines the methods, the rewrite
- replaces the early ``return None`` on an empty counter in ``_get_`` with
  ``if num_tokens > self.deepstack_input_embeds[0].size(0):
  self._resize_deepstack_input_embeds(num_tokens)``;
- ADDS a method ``_resize_deepstack_input_embeds(self, num_tokens)`` right
  after ``_get_``, holding the buffer growth ``_set_`` had inline (the
  tree's own allocation, which keeps the buffers' device and dtype);
- makes ``_set_`` call it instead of its inline copy.
The guard for a skipped vision tower stays. Recognised: the early return as
a statement of ``_get_``'s body (nested in other code: drifted), and the
growth as a statement of ``_set_``'s body that reads only ``self``, its row
count and module names (one reading another local or a parameter of
``_set_`` is drifted: the new method would not have it). Where vllm#40932's bounds check
is still in ``_get_`` it is left alone, and this patch requires vllm#40932
first: with the check but without the early return, the profiling run (0
rows stored, N asked for) would raise instead of tracing zeros.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import FunctionNode, rewrite_definitions, span

from .._deepstack_buffer import (
    BUFFERS,
    GET,
    MARKERS,
    MODEL_PATHS,
    NOT_PRESENT,
    RESIZE,
    SET,
    calls_self_method,
    deepstack_classes,
    has_counter,
    is_empty_counter_return,
    token_parameter,
)
from .._follow_ups import FOLLOW_UPS
from .recognise import inline_growth, reads_other_num_tokens, setter_locals_read
from .rewrite import rewrite_class

if TYPE_CHECKING:
    import libcst

BEFORE = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens: int) -> IntermediateTensors:
        if not getattr(self, "deepstack_input_embeds", None):
            return None  # no vision tower on this rank
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None

        return IntermediateTensors(
            {
                f"ds_{i}": b[:num_tokens]
                for i, b in enumerate(self.deepstack_input_embeds)
            }
        )

    def _set_deepstack_input_embeds(self, embeds: torch.Tensor) -> None:
        num_tokens = embeds.size(1)
        if num_tokens > self.deepstack_input_embeds[0].size(0):
            self.deepstack_input_embeds = [
                torch.zeros(
                    num_tokens,
                    self.hidden_size,
                    device=self.deepstack_input_embeds[0].device,
                    dtype=self.deepstack_input_embeds[0].dtype,
                )
                for _ in self.deepstack_input_embeds
            ]
        for b, level in zip(self.deepstack_input_embeds, embeds):
            b[:num_tokens].copy_(level)
        self.deepstack_input_embeds_num_tokens = num_tokens
"""

AFTER = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens: int) -> IntermediateTensors:
        if not getattr(self, "deepstack_input_embeds", None):
            return None  # no vision tower on this rank
        if num_tokens > self.deepstack_input_embeds[0].size(0):
            self._resize_deepstack_input_embeds(num_tokens)

        return IntermediateTensors(
            {
                f"ds_{i}": b[:num_tokens]
                for i, b in enumerate(self.deepstack_input_embeds)
            }
        )

    def _resize_deepstack_input_embeds(self, num_tokens: int) -> None:
        self.deepstack_input_embeds = [
            torch.zeros(
                num_tokens,
                self.hidden_size,
                device=self.deepstack_input_embeds[0].device,
                dtype=self.deepstack_input_embeds[0].dtype,
            )
            for _ in self.deepstack_input_embeds
        ]

    def _set_deepstack_input_embeds(self, embeds: torch.Tensor) -> None:
        num_tokens = embeds.size(1)
        if num_tokens > self.deepstack_input_embeds[0].size(0):
            self._resize_deepstack_input_embeds(num_tokens)
        for b, level in zip(self.deepstack_input_embeds, embeds):
            b[:num_tokens].copy_(level)
        self.deepstack_input_embeds_num_tokens = num_tokens
"""

# A vendor renamed the locals, reads the counter plainly and commented the
# growth: the new method takes upstream's parameter name, each call site
# keeps its own, and the early return's comments stay with its replacement.
RENAMED_BEFORE = """
class VendorModel:
    def _get_deepstack_input_embeds(self, n):
        # nothing stored yet: skip deepstack
        if not self.deepstack_input_embeds_num_tokens:
            return None
        return IntermediateTensors({"ds_0": self.deepstack_input_embeds[0][:n]})

    def _set_deepstack_input_embeds(self, embeds):
        rows = embeds.size(1)
        if rows > self.deepstack_input_embeds[0].size(0):  # grow on demand
            self.deepstack_input_embeds = [
                torch.zeros(rows, self.hidden_size,
                            device=self.deepstack_input_embeds[0].device,
                            dtype=self.deepstack_input_embeds[0].dtype)
            ]
        self.deepstack_input_embeds[0][:rows].copy_(embeds[0])
        self.deepstack_input_embeds_num_tokens = rows
"""

RENAMED_AFTER = """
class VendorModel:
    def _get_deepstack_input_embeds(self, n):
        # nothing stored yet: skip deepstack
        if n > self.deepstack_input_embeds[0].size(0):
            self._resize_deepstack_input_embeds(n)
        return IntermediateTensors({"ds_0": self.deepstack_input_embeds[0][:n]})

    def _resize_deepstack_input_embeds(self, num_tokens: int) -> None:
        self.deepstack_input_embeds = [
            torch.zeros(num_tokens, self.hidden_size,
                        device=self.deepstack_input_embeds[0].device,
                        dtype=self.deepstack_input_embeds[0].dtype)
        ]

    def _set_deepstack_input_embeds(self, embeds):
        rows = embeds.size(1)
        if rows > self.deepstack_input_embeds[0].size(0):  # grow on demand
            self._resize_deepstack_input_embeds(rows)
        self.deepstack_input_embeds[0][:rows].copy_(embeds[0])
        self.deepstack_input_embeds_num_tokens = rows
"""

# vllm#40932's bounds check not yet removed (0.20.0 without it): this patch
# leaves it to vllm#40932, which the series runs first.
WITH_BOUNDS_CHECK_BEFORE = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens):
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None
        if num_tokens > self.deepstack_input_embeds_num_tokens:
            raise ValueError(num_tokens)
        rows = self.deepstack_input_embeds[0][:num_tokens]
        return IntermediateTensors({"ds_0": rows})

    def _set_deepstack_input_embeds(self, embeds):
        num_tokens = embeds.size(1)
        if num_tokens > self.deepstack_input_embeds[0].size(0):
            self.deepstack_input_embeds = [
                torch.zeros(num_tokens, 8, device=self.deepstack_input_embeds[0].device,
                            dtype=self.deepstack_input_embeds[0].dtype)
            ]
        self.deepstack_input_embeds[0][:num_tokens].copy_(embeds[0])
        self.deepstack_input_embeds_num_tokens = num_tokens
"""

WITH_BOUNDS_CHECK_AFTER = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens):
        if num_tokens > self.deepstack_input_embeds[0].size(0):
            self._resize_deepstack_input_embeds(num_tokens)
        if num_tokens > self.deepstack_input_embeds_num_tokens:
            raise ValueError(num_tokens)
        rows = self.deepstack_input_embeds[0][:num_tokens]
        return IntermediateTensors({"ds_0": rows})

    def _resize_deepstack_input_embeds(self, num_tokens: int) -> None:
        self.deepstack_input_embeds = [
            torch.zeros(num_tokens, 8, device=self.deepstack_input_embeds[0].device,
                        dtype=self.deepstack_input_embeds[0].dtype)
        ]

    def _set_deepstack_input_embeds(self, embeds):
        num_tokens = embeds.size(1)
        if num_tokens > self.deepstack_input_embeds[0].size(0):
            self._resize_deepstack_input_embeds(num_tokens)
        self.deepstack_input_embeds[0][:num_tokens].copy_(embeds[0])
        self.deepstack_input_embeds_num_tokens = num_tokens
"""

# Before vllm#40145 (0.19.x and older): no counter, no early return.
NO_COUNTER = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens):
        if not getattr(self, "deepstack_input_embeds", None):
            return None
        rows = self.deepstack_input_embeds[0][:num_tokens]
        return IntermediateTensors({"ds_0": rows})

    def _set_deepstack_input_embeds(self, embeds):
        self.deepstack_input_embeds[0][: embeds.size(1)].copy_(embeds[0])
"""

# The buffers grow by concatenation, not by the reallocation the new method
# is made of: nothing to move into _resize_.
GROWS_BY_CAT = """
class VendorModel:
    def _get_deepstack_input_embeds(self, num_tokens):
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None
        rows = self.deepstack_input_embeds[0][:num_tokens]
        return IntermediateTensors({"ds_0": rows})

    def _set_deepstack_input_embeds(self, embeds):
        num_tokens = embeds.size(1)
        old = self.deepstack_input_embeds[0]
        self.deepstack_input_embeds[0] = torch.cat([old, embeds[0]])
        self.deepstack_input_embeds_num_tokens = num_tokens
"""

# The growth forgets the buffers' dtype: moving it would keep that bug.
GROWTH_LOSES_DTYPE = """
class VendorModel:
    def _get_deepstack_input_embeds(self, num_tokens):
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None
        rows = self.deepstack_input_embeds[0][:num_tokens]
        return IntermediateTensors({"ds_0": rows})

    def _set_deepstack_input_embeds(self, embeds):
        num_tokens = embeds.size(1)
        if num_tokens > self.deepstack_input_embeds[0].size(0):
            self.deepstack_input_embeds = [torch.zeros(num_tokens, 8)]
        self.deepstack_input_embeds_num_tokens = num_tokens
"""


# The reallocation reads a local of `_set_` (`hidden`): moved into the new
# method it would be undefined there (NameError on the first resize).
GROWTH_READS_SETTER_LOCAL = BEFORE.replace(
    "        num_tokens = embeds.size(1)\n",
    "        num_tokens = embeds.size(1)\n        hidden = embeds.size(2)\n",
).replace("                    self.hidden_size,\n", "                    hidden,\n")


class Qwen3VLDeepstackResize(Patch):
    id = "vllm#43617"
    title = "Qwen3-VL deepstack: always return buffers, growing them on demand"
    upstream_url = "https://github.com/vllm-project/vllm/pull/43617"
    fixed_in = "0.23.0"
    # The module docstring (the class has none) is the one source of both.
    symptom = section(__doc__, "Symptom")
    also_changes = section(__doc__, "Fix safety")
    requires = ("vllm#40932",)
    # Always returning the buffers hands a skipped vision tower's meta
    # buffers to the decoder (vllm#49384); upstream repaired it in vllm#49397.
    companions = ("vllm#49397",)
    follow_ups = FOLLOW_UPS["vllm#43617"]
    paths = MODEL_PATHS
    markers = MARKERS
    parts = {"": "class defining _get_deepstack_input_embeds"}
    examples = (
        Example("upstream 0.20.2-0.22.1 shape", BEFORE, AFTER),
        Example("renamed locals, comments", RENAMED_BEFORE, RENAMED_AFTER),
        Example(
            "vllm#40932 not yet applied",
            WITH_BOUNDS_CHECK_BEFORE,
            WITH_BOUNDS_CHECK_AFTER,
        ),
        Example("resize method (upstream 0.23.0)", AFTER, state=PatchState.APPLIED),
        Example(
            "no token counter (0.19.x)", NO_COUNTER, state=PatchState.NOT_APPLICABLE
        ),
        Example("growth by concatenation", GROWS_BY_CAT, state=PatchState.DRIFTED),
        Example("growth loses dtype", GROWTH_LOSES_DTYPE, state=PatchState.DRIFTED),
        Example(
            "growth reads a local of _set_",
            GROWTH_READS_SETTER_LOCAL,
            state=PatchState.DRIFTED,
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        return [
            self._recognise_class(qualname, cls, methods)
            for qualname, cls, methods in deepstack_classes(tree)
        ]

    def _recognise_class(
        self, qualname: str, cls: ast.ClassDef, methods: dict[str, FunctionNode]
    ) -> Finding:
        get, setter, resize = methods[GET], methods.get(SET), methods.get(RESIZE)
        present = [m for m in (get, resize, setter) if m is not None]
        first = min(span(m)[0] for m in present)
        last = max(span(m)[1] for m in present)

        def result(state: PatchState, reason: str = "") -> Finding:
            fixed = (f"{qualname}.{GET}", f"{qualname}.{RESIZE}", f"{qualname}.{SET}")
            return Finding(
                state=state,
                symbol=f"{qualname}.{GET}",
                line=get.lineno,
                span=(first, last),
                reason=reason,
                rewrites=fixed if state is not PatchState.NOT_APPLICABLE else (),
            )

        expected = (
            f"expected {GET} to return None on an empty token counter and {SET} "
            f"to reallocate self.{BUFFERS} inline (needed), or both to call "
            f"{RESIZE} (applied)"
        )
        early = [s for s in get.body if is_empty_counter_return(s)]
        nested_early = [
            n for n in ast.walk(get) if is_empty_counter_return(n) and n not in early
        ]
        if nested_early:
            return result(
                PatchState.DRIFTED,
                f"the empty-counter return at line {nested_early[0].lineno} is "
                f"nested in other code; {expected}",
            )
        if setter is None:
            return result(PatchState.DRIFTED, f"no {SET} in the class; {expected}")
        growth = [s for s in setter.body if inline_growth(s)]
        if early:
            if len(early) > 1 or resize is not None:
                return result(PatchState.DRIFTED, expected)
            if len(growth) != 1:
                return result(
                    PatchState.DRIFTED,
                    f"{SET} (line {setter.lineno}) does not reallocate "
                    f"self.{BUFFERS} in one `if <n> > self.{BUFFERS}[0].size(0):` "
                    "keeping their device and dtype; " + expected,
                )
            if token_parameter(get) is None:
                return result(PatchState.DRIFTED, f"{GET} takes no token count")
            strangers = setter_locals_read(setter, growth[0])
            if strangers:
                return result(
                    PatchState.DRIFTED,
                    f"the reallocation in {SET} at line {growth[0].lineno} reads "
                    f"{', '.join(strangers)}, bound in {SET}: the new method "
                    f"{RESIZE}(self, num_tokens) would not have "
                    f"{'it' if len(strangers) == 1 else 'them'}; expected it to "
                    "read only self, its row count and module names",
                )
            if reads_other_num_tokens(growth[0]):
                return result(
                    PatchState.DRIFTED,
                    f"the reallocation in {SET} reads a `num_tokens` besides its "
                    "own row count: renaming it for the new method would clash",
                )
            return result(PatchState.NEEDED)
        if resize is not None:
            if calls_self_method(get, RESIZE) and calls_self_method(setter, RESIZE):
                if growth:
                    return result(
                        PatchState.DRIFTED,
                        f"{SET} still reallocates the buffers inline; {expected}",
                    )
                return result(PatchState.APPLIED)
            return result(PatchState.DRIFTED, expected)
        if not has_counter(cls):
            return result(PatchState.NOT_APPLICABLE, NOT_PRESENT)
        return result(PatchState.DRIFTED, expected)

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        classes = {f.symbol.rsplit(".", 1)[0] for f in needed}
        return rewrite_definitions(
            module, {name: lambda cls: rewrite_class(cls, module) for name in classes}
        )

    def prove(self, tree: Path) -> None:
        from .proof import prove_zeros_while_profiling

        prove_zeros_while_profiling(tree)


PATCH = Qwen3VLDeepstackResize()

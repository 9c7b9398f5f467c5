"""vllm#49397: Qwen3-VL / Qwen3-Omni crash at startup with image and video off.

Symptom: Qwen3-VL / Qwen3-Omni die at startup, in the profiling run, with
``RuntimeError: Tensor on device meta is not on the expected device cuda:0!``
(vllm#49384) when ``--limit-mm-per-prompt`` sets image and video to 0
(Qwen3-Omni served audio-only; Qwen3-VL text-only with prompt or multimodal
embeddings)

Why: the model's ``__init__`` builds its deepstack buffers
(``self.deepstack_input_embeds``) inside ``with self._mark_tower_model(...)``.
When every modality of that tower is limited to 0, the context skips the
tower: its block runs under ``torch.device("meta")``, so the buffers are meta
tensors. Wherever ``_get_deepstack_input_embeds`` hands them to the decoder
although no vision payload is stored, the decoder adds a meta tensor to a real
one. Releases before vllm#40145 (0.17-0.19) and from vllm#43617 on (0.23.0 to
0.27.1) do that natively; 0.20.0-0.22.1 return ``None`` instead, until
vllm#43617 is applied to them: this patch is that fix's companion, and the
series never applies vllm#43617 without it.

Fix safety: In each class whose ``__init__`` builds the buffers inside a tower
block, the buffer statement (``if self.use_deepstack: ...``) moves out of the
block to right after it, and the assignments from ``self.use_deepstack`` up to
the block move after the block too, ``use_deepstack`` becoming ``... and not
isinstance(self.<tower>, StageMissingLayer)``: with the tower skipped no
buffer is built and deepstack is off. A later ``if`` in ``__init__`` that
reads the flag (CohereCompass's check of the pipeline split, 0.30.0 on)
reads the old condition instead, so a tower skipped on a later pipeline
stage does not switch that check off. ``StageMissingLayer`` is imported from
the model utilities where the file does not import it yet. The comment
``# register buffer for deepstack`` that upstream dropped goes; other comments
move with their statements.

Recognised: the tower block as a statement of ``__init__``'s body holding one
``self.<tower> = ...`` and the one ``if self.use_deepstack:`` that builds the
buffers, after ``self.use_deepstack = ...`` and only assignments to ``self``.
A tower block that reads an attribute those assignments set (the tower built
with ``self.deepstack_num_level``) is drifted: the move would leave it unset
when the tower is built.

Upstream moved the tower block up in the Qwen3-Omni thinker and the
assignments down in Qwen3-VL; both give the same order, which this rewrite
writes in both. Classes that inherit ``__init__`` are fixed with their base;
a class with an ``__init__`` of its own (Qwen3-VL-MoE) is fixed on its own.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import finding, rewrite_definitions

from .._deepstack_buffer import BUFFERS, MODEL_PATHS
from .imports import GUARD, IMPORT_SYMBOL, MODELS_DIR, add_import, recognise_import
from .recognise import (
    TOWER,
    attributes_read,
    buffer_building_inits,
    builds_buffers,
    flag_index_before,
    flag_skips_missing_tower,
    is_flag_guard,
    is_tower_block,
    later_flag_checks,
    self_attribute_assigned,
)
from .rewrite import USE, rewrite_init

if TYPE_CHECKING:
    import libcst

#: Where the examples stand: beside the model utilities.
MODEL_FILE = MODELS_DIR + "tiny_vl.py"

BEFORE = """
from .utils import AutoWeightsLoader, PPMissingLayer, maybe_prefix


class TinyVL(nn.Module, SupportsMultiModal):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        config = vllm_config.model_config.hf_config

        self.use_deepstack = hasattr(config.vision_config, "deepstack_visual_indexes")
        self.deepstack_num_level = (
            len(config.vision_config.deepstack_visual_indexes)
            if self.use_deepstack
            else 0
        )

        with self._mark_tower_model(vllm_config, {"image", "video"}):
            self.visual = TinyVisionTower(config.vision_config)

            # register buffer for deepstack
            if self.use_deepstack:
                self.deepstack_input_embeds = [
                    torch.zeros(8, config.text_config.hidden_size)
                    for _ in range(self.deepstack_num_level)
                ]
                # Zero means there is no active deepstack payload to consume.
                self.deepstack_input_embeds_num_tokens = 0

        with self._mark_language_model(vllm_config):
            self.language_model = TinyLM(vllm_config)
"""

AFTER = """
from .utils import AutoWeightsLoader, PPMissingLayer, StageMissingLayer, maybe_prefix


class TinyVL(nn.Module, SupportsMultiModal):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        config = vllm_config.model_config.hf_config

        with self._mark_tower_model(vllm_config, {"image", "video"}):
            self.visual = TinyVisionTower(config.vision_config)

        self.use_deepstack = hasattr(
            config.vision_config, "deepstack_visual_indexes"
        ) and not isinstance(self.visual, StageMissingLayer)
        self.deepstack_num_level = (
            len(config.vision_config.deepstack_visual_indexes)
            if self.use_deepstack
            else 0
        )

        if self.use_deepstack:
            self.deepstack_input_embeds = [
                torch.zeros(8, config.text_config.hidden_size)
                for _ in range(self.deepstack_num_level)
            ]
            # Zero means there is no active deepstack payload to consume.
            self.deepstack_input_embeds_num_tokens = 0

        with self._mark_language_model(vllm_config):
            self.language_model = TinyLM(vllm_config)
"""

# The Qwen3-Omni thinker: another tower first, the flag already split over
# lines, the utilities imported in brackets and the buffer without a blank
# line before it.
OMNI_BEFORE = """
from .utils import (
    AutoWeightsLoader,
    WeightsMapper,
    maybe_prefix,
)


class TinyThinker(nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        thinker_config = vllm_config.model_config.hf_config
        with self._mark_tower_model(vllm_config, "audio"):
            self.audio_tower = TinyAudioTower(thinker_config.audio_config)

        self.use_deepstack = hasattr(
            thinker_config.vision_config, "deepstack_visual_indexes"
        )
        self.deepstack_num_level = 2 if self.use_deepstack else 0

        with self._mark_tower_model(vllm_config, {"image", "video"}):
            self.visual = TinyVisionTower(thinker_config.vision_config)
            if self.use_deepstack:
                self.deepstack_input_embeds = [torch.zeros(8, 4), torch.zeros(8, 4)]
"""

OMNI_AFTER = """
from .utils import (
    AutoWeightsLoader,
    StageMissingLayer,
    WeightsMapper,
    maybe_prefix,
)


class TinyThinker(nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        thinker_config = vllm_config.model_config.hf_config
        with self._mark_tower_model(vllm_config, "audio"):
            self.audio_tower = TinyAudioTower(thinker_config.audio_config)

        with self._mark_tower_model(vllm_config, {"image", "video"}):
            self.visual = TinyVisionTower(thinker_config.vision_config)

        self.use_deepstack = hasattr(
            thinker_config.vision_config, "deepstack_visual_indexes"
        ) and not isinstance(self.visual, StageMissingLayer)
        self.deepstack_num_level = 2 if self.use_deepstack else 0

        if self.use_deepstack:
            self.deepstack_input_embeds = [torch.zeros(8, 4), torch.zeros(8, 4)]
"""

# A file that imports nothing from the model utilities, a flag that reads
# ``or``: the new import goes after the last import, and the old condition is
# bracketed so that ``and not`` cannot bind inside it.
NO_UTILS_IMPORT_BEFORE = """
import torch
from vllm.config import VllmConfig


class VendorVL(nn.Module):
    def __init__(self, vllm_config):
        self.use_deepstack = a or b
        with self._mark_tower_model(vllm_config, {"image"}):
            self.vision = VendorTower()
            if self.use_deepstack:
                self.deepstack_input_embeds = [torch.zeros(4, 4)]
"""

NO_UTILS_IMPORT_AFTER = """
import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.utils import StageMissingLayer


class VendorVL(nn.Module):
    def __init__(self, vllm_config):
        with self._mark_tower_model(vllm_config, {"image"}):
            self.vision = VendorTower()
        self.use_deepstack = (a or b) and not isinstance(self.vision, StageMissingLayer)
        if self.use_deepstack:
            self.deepstack_input_embeds = [torch.zeros(4, 4)]
"""

# CohereCompass (0.30.0 on): a later check of the pipeline split reads the
# flag; it keeps the old condition, which a skipped tower does not change.
LATER_CHECK_BEFORE = """
import torch


class TinyCompass(nn.Module):
    def __init__(self, vllm_config, config):
        self.use_deepstack = bool(config.deepstack_visual_indexes)
        with self._mark_tower_model(vllm_config, {"image"}):
            self.visual = Tower()
            if self.use_deepstack:
                self.deepstack_input_embeds = [torch.zeros(4, 4)]

        if not get_pp_group().is_first_rank and self.use_deepstack:
            assert self.language_model.start_layer >= 2
"""

LATER_CHECK_AFTER = """
import torch
from vllm.model_executor.models.utils import StageMissingLayer


class TinyCompass(nn.Module):
    def __init__(self, vllm_config, config):
        with self._mark_tower_model(vllm_config, {"image"}):
            self.visual = Tower()
        self.use_deepstack = bool(
            config.deepstack_visual_indexes
        ) and not isinstance(self.visual, StageMissingLayer)
        if self.use_deepstack:
            self.deepstack_input_embeds = [torch.zeros(4, 4)]

        if not get_pp_group().is_first_rank and bool(config.deepstack_visual_indexes):
            assert self.language_model.start_layer >= 2
"""

# vllm#49397 in 0.28.0 and later; also a vendor's version that sets the flag
# inside its own ``if``/``else`` around the tower.
UPSTREAM_FIXED = AFTER

NESTED_TOWER_FIXED = """
from vllm.model_executor.models.utils import StageMissingLayer


class VendorVL(nn.Module):
    def __init__(self, vllm_config):
        if vllm_config.text_only:
            self.visual = StageMissingLayer("vision_tower")
        else:
            with self._mark_tower_model(vllm_config, {"image", "video"}):
                self.visual = VendorTower()
        self.use_deepstack = not text_only and not isinstance(
            self.visual, StageMissingLayer
        )
        if self.use_deepstack:
            self.deepstack_input_embeds = [torch.zeros(4, 4)]
"""

# Before ``_mark_tower_model`` existed a limit of 0 skipped nothing.
NO_TOWER_CONTEXT = """
class OldVL(nn.Module):
    def __init__(self, vllm_config):
        self.use_deepstack = True
        self.visual = Tower()
        self.deepstack_input_embeds = [torch.zeros(4, 4)]
"""

# The buffers are built in the block without the flag: moved out they would
# be built for a skipped tower too (real zeros on the wrong device).
UNGUARDED_BUFFER = """
class VendorVL(nn.Module):
    def __init__(self, vllm_config):
        self.use_deepstack = True
        with self._mark_tower_model(vllm_config, {"image"}):
            self.visual = Tower()
            self.deepstack_input_embeds = [torch.zeros(4, 4)]
"""

# Built after the block, but a skipped tower does not turn deepstack off.
AFTER_BLOCK_WITHOUT_GUARD = """
class VendorVL(nn.Module):
    def __init__(self, vllm_config):
        with self._mark_tower_model(vllm_config, {"image"}):
            self.visual = Tower()
        self.use_deepstack = True
        if self.use_deepstack:
            self.deepstack_input_embeds = [torch.zeros(4, 4)]
"""


# The tower reads an attribute assigned before the block: moved after the
# block with the flag, it would not exist yet when the tower is built.
TOWER_READS_MOVED = BEFORE.replace(
    "self.visual = TinyVisionTower(config.vision_config)",
    "self.visual = TinyVisionTower(config.vision_config, self.deepstack_num_level)",
)


class Qwen3VLDeepstackWithoutVision(Patch):
    id = "vllm#49397"
    title = "Qwen3-VL deepstack: no buffers when the vision tower is skipped"
    upstream_url = "https://github.com/vllm-project/vllm/pull/49397"
    fixed_in = "0.28.0"
    symptom = section(__doc__, "Symptom")
    also_changes = section(__doc__, "Fix safety")
    paths = MODEL_PATHS
    markers = (BUFFERS.encode(),)
    parts = {"": "class whose __init__ builds the deepstack buffers"}
    examples = (
        Example("Qwen3-VL 0.20.2-0.27.1 shape", BEFORE, AFTER, path=MODEL_FILE),
        Example("Qwen3-Omni thinker shape", OMNI_BEFORE, OMNI_AFTER, path=MODEL_FILE),
        Example(
            "no utilities import, an `or` flag",
            NO_UTILS_IMPORT_BEFORE,
            NO_UTILS_IMPORT_AFTER,
        ),
        Example("a later check of the flag", LATER_CHECK_BEFORE, LATER_CHECK_AFTER),
        Example(
            "upstream 0.28.0",
            UPSTREAM_FIXED,
            state=PatchState.APPLIED,
            path=MODEL_FILE,
        ),
        Example(
            "tower block inside if/else", NESTED_TOWER_FIXED, state=PatchState.APPLIED
        ),
        Example(
            "no skippable tower", NO_TOWER_CONTEXT, state=PatchState.NOT_APPLICABLE
        ),
        Example("buffer without the flag", UNGUARDED_BUFFER, state=PatchState.DRIFTED),
        Example(
            "after the block, no guard",
            AFTER_BLOCK_WITHOUT_GUARD,
            state=PatchState.DRIFTED,
        ),
        Example(
            "tower reads an attribute the fix moves",
            TOWER_READS_MOVED,
            state=PatchState.DRIFTED,
            path=MODEL_FILE,
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        inits = buffer_building_inits(tree)
        found = [_recognise_init(qualname, init) for qualname, init in inits]
        if any(f.state in (PatchState.NEEDED, PatchState.APPLIED) for f in found):
            found.append(recognise_import(tree, path, [init for _, init in inits]))
        return found

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        for fix in needed:
            if fix.symbol == IMPORT_SYMBOL:
                module = add_import(module, fix)
        rewriters = {
            fix.symbol: (lambda init, fix=fix: rewrite_init(init, fix, module))
            for fix in needed
            if fix.symbol != IMPORT_SYMBOL
        }
        return rewrite_definitions(module, rewriters) if rewriters else module

    def prove(self, tree: Path) -> None:
        from .proof import prove_no_meta_buffers_without_vision

        prove_no_meta_buffers_without_vision(tree)


# --- recognise ------------------------------------------------------------


def _recognise_init(qualname: str, init: ast.FunctionDef) -> Finding:
    symbol = f"{qualname}.__init__"
    expected = (
        f"expected the buffers (self.{BUFFERS}) built in `if self.{USE}:` inside "
        f"`with self.{TOWER}(...)`, after `self.{USE} = ...` and the assignments "
        f"that follow it (needed), or built after the block with `self.{USE}` "
        f"false for a {GUARD} tower (applied)"
    )

    def result(state: PatchState, reason: str = "", **details: object) -> Finding:
        rewrites = () if state is PatchState.NOT_APPLICABLE else None
        return finding(state, symbol, init, reason, rewrites=rewrites, details=details)

    towers = [node for node in ast.walk(init) if is_tower_block(node)]
    if not towers:
        return result(
            PatchState.NOT_APPLICABLE,
            f"no `self.{TOWER}(...)` block: a limit of 0 skips no tower here",
        )
    holding = [tower for tower in towers if builds_buffers(tower)]
    if not holding:
        if flag_skips_missing_tower(init):
            return result(PatchState.APPLIED)
        return result(
            PatchState.DRIFTED,
            f"the buffers are built outside the tower block, but a skipped tower "
            f"does not set self.{USE} false; {expected}",
        )
    block = holding[0]
    if len(holding) > 1 or block not in init.body:
        return result(
            PatchState.DRIFTED, f"tower block nested in other code; {expected}"
        )
    block_index = init.body.index(block)
    buffer = [i for i, s in enumerate(block.body) if builds_buffers(s)]
    others = [s for i, s in enumerate(block.body) if i not in buffer]
    towers_built = [self_attribute_assigned(s) for s in others]
    if len(buffer) != 1 or not is_flag_guard(block.body[buffer[0]]):
        return result(
            PatchState.DRIFTED,
            f"the buffers in the tower block (line {block.lineno}) are not built "
            f"by one `if self.{USE}:`; {expected}",
        )
    if len(others) != 1 or towers_built[0] is None:
        return result(
            PatchState.DRIFTED,
            f"the tower block (line {block.lineno}) does more than build one "
            f"module `self.<tower> = ...`: which module {GUARD} replaces is "
            f"unclear; {expected}",
        )
    flag_index = flag_index_before(init, block_index)
    if flag_index is None:
        return result(
            PatchState.DRIFTED,
            f"`self.{USE} = ...` is not followed by assignments to self only up "
            f"to the tower block (line {block.lineno}); {expected}",
        )
    moved = {self_attribute_assigned(s) for s in init.body[flag_index:block_index]}
    read_early = attributes_read(moved, [*block.items, *others])
    if read_early:
        return result(
            PatchState.DRIFTED,
            f"the tower block (line {block.lineno}) reads "
            + ", ".join(f"self.{name}" for name in read_early)
            + ", which the fix assigns after the block; expected the tower built "
            f"without the flag and the assignments from `self.{USE} = ...` on",
        )
    return result(
        PatchState.NEEDED,
        later_checks=later_flag_checks(init, block_index),
        tower=towers_built[0],
        column=init.body[flag_index].col_offset,
        flag_index=flag_index,
        block_index=block_index,
        buffer_index=buffer[0],
    )


PATCH = Qwen3VLDeepstackWithoutVision()

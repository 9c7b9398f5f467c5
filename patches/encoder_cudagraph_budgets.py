"""vllm#38040: encoder (ViT) CUDA graphs: budget invariants, ceil sizing, pruning.

Symptom: with encoder CUDA graphs on (``cudagraph_mm_encoder``), Qwen3-VL can
crash while capturing: when ``max_batch_size`` exceeds the smallest token
budget, ``per_image_output = token_budget // max_batch_size`` is 0 and a
reshape of an empty tensor fails. Integer division also under-allocates the
per-item capture buffers when a budget is not a multiple of the batch size.
And with multimodal (EVS) pruning on, the graph path skips the embedding
post-processing eager mode does, so its embeddings have another format.

Upstream: https://github.com/vllm-project/vllm/pull/38040 (first in 0.22.0).
Four parts, each with its own status line:

- ``budget-invariant``: ``EncoderCudaGraphManager.__init__`` keeps
  ``max_batch_size <= min(token_budgets)`` on every configuration path: a
  user-given pair that breaks it raises ValueError naming both values, the
  automatic paths clamp ``max_batch_size`` (or raise the budgets to the
  user's batch size), and a non-positive or inverted model budget range
  raises ValueError;
- ``positive-budgets``: ``CompilationConfig.__post_init__`` rejects
  non-positive ``encoder_cudagraph_token_budgets``;
- ``ceil-per-item``: Qwen3-VL ``prepare_encoder_cudagraph_capture_inputs``
  sizes each item with ceil division;
- ``pruning-no-graphs``: Qwen3-VL ``get_encoder_cudagraph_config`` returns no
  modalities (no encoder CUDA graphs) when multimodal pruning is on.

Port the fix, not its neighbours: upstream 0.22.0 also moved
``max_frames_per_video`` into ``EncoderCudaGraphConfig`` and changed three of
these functions for it (``__init__`` reads ``self.config.max_frames_per_video``,
``get_encoder_cudagraph_config`` fills it in) and added an unrelated MLA
fusion warning to ``__post_init__``. None of that is ported: the rewritten
code uses only names the patched release has. Those three functions can
therefore never equal 0.22.0's; ``prepare_encoder_cudagraph_capture_inputs``
does on 0.20.x and 0.21.0.

0.19.x has the older shape (``user_max_images`` read from
``encoder_cudagraph_max_images_per_batch``, ``per_image_output``, a literal
``modalities=["image"]``). The same fix is rewritten into it with the
release's own names; its ValueError names that release's config field.

Fix safety: each part replaces only the statement(s) it recognises exactly
(layout and comments aside, with whatever local names the code uses), and
puts upstream's explanatory comments with them; comments inside the replaced
``if``/``else`` of ``__init__`` are replaced by upstream's. Qwen3-VL is found
by class name (a class whose name contains ``Qwen3VL``): upstream fixed only
that model, and later releases keep the floor division in copies of the
pattern (``Glm4vForConditionalGeneration`` from 0.25.0), which are listed as
not-applicable rather than rewritten.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import (
    FunctionNode,
    dotted,
    finding,
    is_self_attribute,
    iter_classes,
    parameter_names,
)

if TYPE_CHECKING:
    import libcst

MANAGER_CLASS = "EncoderCudaGraphManager"
CONFIG_CLASS = "CompilationConfig"
BUDGETS_FIELD = "encoder_cudagraph_token_budgets"
MODEL_MARK = "Qwen3VL"
PRUNING = "is_multimodal_pruning_enabled"

# --- the code each part recognises and writes, as templates ------------------
#
# Placeholders are the names the release's code uses: {budgets} and {items}
# (the locals holding the user's budgets and batch size), {field} (the config
# field behind {items}), {short} ({field} without its prefix), {model} and
# {config} (what the budget range is asked of).

CHOOSE_BUDGETS_BEFORE = """
if {budgets} and {items} > 0:
    self.token_budgets = sorted({budgets})
    self.max_batch_size = {items}
else:
    min_budget, max_budget = {model}.get_encoder_cudagraph_budget_range({config})
    self.token_budgets = (
        sorted({budgets})
        if {budgets}
        else self._generate_budgets(min_budget, max_budget)
    )
    self.max_batch_size = {items} if {items} > 0 else max_budget // min_budget
"""

CHOOSE_BUDGETS_AFTER = """\
# Invariant: max_batch_size <= min_token_budget.
# This ensures per_image_output = budget // max_batch_size >= 1
# for every captured budget, preventing reshape crashes on empty
# tensors during CUDA graph capture. Validated/enforced below for
# each configuration path.
if {budgets} and {items} > 0:
    # Fully user-specified: validate the invariant.
    self.token_budgets = sorted({budgets})
    self.max_batch_size = {items}
    min_tok = min(self.token_budgets)
    if self.max_batch_size > min_tok:
        raise ValueError(
            f"{field} "
            f"({{self.max_batch_size}}) must be <= smallest token "
            f"budget ({{min_tok}}). With budgets="
            f"{{self.token_budgets}}, per_image_output = "
            f"{{min_tok}} // {{self.max_batch_size}} = "
            f"{{min_tok // self.max_batch_size}}, which would cause "
            f"a capture failure. Either increase the smallest "
            f"budget or decrease {short}."
        )
else:
    # Auto-infer missing values from model.
    min_budget, max_budget = {model}.get_encoder_cudagraph_budget_range(
        {config}
    )
    if min_budget <= 0 or max_budget <= 0:
        raise ValueError(
            f"Invalid encoder cudagraph budget range: "
            f"min_budget={{min_budget}}, max_budget={{max_budget}}. "
            f"Both must be positive."
        )
    if min_budget > max_budget:
        raise ValueError(
            f"Invalid encoder cudagraph budget range: "
            f"min_budget={{min_budget}} > max_budget={{max_budget}}."
        )

    if {items} > 0:
        # User provided the batch size only; adjust auto-inferred
        # budgets so min(budgets) >= max_batch_size.
        self.max_batch_size = {items}
        effective_min = max(min_budget, {items})
        self.token_budgets = self._generate_budgets(effective_min, max_budget)
    elif {budgets}:
        # User provided budgets only; cap auto-inferred
        # max_batch_size to min(user_budgets).
        self.token_budgets = sorted({budgets})
        self.max_batch_size = min(
            max_budget // min_budget,
            min(self.token_budgets),
        )
    else:
        # Fully auto-inferred.
        self.token_budgets = self._generate_budgets(min_budget, max_budget)
        self.max_batch_size = min(
            max_budget // min_budget,
            min(self.token_budgets),
        )
"""

POSITIVE_BUDGETS = """\
if self.encoder_cudagraph_token_budgets and any(
    b <= 0 for b in self.encoder_cudagraph_token_budgets
):
    raise ValueError(
        f"All encoder_cudagraph_token_budgets must be positive, "
        f"got {self.encoder_cudagraph_token_budgets}"
    )
"""

CEIL_COMMENT = (
    "# Ceil so the buffer fits the worst case of one item using the full",
    "# budget. Floor under-allocates when budget is not a multiple of",
    "# max_batch_size.",
)

PRUNING_COMMENT = (
    "# When EVS pruning is enabled, embed_multimodal post-processes both",
    "# image and video embeddings (mrope positions are appended for image,",
    "# prune+append for video). The encoder CUDA graph path bypasses that",
    "# post-process, producing inconsistent embedding formats vs eager. So",
    "# disable CUDA graph for all modalities when pruning is on.",
)

# --- examples -----------------------------------------------------------------

MANAGER_BEFORE = """
class EncoderCudaGraphManager:
    def __init__(self, vllm_config, device, dtype, model):
        self.model = model
        cc = vllm_config.compilation_config
        user_budgets = cc.encoder_cudagraph_token_budgets
        user_max_vision_items = cc.encoder_cudagraph_max_vision_items_per_batch

        if user_budgets and user_max_vision_items > 0:
            # Fully user-specified
            self.token_budgets = sorted(user_budgets)
            self.max_batch_size = user_max_vision_items
        else:
            min_budget, max_budget = model.get_encoder_cudagraph_budget_range(
                vllm_config
            )
            self.token_budgets = (
                sorted(user_budgets)
                if user_budgets
                else self._generate_budgets(min_budget, max_budget)
            )
            self.max_batch_size = (
                user_max_vision_items
                if user_max_vision_items > 0
                else max_budget // min_budget
            )
        self.budget_graphs = {}
"""

MANAGER_AFTER = """
class EncoderCudaGraphManager:
    def __init__(self, vllm_config, device, dtype, model):
        self.model = model
        cc = vllm_config.compilation_config
        user_budgets = cc.encoder_cudagraph_token_budgets
        user_max_vision_items = cc.encoder_cudagraph_max_vision_items_per_batch

        # Invariant: max_batch_size <= min_token_budget.
        # This ensures per_image_output = budget // max_batch_size >= 1
        # for every captured budget, preventing reshape crashes on empty
        # tensors during CUDA graph capture. Validated/enforced below for
        # each configuration path.
        if user_budgets and user_max_vision_items > 0:
            # Fully user-specified: validate the invariant.
            self.token_budgets = sorted(user_budgets)
            self.max_batch_size = user_max_vision_items
            min_tok = min(self.token_budgets)
            if self.max_batch_size > min_tok:
                raise ValueError(
                    f"encoder_cudagraph_max_vision_items_per_batch "
                    f"({self.max_batch_size}) must be <= smallest token "
                    f"budget ({min_tok}). With budgets="
                    f"{self.token_budgets}, per_image_output = "
                    f"{min_tok} // {self.max_batch_size} = "
                    f"{min_tok // self.max_batch_size}, which would cause "
                    f"a capture failure. Either increase the smallest "
                    f"budget or decrease max_vision_items_per_batch."
                )
        else:
            # Auto-infer missing values from model.
            min_budget, max_budget = model.get_encoder_cudagraph_budget_range(
                vllm_config
            )
            if min_budget <= 0 or max_budget <= 0:
                raise ValueError(
                    f"Invalid encoder cudagraph budget range: "
                    f"min_budget={min_budget}, max_budget={max_budget}. "
                    f"Both must be positive."
                )
            if min_budget > max_budget:
                raise ValueError(
                    f"Invalid encoder cudagraph budget range: "
                    f"min_budget={min_budget} > max_budget={max_budget}."
                )

            if user_max_vision_items > 0:
                # User provided the batch size only; adjust auto-inferred
                # budgets so min(budgets) >= max_batch_size.
                self.max_batch_size = user_max_vision_items
                effective_min = max(min_budget, user_max_vision_items)
                self.token_budgets = self._generate_budgets(effective_min, max_budget)
            elif user_budgets:
                # User provided budgets only; cap auto-inferred
                # max_batch_size to min(user_budgets).
                self.token_budgets = sorted(user_budgets)
                self.max_batch_size = min(
                    max_budget // min_budget,
                    min(self.token_budgets),
                )
            else:
                # Fully auto-inferred.
                self.token_budgets = self._generate_budgets(min_budget, max_budget)
                self.max_batch_size = min(
                    max_budget // min_budget,
                    min(self.token_budgets),
                )
        self.budget_graphs = {}
"""

# The 0.19.x shape: the batch size is `images`, and so is the config field the
# error message must name.
OLD_MANAGER_BEFORE = """
class EncoderCudaGraphManager:
    def __init__(self, cfg, device, dtype, vit):
        budgets = cfg.compilation_config.encoder_cudagraph_token_budgets
        imgs = cfg.compilation_config.encoder_cudagraph_max_images_per_batch
        if budgets and imgs > 0:
            self.token_budgets = sorted(budgets)
            self.max_batch_size = imgs
        else:
            min_budget, max_budget = vit.get_encoder_cudagraph_budget_range(cfg)
            self.token_budgets = (sorted(budgets) if budgets
                                  else self._generate_budgets(min_budget, max_budget))
            self.max_batch_size = imgs if imgs > 0 else max_budget // min_budget
"""

OLD_MANAGER_AFTER = """
class EncoderCudaGraphManager:
    def __init__(self, cfg, device, dtype, vit):
        budgets = cfg.compilation_config.encoder_cudagraph_token_budgets
        imgs = cfg.compilation_config.encoder_cudagraph_max_images_per_batch
        # Invariant: max_batch_size <= min_token_budget.
        # This ensures per_image_output = budget // max_batch_size >= 1
        # for every captured budget, preventing reshape crashes on empty
        # tensors during CUDA graph capture. Validated/enforced below for
        # each configuration path.
        if budgets and imgs > 0:
            # Fully user-specified: validate the invariant.
            self.token_budgets = sorted(budgets)
            self.max_batch_size = imgs
            min_tok = min(self.token_budgets)
            if self.max_batch_size > min_tok:
                raise ValueError(
                    f"encoder_cudagraph_max_images_per_batch "
                    f"({self.max_batch_size}) must be <= smallest token "
                    f"budget ({min_tok}). With budgets="
                    f"{self.token_budgets}, per_image_output = "
                    f"{min_tok} // {self.max_batch_size} = "
                    f"{min_tok // self.max_batch_size}, which would cause "
                    f"a capture failure. Either increase the smallest "
                    f"budget or decrease max_images_per_batch."
                )
        else:
            # Auto-infer missing values from model.
            min_budget, max_budget = vit.get_encoder_cudagraph_budget_range(
                cfg
            )
            if min_budget <= 0 or max_budget <= 0:
                raise ValueError(
                    f"Invalid encoder cudagraph budget range: "
                    f"min_budget={min_budget}, max_budget={max_budget}. "
                    f"Both must be positive."
                )
            if min_budget > max_budget:
                raise ValueError(
                    f"Invalid encoder cudagraph budget range: "
                    f"min_budget={min_budget} > max_budget={max_budget}."
                )

            if imgs > 0:
                # User provided the batch size only; adjust auto-inferred
                # budgets so min(budgets) >= max_batch_size.
                self.max_batch_size = imgs
                effective_min = max(min_budget, imgs)
                self.token_budgets = self._generate_budgets(effective_min, max_budget)
            elif budgets:
                # User provided budgets only; cap auto-inferred
                # max_batch_size to min(user_budgets).
                self.token_budgets = sorted(budgets)
                self.max_batch_size = min(
                    max_budget // min_budget,
                    min(self.token_budgets),
                )
            else:
                # Fully auto-inferred.
                self.token_budgets = self._generate_budgets(min_budget, max_budget)
                self.max_batch_size = min(
                    max_budget // min_budget,
                    min(self.token_budgets),
                )
"""

# A vendor clamps the batch size its own way: neither shape, so it is left alone.
MANAGER_OWN_CLAMP = """
class EncoderCudaGraphManager:
    def __init__(self, vllm_config, device, dtype, model):
        cc = vllm_config.compilation_config
        budgets = cc.encoder_cudagraph_token_budgets
        items = cc.encoder_cudagraph_max_vision_items_per_batch
        if budgets and items > 0:
            self.token_budgets = sorted(budgets)
            self.max_batch_size = min(items, self.token_budgets[0])
        else:
            self.token_budgets = [64]
            self.max_batch_size = 1
"""

CONFIG_BEFORE = """
@config
class CompilationConfig:
    cudagraph_mm_encoder: bool = False
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)
    encoder_cudagraph_max_vision_items_per_batch: int = 0

    def __post_init__(self) -> None:
        # Validate encoder CUDA graph configuration
        if (
            self.cudagraph_mm_encoder
            and self.encoder_cudagraph_max_vision_items_per_batch < 0
        ):
            raise ValueError("must be non-negative")

        if self.backend == "":
            self.backend = current_platform.get_compile_backend()
"""

CONFIG_AFTER = """
@config
class CompilationConfig:
    cudagraph_mm_encoder: bool = False
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)
    encoder_cudagraph_max_vision_items_per_batch: int = 0

    def __post_init__(self) -> None:
        # Validate encoder CUDA graph configuration
        if (
            self.cudagraph_mm_encoder
            and self.encoder_cudagraph_max_vision_items_per_batch < 0
        ):
            raise ValueError("must be non-negative")

        if self.encoder_cudagraph_token_budgets and any(
            b <= 0 for b in self.encoder_cudagraph_token_budgets
        ):
            raise ValueError(
                f"All encoder_cudagraph_token_budgets must be positive, "
                f"got {self.encoder_cudagraph_token_budgets}"
            )

        if self.backend == "":
            self.backend = current_platform.get_compile_backend()
"""

# The budgets are validated already, another way: leave it, say so.
CONFIG_OWN_CHECK = """
class CompilationConfig:
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if min(self.encoder_cudagraph_token_budgets, default=1) < 1:
            raise ValueError("budgets must be positive")
"""

QWEN_BEFORE = """
class Qwen3VLForConditionalGeneration(nn.Module):
    def __init__(self, vllm_config):
        self.is_multimodal_pruning_enabled = vllm_config.pruning

    def get_encoder_cudagraph_config(self):
        modalities = ["image"]
        # Video graphs only without EVS pruning.
        if not self.is_multimodal_pruning_enabled:
            modalities.append("video")

        return EncoderCudaGraphConfig(modalities=modalities, out_hidden_size=8)

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget, max_batch_size, max_frames_per_batch, device, dtype
    ):
        merge = self.visual.spatial_merge_size
        per_mm_item_output = token_budget // max_batch_size
        return [[1, merge, per_mm_item_output * merge]] * max_batch_size
"""

QWEN_AFTER = """
class Qwen3VLForConditionalGeneration(nn.Module):
    def __init__(self, vllm_config):
        self.is_multimodal_pruning_enabled = vllm_config.pruning

    def get_encoder_cudagraph_config(self):
        # When EVS pruning is enabled, embed_multimodal post-processes both
        # image and video embeddings (mrope positions are appended for image,
        # prune+append for video). The encoder CUDA graph path bypasses that
        # post-process, producing inconsistent embedding formats vs eager. So
        # disable CUDA graph for all modalities when pruning is on.
        modalities = [] if self.is_multimodal_pruning_enabled else ["image", "video"]

        return EncoderCudaGraphConfig(modalities=modalities, out_hidden_size=8)

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget, max_batch_size, max_frames_per_batch, device, dtype
    ):
        merge = self.visual.spatial_merge_size
        # Ceil so the buffer fits the worst case of one item using the full
        # budget. Floor under-allocates when budget is not a multiple of
        # max_batch_size.
        per_mm_item_output = (token_budget + max_batch_size - 1) // max_batch_size
        return [[1, merge, per_mm_item_output * merge]] * max_batch_size
"""

# The 0.19.x shape: images only, a literal list, `per_image_output`.
OLD_QWEN_BEFORE = """
class Qwen3VLForConditionalGeneration(nn.Module):
    def __init__(self, mm):
        self.is_multimodal_pruning_enabled = mm.is_multimodal_pruning_enabled()

    def get_encoder_cudagraph_config(self):
        return EncoderCudaGraphConfig(
            modalities=["image"],
            out_hidden_size=self.visual.out_hidden_size,
        )

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget, max_batch_size, device, dtype
    ):
        per_image_output = token_budget // max_batch_size
        return per_image_output
"""

OLD_QWEN_AFTER = """
class Qwen3VLForConditionalGeneration(nn.Module):
    def __init__(self, mm):
        self.is_multimodal_pruning_enabled = mm.is_multimodal_pruning_enabled()

    def get_encoder_cudagraph_config(self):
        return EncoderCudaGraphConfig(
            modalities=[] if self.is_multimodal_pruning_enabled else ["image"],
            out_hidden_size=self.visual.out_hidden_size,
        )

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget, max_batch_size, device, dtype
    ):
        # Ceil so the buffer fits the worst case of one item using the full
        # budget. Floor under-allocates when budget is not a multiple of
        # max_batch_size.
        per_image_output = (token_budget + max_batch_size - 1) // max_batch_size
        return per_image_output
"""

# No pruning flag in the class: disabling graphs under pruning has nothing to
# test, so the literal list is left alone and reported.
QWEN_NO_PRUNING_FLAG = """
class Qwen3VLForConditionalGeneration(nn.Module):
    def get_encoder_cudagraph_config(self):
        return EncoderCudaGraphConfig(modalities=["image"], out_hidden_size=8)
"""

# Another model with the same floor division: upstream did not fix it.
OTHER_MODEL_FLOOR = """
class Glm4vForConditionalGeneration(nn.Module):
    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget, max_batch_size, max_frames_per_batch, device, dtype
    ):
        per_mm_item_output = token_budget // max_batch_size
        return per_mm_item_output
"""


class EncoderCudaGraphBudgets(Patch):
    id = "vllm#38040"
    title = (
        "Encoder CUDA graphs: budget invariants, ceil sizing, no graphs under pruning"
    )
    upstream_url = "https://github.com/vllm-project/vllm/pull/38040"
    fixed_in = "0.22.0"
    symptom = (
        "Qwen3-VL encoder CUDA graph capture crashes (reshape of an empty "
        "tensor) when max_batch_size exceeds the smallest token budget; "
        "per-item buffers under-allocated; under multimodal pruning the graph "
        "path returns embeddings in another format than eager"
    )
    also_changes = (
        "EncoderCudaGraphManager.__init__'s budget/batch-size selection is "
        "replaced as a whole (upstream's comments replace the old ones in it); "
        "one validation is added to CompilationConfig.__post_init__; one "
        "assignment changes in each Qwen3-VL method. 0.22.0's max_frames_per_video "
        "refactor is not ported."
    )
    paths = (
        "vllm/v1/worker/**/*.py",
        "vllm/config/*.py",
        "vllm/model_executor/models/**/*.py",
        "vllm/models/**/*.py",
    )
    # Narrow on purpose: "encoder_cudagraph" alone also matches the 7000-line
    # GPU model runner, which no part targets.
    markers = (
        b"class EncoderCudaGraphManager",
        b"encoder_cudagraph_token_budgets",
        b"def prepare_encoder_cudagraph_capture_inputs",
        b"def get_encoder_cudagraph_config",
    )
    parts = {
        "budget-invariant": "EncoderCudaGraphManager.__init__ choosing token budgets",
        "positive-budgets": (
            "CompilationConfig.__post_init__ "
            "(with an encoder_cudagraph_token_budgets field)"
        ),
        "ceil-per-item": "Qwen3-VL prepare_encoder_cudagraph_capture_inputs",
        "pruning-no-graphs": "Qwen3-VL get_encoder_cudagraph_config",
    }
    examples = (
        Example("manager __init__, 0.20.x shape", MANAGER_BEFORE, MANAGER_AFTER),
        Example(
            "manager __init__, 0.19.x shape with renamed locals",
            OLD_MANAGER_BEFORE,
            OLD_MANAGER_AFTER,
        ),
        Example(
            "manager __init__ already fixed", MANAGER_AFTER, state=PatchState.APPLIED
        ),
        Example(
            "manager clamps its own way", MANAGER_OWN_CLAMP, state=PatchState.DRIFTED
        ),
        Example("CompilationConfig validation", CONFIG_BEFORE, CONFIG_AFTER),
        Example(
            "CompilationConfig already fixed", CONFIG_AFTER, state=PatchState.APPLIED
        ),
        Example(
            "CompilationConfig validates budgets another way",
            CONFIG_OWN_CHECK,
            state=PatchState.DRIFTED,
        ),
        Example("Qwen3-VL methods, 0.20.x shape", QWEN_BEFORE, QWEN_AFTER),
        Example("Qwen3-VL methods, 0.19.x shape", OLD_QWEN_BEFORE, OLD_QWEN_AFTER),
        Example("Qwen3-VL methods already fixed", QWEN_AFTER, state=PatchState.APPLIED),
        Example(
            "Qwen3-VL without a pruning flag",
            QWEN_NO_PRUNING_FLAG,
            state=PatchState.DRIFTED,
        ),
        Example(
            "floor division in a model upstream did not fix",
            OTHER_MODEL_FLOOR,
            state=PatchState.NOT_APPLICABLE,
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        findings: list[Finding] = []
        for qualname, cls in iter_classes(tree):
            methods = {
                node.name: node
                for node in cls.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            if cls.name == MANAGER_CLASS and "__init__" in methods:
                findings.append(
                    _recognise_manager(f"{qualname}.__init__", methods["__init__"])
                )
            if (
                cls.name == CONFIG_CLASS
                and "__post_init__" in methods
                and _declares_field(cls, BUDGETS_FIELD)
            ):
                symbol = f"{qualname}.__post_init__"
                findings.append(_recognise_config(symbol, methods["__post_init__"]))
            capture = methods.get("prepare_encoder_cudagraph_capture_inputs")
            if capture is not None and _has_body(capture):
                symbol = f"{qualname}.{capture.name}"
                findings.extend(
                    _recognise_capture(symbol, capture, MODEL_MARK in cls.name)
                )
            config = methods.get("get_encoder_cudagraph_config")
            if config is not None and _has_body(config) and MODEL_MARK in cls.name:
                symbol = f"{qualname}.{config.name}"
                findings.append(
                    _recognise_modalities(symbol, config, _assigns_pruning(cls))
                )
        return findings

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        from deepstack_patch.engine.syntax import rewrite_definitions

        source = ast.parse(module.code)
        functions = {
            f"{qualname}.{node.name}": node
            for qualname, cls in iter_classes(source)
            for node in cls.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        rewriters = {}
        for found in needed:
            function = functions[found.symbol]
            if found.part == "budget-invariant":
                rewriters[found.symbol] = _BudgetRewriter(function).rewrite
            elif found.part == "positive-budgets":
                rewriters[found.symbol] = _PositiveBudgetsRewriter(function).rewrite
            elif found.part == "ceil-per-item":
                rewriters[found.symbol] = _CeilRewriter(function).rewrite
            elif found.part == "pruning-no-graphs":
                rewriters[found.symbol] = _rewrite_modalities
        return rewrite_definitions(module, rewriters)

    def prove(self, tree: Path) -> None:
        _prove(tree, self)


# --- recognition ------------------------------------------------------------


def _finding(
    state: PatchState,
    symbol: str,
    node: ast.AST,
    part: str,
    reason: str = "",
    *,
    upstream_identical: bool = True,
) -> Finding:
    """A finding over the whole function.

    ``rewrites`` names the function only where the fixed function can equal
    upstream's: where 0.22.0's also carries the max_frames_per_video refactor
    (or another neighbour), nothing is named.
    """
    return finding(
        state,
        symbol,
        node,
        reason,
        part=part,
        rewrites=None if upstream_identical else (),
    )


def _dump_code(code: str) -> str:
    return ast.dump(ast.parse(code))


def _has_body(function: FunctionNode) -> bool:
    """Not an interface stub (docstring, ``...``, ``raise NotImplementedError``)."""
    return any(
        not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        and not isinstance(s, ast.Raise | ast.Pass)
        for s in function.body
    )


def _declares_field(cls: ast.ClassDef, name: str) -> bool:
    return any(
        isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == name
        for node in cls.body
    )


def _assigns_pruning(cls: ast.ClassDef) -> bool:
    """The class sets ``self.is_multimodal_pruning_enabled`` somewhere."""
    for node in ast.walk(cls):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(is_self_attribute(t, PRUNING) for t in targets):
            return True
    return False


def _budget_names(statement: ast.stmt) -> tuple[str, str] | None:
    """``(budgets, items)`` for ``if <budgets> and <items> > 0:``."""
    if not isinstance(statement, ast.If):
        return None
    test = statement.test
    if not (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.And)
        and len(test.values) == 2
        and isinstance(test.values[0], ast.Name)
    ):
        return None
    compare = test.values[1]
    if not (
        isinstance(compare, ast.Compare)
        and isinstance(compare.left, ast.Name)
        and len(compare.ops) == 1
        and isinstance(compare.ops[0], ast.Gt)
        and isinstance(compare.comparators[0], ast.Constant)
        and compare.comparators[0].value == 0
    ):
        return None
    return test.values[0].id, compare.left.id


def _range_call(statement: ast.stmt) -> tuple[str, str] | None:
    """``(model, config)`` of ``model.get_encoder_cudagraph_budget_range(config)``."""
    for node in ast.walk(statement):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get_encoder_cudagraph_budget_range"
            and len(node.args) == 1
            and not node.keywords
        ):
            model = dotted(node.func.value)
            config = dotted(node.args[0])
            if model and config:
                return model, config
    return None


def _config_field(function: FunctionNode, local: str) -> str | None:
    """The attribute read into ``local`` (``local = cc.<field>``)."""
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == local
            and isinstance(node.value, ast.Attribute)
        ):
            return node.value.attr
    return None


def _budget_templates(
    function: FunctionNode, statement: ast.stmt
) -> dict[str, str] | None:
    names = _budget_names(statement)
    called = _range_call(statement)
    if names is None or called is None:
        return None
    budgets, items = names
    field = _config_field(function, items)
    if field is None:
        return None
    model, config = called
    return {
        "budgets": budgets,
        "items": items,
        "field": field,
        "short": field.removeprefix("encoder_cudagraph_"),
        "model": model,
        "config": config,
    }


def _budget_statement(
    function: FunctionNode,
) -> tuple[int, dict[str, str], PatchState] | None:
    """The ``if`` choosing budgets and batch size, its names, and its state."""
    for index, statement in enumerate(function.body):
        names = _budget_templates(function, statement)
        if names is None:
            continue
        code = ast.dump(statement)
        if code == ast.dump(ast.parse(CHOOSE_BUDGETS_BEFORE.format(**names)).body[0]):
            return index, names, PatchState.NEEDED
        if code == ast.dump(ast.parse(CHOOSE_BUDGETS_AFTER.format(**names)).body[0]):
            return index, names, PatchState.APPLIED
    return None


def _recognise_manager(symbol: str, function: FunctionNode) -> Finding:
    part = "budget-invariant"
    found = _budget_statement(function)
    if found is None:
        return _finding(
            PatchState.DRIFTED,
            symbol,
            function,
            part,
            "expected `if <budgets> and <max_items> > 0:` choosing self.token_budgets "
            "and self.max_batch_size as upstream 0.19-0.21 (needed) or 0.22 "
            "(applied) do, with <max_items> read from a compilation config field",
            upstream_identical=False,
        )
    return _finding(found[2], symbol, function, part, upstream_identical=False)


def _mentions_budgets(node: ast.AST) -> bool:
    return any(is_self_attribute(n, BUDGETS_FIELD) for n in ast.walk(node))


def _encoder_validation_index(function: FunctionNode) -> int | None:
    """The last top-level statement of ``function`` validating encoder graph fields."""
    last = None
    for index, statement in enumerate(function.body):
        if isinstance(statement, ast.If) and any(
            isinstance(n, ast.Attribute)
            and n.attr.startswith("encoder_cudagraph_")
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
            for n in ast.walk(statement.test)
        ):
            last = index
    return last


def _recognise_config(symbol: str, function: FunctionNode) -> Finding:
    part = "positive-budgets"
    wanted = ast.dump(ast.parse(POSITIVE_BUDGETS).body[0])
    if any(ast.dump(s) == wanted for s in function.body):
        return _finding(
            PatchState.APPLIED, symbol, function, part, upstream_identical=False
        )
    if any(_mentions_budgets(s) for s in function.body):
        return _finding(
            PatchState.DRIFTED,
            symbol,
            function,
            part,
            f"__post_init__ already reads self.{BUDGETS_FIELD}, but not as upstream's "
            "`if ... any(b <= 0 for b in ...): raise ValueError(...)`",
            upstream_identical=False,
        )
    if _encoder_validation_index(function) is None:
        return _finding(
            PatchState.DRIFTED,
            symbol,
            function,
            part,
            "no `if self.encoder_cudagraph_...` validation in __post_init__ to put "
            "the budget check after",
            upstream_identical=False,
        )
    return _finding(PatchState.NEEDED, symbol, function, part, upstream_identical=False)


def _per_item_assignment(function: FunctionNode) -> tuple[int, str, str, bool] | None:
    """``(index, target, kind, is_ceil)`` of the per-item output assignment."""
    params = parameter_names(function)
    if len(params) < 3:
        return None
    budget, batch = params[1], params[2]
    for index, statement in enumerate(function.body):
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            continue
        target = statement.targets[0].id
        value = ast.dump(statement.value)
        if value == ast.dump(ast.parse(f"{budget} // {batch}", mode="eval").body):
            return index, target, "floor", False
        ceil = f"({budget} + {batch} - 1) // {batch}"
        if value == ast.dump(ast.parse(ceil, mode="eval").body):
            return index, target, "ceil", True
    return None


def _recognise_capture(
    symbol: str, function: FunctionNode, is_target: bool
) -> list[Finding]:
    part = "ceil-per-item"
    found = _per_item_assignment(function)
    if not is_target:
        if found is not None and not found[3]:
            # Report the copy of the pattern, but do not touch it.
            return [
                _finding(
                    PatchState.NOT_APPLICABLE,
                    symbol,
                    function,
                    part,
                    f"{found[1]} = token_budget // max_batch_size here too, but "
                    "vllm#38040 fixed only Qwen3-VL; this model is left as upstream "
                    "has it",
                )
            ]
        return []
    if found is None:
        return [
            _finding(
                PatchState.DRIFTED,
                symbol,
                function,
                part,
                "expected `<per_item> = token_budget // max_batch_size` (needed) or "
                "`(token_budget + max_batch_size - 1) // max_batch_size` (applied) "
                "among the function's top-level statements",
            )
        ]
    state = PatchState.APPLIED if found[3] else PatchState.NEEDED
    return [_finding(state, symbol, function, part)]


def _modalities_state(function: FunctionNode) -> tuple[PatchState, str]:
    fixed_value = f"[] if self.{PRUNING} else "
    for statement in function.body:
        # 0.20-0.21: `modalities = ["image"]` then `if not pruning: append("video")`.
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            value = statement.value
            if _is_pruning_ifexp(value):
                return PatchState.APPLIED, ""
    body = function.body
    for index, statement in enumerate(body[:-1]):
        if _is_image_list_assignment(statement) and _is_append_video_unless_pruning(
            body[index + 1], statement.targets[0].id
        ):
            return PatchState.NEEDED, "list-then-append"
    keywords = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.keyword) and node.arg == "modalities"
    ]
    if len(keywords) == 1:
        value = keywords[0].value
        if _is_pruning_ifexp(value):
            return PatchState.APPLIED, ""
        if isinstance(value, ast.List) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
        ):
            if any(
                isinstance(n, ast.Attribute) and n.attr == PRUNING
                for n in ast.walk(function)
            ):
                return PatchState.DRIFTED, (
                    "a literal modalities=[...] in a function that already reads "
                    f"self.{PRUNING}"
                )
            return PatchState.NEEDED, "literal-keyword"
    return PatchState.DRIFTED, (
        f"expected `modalities = [...]` then `if not self.{PRUNING}: "
        "modalities.append(...)`, or a literal modalities=[...] keyword (needed), "
        f"or `{fixed_value}[...]` (applied)"
    )


def _is_pruning_ifexp(value: ast.AST) -> bool:
    return (
        isinstance(value, ast.IfExp)
        and is_self_attribute(value.test, PRUNING)
        and isinstance(value.body, ast.List)
        and not value.body.elts
        and isinstance(value.orelse, ast.List)
    )


def _is_image_list_assignment(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and isinstance(statement.value, ast.List)
        and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str)
            for e in statement.value.elts
        )
    )


def _is_append_video_unless_pruning(statement: ast.stmt, name: str) -> bool:
    if not (
        isinstance(statement, ast.If)
        and not statement.orelse
        and isinstance(statement.test, ast.UnaryOp)
        and isinstance(statement.test.op, ast.Not)
        and is_self_attribute(statement.test.operand, PRUNING)
        and len(statement.body) == 1
    ):
        return False
    inner = statement.body[0]
    return (
        isinstance(inner, ast.Expr)
        and isinstance(inner.value, ast.Call)
        and dotted(inner.value.func) == f"{name}.append"
        and len(inner.value.args) == 1
        and isinstance(inner.value.args[0], ast.Constant)
        and isinstance(inner.value.args[0].value, str)
    )


def _recognise_modalities(
    symbol: str, function: FunctionNode, has_flag: bool
) -> Finding:
    part = "pruning-no-graphs"
    state, detail = _modalities_state(function)
    if state is PatchState.NEEDED and not has_flag:
        return _finding(
            PatchState.DRIFTED,
            symbol,
            function,
            part,
            f"the class never sets self.{PRUNING}, so graphs cannot be made "
            "conditional on it",
            upstream_identical=False,
        )
    reason = detail if state is PatchState.DRIFTED else ""
    return _finding(state, symbol, function, part, reason, upstream_identical=False)


# --- rewriting --------------------------------------------------------------


def _comment_lines(texts: Sequence[str]) -> list[libcst.EmptyLine]:
    import libcst

    return [libcst.EmptyLine(comment=libcst.Comment(text)) for text in texts]


def _parse_block(code: str) -> list[libcst.BaseStatement]:
    import libcst

    return list(libcst.parse_module(code).body)


class _BudgetRewriter:
    """Replace the budget-choosing ``if`` with upstream's fixed one."""

    def __init__(self, function: FunctionNode) -> None:
        found = _budget_statement(function)
        assert found is not None and found[2] is PatchState.NEEDED
        self.index, self.names, _ = found

    def rewrite(self, function: libcst.FunctionDef) -> libcst.FunctionDef:
        import libcst

        module = libcst.parse_module(CHOOSE_BUDGETS_AFTER.format(**self.names))
        replacement = module.body[0]
        # The module header holds the template's leading comment block.
        body = list(function.body.body)
        old = body[self.index]
        comments = [line for line in module.header]
        replacement = replacement.with_changes(
            leading_lines=[*old.leading_lines, *comments, *replacement.leading_lines]
        )
        body[self.index] = replacement
        return function.with_changes(body=function.body.with_changes(body=body))


class _PositiveBudgetsRewriter:
    """Add the positive-budgets check after the last encoder validation."""

    def __init__(self, function: FunctionNode) -> None:
        index = _encoder_validation_index(function)
        assert index is not None
        self.index = index

    def rewrite(self, function: libcst.FunctionDef) -> libcst.FunctionDef:
        import libcst

        check = _parse_block(POSITIVE_BUDGETS)[0]
        check = check.with_changes(leading_lines=[libcst.EmptyLine(indent=False)])
        body = list(function.body.body)
        body.insert(self.index + 1, check)
        return function.with_changes(body=function.body.with_changes(body=body))


class _CeilRewriter:
    """Replace ``x = budget // batch`` by the ceil division."""

    def __init__(self, function: FunctionNode) -> None:
        found = _per_item_assignment(function)
        assert found is not None
        self.index, self.target, _, _ = found
        params = parameter_names(function)
        self.budget, self.batch = params[1], params[2]

    def rewrite(self, function: libcst.FunctionDef) -> libcst.FunctionDef:
        import libcst

        body = list(function.body.body)
        old = body[self.index]
        assert isinstance(old, libcst.SimpleStatementLine)
        value = libcst.parse_expression(
            f"({self.budget} + {self.batch} - 1) // {self.batch}"
        )
        assign = old.body[0]
        assert isinstance(assign, libcst.Assign)
        new = old.with_changes(
            body=[assign.with_changes(value=value), *old.body[1:]],
            leading_lines=[*old.leading_lines, *_comment_lines(CEIL_COMMENT)],
        )
        body[self.index] = new
        return function.with_changes(body=function.body.with_changes(body=body))


def _rewrite_modalities(function: libcst.FunctionDef) -> libcst.FunctionDef:
    import libcst

    # Plain `match` patterns, not libcst.matchers: importing that module
    # costs longer than the whole rewrite.
    body = list(function.body.body)
    for index, statement in enumerate(body[:-1]):
        match statement, body[index + 1]:
            case (
                libcst.SimpleStatementLine(
                    body=[
                        libcst.Assign(
                            targets=[libcst.AssignTarget(target=libcst.Name())],
                            value=libcst.List(),
                        ) as assign
                    ]
                ),
                libcst.If(test=libcst.UnaryOperation(operator=libcst.Not())),
            ):
                kept = libcst.parse_expression(
                    "[" + ", ".join(_strings(assign.value, body[index + 1])) + "]"
                )
                value = libcst.IfExp(
                    test=libcst.parse_expression(f"self.{PRUNING}"),
                    body=libcst.List([]),
                    orelse=kept,
                )
                new = statement.with_changes(
                    body=[assign.with_changes(value=value)],
                    leading_lines=[
                        *statement.leading_lines,
                        *_comment_lines(PRUNING_COMMENT),
                    ],
                )
                body[index : index + 2] = [new]
                return function.with_changes(body=function.body.with_changes(body=body))

    class LiteralKeyword(libcst.CSTTransformer):
        def leave_Arg(self, original: libcst.Arg, updated: libcst.Arg) -> libcst.Arg:
            if updated.keyword is None or updated.keyword.value != "modalities":
                return updated
            return updated.with_changes(
                value=libcst.IfExp(
                    test=libcst.parse_expression(f"self.{PRUNING}"),
                    body=libcst.List([]),
                    orelse=updated.value,
                )
            )

    return function.visit(LiteralKeyword())


def _strings(
    listed: libcst.BaseExpression, appending: libcst.BaseStatement
) -> list[str]:
    """The modalities of ``x = [...]`` plus the one ``x.append(...)`` adds."""
    import libcst

    names = [
        element.value.value
        for element in (listed.elements if isinstance(listed, libcst.List) else [])
        if isinstance(element.value, libcst.SimpleString)
    ]

    class Appends(libcst.CSTVisitor):
        def visit_Call(self, call: libcst.Call) -> None:
            match call:
                case libcst.Call(
                    func=libcst.Attribute(attr=libcst.Name(value="append")),
                    args=[libcst.Arg(value=libcst.SimpleString() as value), *_],
                ):
                    names.append(value.value)

    appending.visit(Appends())
    return names


# --- proof ------------------------------------------------------------------


def _prove(tree: Path, patch: EncoderCudaGraphBudgets) -> None:
    """Run the tree's own code for each part on the CPU; collect what is wrong.

    The manager is built with small stand-in configs and model (it only asks
    them for fields and the budget range). The Qwen3-VL methods are taken from
    the tree's model file and run on a stand-in ``self``: importing the model
    module needs torchvision and more, which a CPU proof has no use for.
    """
    import importlib
    import sys

    # 0.19.x's encoder graph modules import each other as
    # vllm.v1.worker.gpu.mm.*, which that release does not ship (there they
    # live in vllm/v1/worker/): map the name so the code can run at all.
    for name in ("encoder_cudagraph_defs", "encoder_cudagraph"):
        try:
            importlib.import_module(f"vllm.v1.worker.gpu.mm.{name}")
        except ModuleNotFoundError:
            shipped = f"vllm.v1.worker.{name}"
            if importlib.util.find_spec(shipped) is None:
                continue
            sys.modules[f"vllm.v1.worker.gpu.mm.{name}"] = importlib.import_module(
                shipped
            )

    problems: list[str] = []
    problems += _prove_manager()
    problems += _prove_config()
    problems += _prove_qwen3_vl(tree, patch)
    assert not problems, "vllm#38040 not in effect: " + "; ".join(problems)


def _prove_manager() -> list[str]:
    from types import SimpleNamespace

    import torch
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager

    class Model:
        def __init__(self, low: int, high: int) -> None:
            self.range = (low, high)

        def get_encoder_cudagraph_config(self) -> object:
            return SimpleNamespace(modalities=["image"], max_frames_per_video=1)

        def get_encoder_cudagraph_budget_range(self, vllm_config: object) -> tuple:
            return self.range

        def get_max_frames_per_video(self) -> int:
            return 1

    class EndlessBudgets(Exception):
        """Budgets generated from a non-positive minimum: the loop never ends."""

    generate = EncoderCudaGraphManager._generate_budgets

    def guarded_generate(min_budget: int, max_budget: int) -> list[int]:
        # Doubling from 0 never passes max_budget: stop where the buggy code
        # would hang instead of hanging the proof.
        if min_budget <= 0 <= max_budget:
            raise EndlessBudgets(f"_generate_budgets({min_budget}, {max_budget})")
        return generate(min_budget, max_budget)

    def manager(budgets: list[int], items: int, low: int = 64, high: int = 16384):
        compilation = SimpleNamespace(
            encoder_cudagraph_token_budgets=budgets,
            # 0.19.x reads the first name, 0.20 and later the second.
            encoder_cudagraph_max_images_per_batch=items,
            encoder_cudagraph_max_vision_items_per_batch=items,
            encoder_cudagraph_max_frames_per_batch=None,
        )
        multimodal = SimpleNamespace(
            mm_encoder_tp_mode="replicate",
            # No video: keeps the frame budget off the path under test.
            get_limit_per_prompt=lambda modality: 0,
        )
        vllm_config = SimpleNamespace(
            compilation_config=compilation,
            model_config=SimpleNamespace(multimodal_config=multimodal),
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        EncoderCudaGraphManager._generate_budgets = staticmethod(guarded_generate)
        try:
            return EncoderCudaGraphManager(
                vllm_config=vllm_config,
                device=torch.device("cpu"),
                dtype=torch.float32,
                model=Model(low, high),
            )
        finally:
            EncoderCudaGraphManager._generate_budgets = staticmethod(generate)

    problems = []
    for label, kwargs in (
        ("automatic budgets and batch size", {"budgets": [], "items": 0}),
        ("user budgets [32, 64] only", {"budgets": [32, 64], "items": 0}),
        ("user batch size 128 only", {"budgets": [], "items": 128}),
    ):
        try:
            built = manager(**kwargs)
        except Exception as exc:  # the check is what the manager does
            problems.append(f"{label}: EncoderCudaGraphManager raised {exc!r}")
            continue
        if built.max_batch_size > min(built.token_budgets):
            problems.append(
                f"{label}: max_batch_size {built.max_batch_size} > smallest "
                f"token budget {min(built.token_budgets)}"
            )
    for label, kwargs, words in (
        (
            "user budgets [64] with batch size 256",
            {"budgets": [64], "items": 256},
            ("256", "64"),
        ),
        (
            "model budget range (0, 128)",
            {"budgets": [], "items": 0, "low": 0, "high": 128},
            (),
        ),
        (
            "model budget range (200, 100)",
            {"budgets": [], "items": 0, "low": 200, "high": 100},
            (),
        ),
    ):
        try:
            manager(**kwargs)
        except ValueError as exc:
            missing = [w for w in words if w not in str(exc)]
            if missing:
                problems.append(
                    f"{label}: the ValueError does not name {missing}: {exc}"
                )
        except EndlessBudgets as exc:
            problems.append(f"{label}: accepted, and {exc} would never return")
        except Exception as exc:
            problems.append(f"{label}: raised {exc!r}, not ValueError")
        else:
            problems.append(f"{label}: accepted without ValueError")
    return problems


def _prove_config() -> list[str]:
    from vllm.config.compilation import CompilationConfig

    problems = []
    for budgets in ([0, 128], [-1, 64]):
        try:
            CompilationConfig(encoder_cudagraph_token_budgets=budgets)
        except ValueError:
            continue
        problems.append(
            f"CompilationConfig accepted encoder_cudagraph_token_budgets={budgets}"
        )
    return problems


def _load_qwen3_vl_methods(
    tree: Path, patch: EncoderCudaGraphBudgets
) -> dict[str, Any]:
    """The tree's own Qwen3-VL methods, by part, compiled from its model file."""
    import torch
    from deepstack_patch.proof.proving import function_from_tree, proof_targets

    methods: dict[str, Any] = {}
    for relpath, found in proof_targets(tree, patch):
        if found.part in ("ceil-per-item", "pruning-no-graphs"):
            methods.setdefault(
                found.part,
                function_from_tree(tree, relpath, found.symbol, {"torch": torch}),
            )
    return methods


def _prove_qwen3_vl(tree: Path, patch: EncoderCudaGraphBudgets) -> list[str]:
    import inspect
    from types import SimpleNamespace

    import torch

    methods = _load_qwen3_vl_methods(tree, patch)
    problems = []
    capture = methods.get("ceil-per-item")
    if capture is None:
        problems.append("no Qwen3-VL prepare_encoder_cudagraph_capture_inputs found")
    else:
        merge = 2
        visual = SimpleNamespace(
            spatial_merge_size=merge,
            patch_embed=SimpleNamespace(
                proj=SimpleNamespace(in_channels=1), patch_size=1, temporal_patch_size=1
            ),
            prepare_encoder_metadata=lambda grid, **kwargs: {},
        )
        budget, batch = 100, 8
        arguments = {
            "token_budget": budget,
            "max_batch_size": batch,
            "max_frames_per_batch": batch,
            "device": torch.device("cpu"),
            "dtype": torch.float32,
        }
        accepted = inspect.signature(capture).parameters
        inputs = capture(
            SimpleNamespace(visual=visual),
            **{k: v for k, v in arguments.items() if k in accepted},
        )
        grid = inputs.mm_kwargs["image_grid_thw"]
        per_item = [t * (h // merge) * (w // merge) for t, h, w in grid]
        if min(per_item) * batch < budget:
            problems.append(
                f"capture inputs for token_budget={budget}, max_batch_size={batch} "
                f"give {min(per_item)} tokens per item (floor division), fewer than "
                f"one item using the whole budget needs"
            )
    config = methods.get("pruning-no-graphs")
    if config is None:
        problems.append("no Qwen3-VL get_encoder_cudagraph_config found")
    else:

        def model(pruning: bool) -> SimpleNamespace:
            return SimpleNamespace(
                is_multimodal_pruning_enabled=pruning,
                visual=SimpleNamespace(out_hidden_size=8),
                get_max_frames_per_video=lambda: 1,
            )

        pruned = config(model(True)).modalities
        if pruned:
            problems.append(
                f"with multimodal pruning on, encoder CUDA graphs still serve {pruned}"
            )
        if "image" not in config(model(False)).modalities:
            problems.append("without pruning, image encoder CUDA graphs are gone")
    return problems


PATCH = EncoderCudaGraphBudgets()

"""vllm#38040: encoder (ViT) CUDA graphs: budget invariants, ceil sizing, pruning.

Symptom: Qwen3-VL encoder CUDA graph capture crashes (reshape of an empty
tensor) when max_batch_size exceeds the smallest token budget; per-item
buffers under-allocated; under multimodal pruning the graph path returns
embeddings in another format than eager

Why: with encoder CUDA graphs on (``cudagraph_mm_encoder``), when
``max_batch_size`` exceeds the smallest token budget,
``per_image_output = token_budget // max_batch_size`` is 0 and a reshape of an
empty tensor fails while capturing. Integer division also under-allocates the
per-item capture buffers when a budget is not a multiple of the batch size.
And with multimodal (EVS) pruning on, the graph path skips the embedding
post-processing eager mode does.

Upstream: https://github.com/vllm-project/vllm/pull/38040 (first in 0.22.0).
Four parts, each with its own status line and its own module here:
``budget_invariant.py`` (``EncoderCudaGraphManager.__init__``),
``positive_budgets.py`` (``CompilationConfig.__post_init__``),
``ceil_per_item.py`` and ``pruning_no_graphs.py`` (the Qwen3-VL methods);
``proof.py`` runs each of them from the tree.

Fix safety: EncoderCudaGraphManager.__init__'s budget/batch-size selection is
replaced as a whole (upstream's comments replace the old ones in it); one
validation is added to CompilationConfig.__post_init__; one assignment
changes in each Qwen3-VL method. 0.22.0's max_frames_per_video refactor is
not ported.

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

Each part replaces only the statement(s) it recognises exactly (layout and
comments aside, with whatever local names the code uses), and puts upstream's
explanatory comments with them.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import iter_classes, rewrite_definitions

from . import budget_invariant, ceil_per_item, positive_budgets, pruning_no_graphs
from .common import BUDGETS_FIELD, CONFIG_CLASS, MANAGER_CLASS, MODEL_MARK, has_body

if TYPE_CHECKING:
    import libcst

# --- examples of the two Qwen3-VL parts (one class holds both methods) -------

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


# The modalities go somewhere the fix does not know: a literal given to
# another call, or a list changed after the recognised statements (graphs for
# "audio" would stay on under pruning). Neither is rewritten.
MODALITIES_OF_ANOTHER_CALL = """
class Qwen3VLForConditionalGeneration(nn.Module):
    def __init__(self, vllm_config):
        self.is_multimodal_pruning_enabled = vllm_config.pruning

    def get_encoder_cudagraph_config(self):
        config = EncoderCudaGraphConfig(out_hidden_size=8)
        config.modalities = vendor_checked(modalities=["image"])
        return config
"""

MODALITIES_CHANGED_LATER = """
class Qwen3VLForConditionalGeneration(nn.Module):
    def __init__(self, vllm_config):
        self.is_multimodal_pruning_enabled = vllm_config.pruning

    def get_encoder_cudagraph_config(self):
        modalities = ["image"]
        if not self.is_multimodal_pruning_enabled:
            modalities.append("video")
        modalities.append("audio")
        return EncoderCudaGraphConfig(modalities=modalities, out_hidden_size=8)
"""

QWEN_EXAMPLES = (
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
    Example(
        "modalities= of another call",
        MODALITIES_OF_ANOTHER_CALL,
        state=PatchState.DRIFTED,
    ),
    Example(
        "modalities changed after the pruning branch",
        MODALITIES_CHANGED_LATER,
        state=PatchState.DRIFTED,
    ),
)


class EncoderCudaGraphBudgets(Patch):
    id = "vllm#38040"
    title = (
        "Encoder CUDA graphs: budget invariants, ceil sizing, no graphs under pruning"
    )
    upstream_url = "https://github.com/vllm-project/vllm/pull/38040"
    fixed_in = "0.22.0"
    # The module docstring (the class has none) is the one source of both.
    symptom = section(__doc__, "Symptom")
    also_changes = section(__doc__, "Fix safety")
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
        *budget_invariant.EXAMPLES,
        *positive_budgets.EXAMPLES,
        *QWEN_EXAMPLES,
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        findings: list[Finding] = []
        for qualname, cls in iter_classes(tree):
            methods = {
                node.name: node
                for node in cls.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            init, post_init = methods.get("__init__"), methods.get("__post_init__")
            if cls.name == MANAGER_CLASS and init is not None:
                findings.append(
                    budget_invariant.recognise(f"{qualname}.__init__", init)
                )
            if (
                cls.name == CONFIG_CLASS
                and post_init is not None
                and positive_budgets.declares_field(cls, BUDGETS_FIELD)
            ):
                symbol = f"{qualname}.__post_init__"
                findings.append(positive_budgets.recognise(symbol, post_init))
            capture = methods.get("prepare_encoder_cudagraph_capture_inputs")
            if capture is not None and has_body(capture):
                symbol = f"{qualname}.{capture.name}"
                is_qwen = MODEL_MARK in cls.name
                findings.extend(ceil_per_item.recognise(symbol, capture, is_qwen))
            config = methods.get("get_encoder_cudagraph_config")
            if config is not None and has_body(config) and MODEL_MARK in cls.name:
                symbol = f"{qualname}.{config.name}"
                has_flag = pruning_no_graphs.assigns_pruning(cls)
                findings.append(pruning_no_graphs.recognise(symbol, config, has_flag))
        return findings

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        return rewrite_definitions(
            module, {found.symbol: _rewriter(found) for found in needed}
        )

    def prove(self, tree: Path) -> None:
        from .proof import prove

        prove(tree, self)


#: Each part's rewrite, by part name: ``(function, finding) -> function``.
REWRITES = {
    budget_invariant.PART: budget_invariant.rewrite,
    positive_budgets.PART: positive_budgets.rewrite,
    ceil_per_item.PART: ceil_per_item.rewrite,
    pruning_no_graphs.PART: pruning_no_graphs.rewrite,
}


def _rewriter(found: Finding) -> Callable[[Any], Any]:
    """The part's rewrite of one function, with what recognition found."""
    rewrite = REWRITES[found.part]
    return lambda function: rewrite(function, found)


PATCH = EncoderCudaGraphBudgets()

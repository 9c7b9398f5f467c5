"""vllm#38040, part ``budget-invariant``: ``max_batch_size <= min(token_budgets)``.

``EncoderCudaGraphManager.__init__`` keeps the invariant on every
configuration path: a user-given pair that breaks it raises ValueError naming
both values, the automatic paths clamp ``max_batch_size`` (or raise the
budgets to the user's batch size), and a non-positive or inverted model budget
range raises ValueError. The ``if`` choosing budgets and batch size is
replaced as a whole by upstream's (its comments replace the old ones in it).
"""

from __future__ import annotations

import ast
import types
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Example, Finding, PatchState
from deepstack_patch.engine.syntax import FunctionNode, dotted, matches_code

from .common import indented, part_finding

if TYPE_CHECKING:
    import libcst

PART = "budget-invariant"

# --- the code this part recognises and writes, as templates -----------------
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

MANAGER_NAMES = {
    "budgets": "user_budgets",
    "items": "user_max_vision_items",
    "field": "encoder_cudagraph_max_vision_items_per_batch",
    "short": "max_vision_items_per_batch",
    "model": "model",
    "config": "vllm_config",
}
MANAGER_AFTER = (
    MANAGER_BEFORE[: MANAGER_BEFORE.index("        if user_budgets")]
    + indented(CHOOSE_BUDGETS_AFTER.format(**MANAGER_NAMES), 8)
    + "        self.budget_graphs = {}\n"
)

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

OLD_MANAGER_NAMES = {
    "budgets": "budgets",
    "items": "imgs",
    "field": "encoder_cudagraph_max_images_per_batch",
    "short": "max_images_per_batch",
    "model": "vit",
    "config": "cfg",
}
OLD_MANAGER_AFTER = OLD_MANAGER_BEFORE[
    : OLD_MANAGER_BEFORE.index("        if budgets")
] + indented(CHOOSE_BUDGETS_AFTER.format(**OLD_MANAGER_NAMES), 8)


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

EXAMPLES = (
    Example("manager __init__, 0.20.x shape", MANAGER_BEFORE, MANAGER_AFTER),
    Example(
        "manager __init__, 0.19.x shape with renamed locals",
        OLD_MANAGER_BEFORE,
        OLD_MANAGER_AFTER,
    ),
    Example("manager __init__ already fixed", MANAGER_AFTER, state=PatchState.APPLIED),
    Example("manager clamps its own way", MANAGER_OWN_CLAMP, state=PatchState.DRIFTED),
)


# --- recognition ------------------------------------------------------------


def _budget_names(statement: ast.stmt) -> tuple[str, str] | None:
    """``(budgets, items)`` for ``if <budgets> and <items> > 0:``."""
    match statement:
        case ast.If(
            test=ast.BoolOp(
                op=ast.And(),
                values=[
                    ast.Name(budgets),
                    ast.Compare(
                        left=ast.Name(items),
                        ops=[ast.Gt()],
                        comparators=[ast.Constant(value=0)],
                    ),
                ],
            )
        ):
            return budgets, items
    return None


def _range_call(statement: ast.stmt) -> tuple[str, str] | None:
    """``(model, config)`` of ``model.get_encoder_cudagraph_budget_range(config)``."""
    for node in ast.walk(statement):
        match node:
            case ast.Call(
                func=ast.Attribute(
                    value=model, attr="get_encoder_cudagraph_budget_range"
                ),
                args=[config],
                keywords=[],
            ) if dotted(model) and dotted(config):
                return dotted(model), dotted(config)
    return None


def _config_field(function: FunctionNode, local: str) -> str | None:
    """The attribute read into ``local`` (``local = cc.<field>``)."""
    for node in ast.walk(function):
        match node:
            case ast.Assign(
                targets=[ast.Name(name)], value=ast.Attribute(attr=field)
            ) if name == local:
                return field
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
        if matches_code(statement, CHOOSE_BUDGETS_BEFORE, **names):
            return index, names, PatchState.NEEDED
        if matches_code(statement, CHOOSE_BUDGETS_AFTER, **names):
            return index, names, PatchState.APPLIED
    return None


def recognise(symbol: str, function: FunctionNode) -> Finding:
    """``EncoderCudaGraphManager.__init__``: the budget-choosing ``if``."""
    found = _budget_statement(function)
    if found is None:
        return part_finding(
            PatchState.DRIFTED,
            symbol,
            function,
            PART,
            "expected `if <budgets> and <max_items> > 0:` choosing self.token_budgets "
            "and self.max_batch_size as upstream 0.19-0.21 (needed) or 0.22 "
            "(applied) do, with <max_items> read from a compilation config field",
            upstream_identical=False,
        )
    index, names, state = found
    details = {"index": index, "names": types.MappingProxyType(names)}
    return part_finding(
        state, symbol, function, PART, upstream_identical=False, details=details
    )


# --- rewriting --------------------------------------------------------------


def rewrite(function: libcst.FunctionDef, found: Finding) -> libcst.FunctionDef:
    """Replace the budget-choosing ``if`` with upstream's fixed one."""
    import libcst

    index, names = found.details["index"], found.details["names"]
    module = libcst.parse_module(CHOOSE_BUDGETS_AFTER.format(**names))
    replacement = module.body[0]
    # The module header holds the template's leading comment block.
    body = list(function.body.body)
    old = body[index]
    comments = [line for line in module.header]
    replacement = replacement.with_changes(
        leading_lines=[*old.leading_lines, *comments, *replacement.leading_lines]
    )
    body[index] = replacement
    return function.with_changes(body=function.body.with_changes(body=body))

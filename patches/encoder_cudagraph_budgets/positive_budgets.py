"""vllm#38040, part ``positive-budgets``: reject non-positive token budgets.

``CompilationConfig.__post_init__`` rejects non-positive
``encoder_cudagraph_token_budgets``; the check goes right after the last
validation of an ``encoder_cudagraph_*`` field: a top-level
``if <test reading self.encoder_cudagraph_*>: raise ...``. Another ``if`` on
those fields (an early ``return``) is never the place: the check could be
skipped behind it.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Example, Finding, PatchState
from deepstack_patch.engine.syntax import FunctionNode, is_self_attribute, matches_code

from .common import BUDGETS_FIELD, indented, part_finding

if TYPE_CHECKING:
    import libcst

PART = "positive-budgets"

POSITIVE_BUDGETS = """\
if self.encoder_cudagraph_token_budgets and any(
    b <= 0 for b in self.encoder_cudagraph_token_budgets
):
    raise ValueError(
        f"All encoder_cudagraph_token_budgets must be positive, "
        f"got {self.encoder_cudagraph_token_budgets}"
    )
"""

# --- examples -----------------------------------------------------------------

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

CONFIG_AFTER = CONFIG_BEFORE.replace(
    "\n        if self.backend",
    "\n" + indented(POSITIVE_BUDGETS, 8) + "\n        if self.backend",
)

# The budgets are validated already, another way: leave it, say so.
CONFIG_OWN_CHECK = """
class CompilationConfig:
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if min(self.encoder_cudagraph_token_budgets, default=1) < 1:
            raise ValueError("budgets must be positive")
"""

# A vendor returns early when encoder graphs have no item limit (the
# default): the check goes after the last validation, before that return,
# where it runs on every config.
EARLY_RETURN_BEFORE = """
class CompilationConfig:
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.encoder_cudagraph_max_vision_items_per_batch < 0:
            raise ValueError("must be non-negative")
        if not self.encoder_cudagraph_max_vision_items_per_batch:
            return
        self.backend = current_platform.get_compile_backend()
"""

EARLY_RETURN_AFTER = EARLY_RETURN_BEFORE.replace(
    "\n        if not self",
    "\n\n" + indented(POSITIVE_BUDGETS, 8) + "        if not self",
)

EXAMPLES = (
    Example("CompilationConfig validation", CONFIG_BEFORE, CONFIG_AFTER),
    Example(
        "early return after the validations (vendor)",
        EARLY_RETURN_BEFORE,
        EARLY_RETURN_AFTER,
    ),
    Example("CompilationConfig already fixed", CONFIG_AFTER, state=PatchState.APPLIED),
    Example(
        "CompilationConfig validates budgets another way",
        CONFIG_OWN_CHECK,
        state=PatchState.DRIFTED,
    ),
)


# --- recognition ------------------------------------------------------------


def declares_field(cls: ast.ClassDef, name: str) -> bool:
    """``<name>: <annotation> ...`` in the class body (a dataclass field)."""
    for node in cls.body:
        match node:
            case ast.AnnAssign(target=ast.Name(field)) if field == name:
                return True
    return False


def _mentions_budgets(node: ast.AST) -> bool:
    return any(is_self_attribute(n, BUDGETS_FIELD) for n in ast.walk(node))


def _validates_encoder_field(statement: ast.stmt) -> bool:
    """``if <... self.encoder_cudagraph_* ...>: raise ...``: a validation. Any
    other ``if`` on those fields (an early ``return``, a default filled in) is
    no place to put the check after: it may skip it."""
    match statement:
        case ast.If(test=test, body=[ast.Raise()], orelse=[]):
            for node in ast.walk(test):
                match node:
                    case ast.Attribute(value=ast.Name("self"), attr=attr) if (
                        attr.startswith("encoder_cudagraph_")
                    ):
                        return True
    return False


def _encoder_validation_index(function: FunctionNode) -> int | None:
    """The last top-level statement of ``function`` validating encoder graph fields."""
    last = None
    for index, statement in enumerate(function.body):
        if _validates_encoder_field(statement):
            last = index
    return last


def recognise(symbol: str, function: FunctionNode) -> Finding:
    """``CompilationConfig.__post_init__``: upstream's check, or where it goes."""
    if any(matches_code(s, POSITIVE_BUDGETS) for s in function.body):
        return part_finding(
            PatchState.APPLIED, symbol, function, PART, upstream_identical=False
        )
    if any(_mentions_budgets(s) for s in function.body):
        return part_finding(
            PatchState.DRIFTED,
            symbol,
            function,
            PART,
            f"__post_init__ already reads self.{BUDGETS_FIELD}, but not as upstream's "
            "`if ... any(b <= 0 for b in ...): raise ValueError(...)`",
            upstream_identical=False,
        )
    index = _encoder_validation_index(function)
    if index is None:
        return part_finding(
            PatchState.DRIFTED,
            symbol,
            function,
            PART,
            "no `if self.encoder_cudagraph_...` validation in __post_init__ to put "
            "the budget check after",
            upstream_identical=False,
        )
    return part_finding(
        PatchState.NEEDED,
        symbol,
        function,
        PART,
        upstream_identical=False,
        details={"after": index},
    )


# --- rewriting --------------------------------------------------------------


def rewrite(function: libcst.FunctionDef, found: Finding) -> libcst.FunctionDef:
    """Add the positive-budgets check after the last encoder validation."""
    import libcst

    check = libcst.parse_module(POSITIVE_BUDGETS).body[0]
    check = check.with_changes(leading_lines=[libcst.EmptyLine(indent=False)])
    body = list(function.body.body)
    body.insert(found.details["after"] + 1, check)
    return function.with_changes(body=function.body.with_changes(body=body))

"""vllm#38040, part ``ceil-per-item``: size each captured item with ceil division.

Qwen3-VL ``prepare_encoder_cudagraph_capture_inputs`` computes the tokens of
one item as ``token_budget // max_batch_size``; floor under-allocates when the
budget is not a multiple of the batch size. The assignment becomes the ceil
division, with upstream's comment. Qwen3-VL is found by class name (a class
whose name contains ``Qwen3VL``): upstream fixed only that model, and later
releases keep the floor division in copies of the pattern
(``Glm4vForConditionalGeneration`` from 0.25.0), which are listed as
not-applicable rather than rewritten.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.syntax import FunctionNode, matches_code, parameter_names

from .common import comment_lines, part_finding

if TYPE_CHECKING:
    import libcst

PART = "ceil-per-item"
FLOOR = "{budget} // {batch}"
CEIL = "({budget} + {batch} - 1) // {batch}"
CEIL_COMMENT = (
    "# Ceil so the buffer fits the worst case of one item using the full",
    "# budget. Floor under-allocates when budget is not a multiple of",
    "# max_batch_size.",
)


# --- recognition ------------------------------------------------------------


def _per_item_assignment(function: FunctionNode) -> tuple[int, str, bool] | None:
    """``(index, target, is_ceil)`` of the per-item output assignment."""
    params = parameter_names(function)
    if len(params) < 3:
        return None
    names = {"budget": params[1], "batch": params[2]}
    for index, statement in enumerate(function.body):
        match statement:
            case ast.Assign(targets=[ast.Name(target)], value=value):
                if matches_code(value, FLOOR, **names):
                    return index, target, False
                if matches_code(value, CEIL, **names):
                    return index, target, True
    return None


def recognise(symbol: str, function: FunctionNode, is_target: bool) -> list[Finding]:
    """The per-item assignment; ``is_target``: the class is Qwen3-VL's."""
    found = _per_item_assignment(function)
    if not is_target:
        if found is not None and not found[2]:
            # Report the copy of the pattern, but do not touch it.
            return [
                part_finding(
                    PatchState.NOT_APPLICABLE,
                    symbol,
                    function,
                    PART,
                    f"{found[1]} = token_budget // max_batch_size here too, but "
                    "vllm#38040 fixed only Qwen3-VL; this model is left as upstream "
                    "has it",
                )
            ]
        return []
    if found is None:
        return [
            part_finding(
                PatchState.DRIFTED,
                symbol,
                function,
                PART,
                "expected `<per_item> = token_budget // max_batch_size` (needed) or "
                "`(token_budget + max_batch_size - 1) // max_batch_size` (applied) "
                "among the function's top-level statements",
            )
        ]
    index, _target, is_ceil = found
    if is_ceil:
        return [part_finding(PatchState.APPLIED, symbol, function, PART)]
    params = parameter_names(function)
    details = {"index": index, "budget": params[1], "batch": params[2]}
    return [part_finding(PatchState.NEEDED, symbol, function, PART, details=details)]


# --- rewriting --------------------------------------------------------------


def rewrite(function: libcst.FunctionDef, found: Finding) -> libcst.FunctionDef:
    """Replace ``x = budget // batch`` by the ceil division."""
    import libcst

    index = found.details["index"]
    names = {"budget": found.details["budget"], "batch": found.details["batch"]}
    body = list(function.body.body)
    old = body[index]
    assert isinstance(old, libcst.SimpleStatementLine)
    value = libcst.parse_expression(CEIL.format(**names))
    assign = old.body[0]
    assert isinstance(assign, libcst.Assign)
    body[index] = old.with_changes(
        body=[assign.with_changes(value=value), *old.body[1:]],
        leading_lines=[*old.leading_lines, *comment_lines(CEIL_COMMENT)],
    )
    return function.with_changes(body=function.body.with_changes(body=body))

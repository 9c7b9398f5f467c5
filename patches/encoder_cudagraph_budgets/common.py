"""What the four parts of vllm#38040 share: names, findings, comment lines."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.syntax import FunctionNode, finding

if TYPE_CHECKING:
    import libcst

MANAGER_CLASS = "EncoderCudaGraphManager"
CONFIG_CLASS = "CompilationConfig"
BUDGETS_FIELD = "encoder_cudagraph_token_budgets"
MODEL_MARK = "Qwen3VL"
PRUNING = "is_multimodal_pruning_enabled"


def part_finding(
    state: PatchState,
    symbol: str,
    node: ast.AST,
    part: str,
    reason: str = "",
    *,
    upstream_identical: bool = True,
    details: Mapping[str, Any] | None = None,
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
        details=details,
    )


def has_body(function: FunctionNode) -> bool:
    """Not an interface stub (docstring, ``...``, ``raise NotImplementedError``)."""
    for statement in function.body:
        match statement:
            case ast.Expr(ast.Constant()) | ast.Raise() | ast.Pass():
                continue
        return True
    return False


def comment_lines(texts: Sequence[str]) -> list[libcst.EmptyLine]:
    import libcst

    return [libcst.EmptyLine(comment=libcst.Comment(text)) for text in texts]


def indented(code: str, spaces: int) -> str:
    """``code`` indented as a block ``spaces`` deep (blank lines stay empty)."""
    # What textwrap.indent does; the examples call this when the patch is
    # imported, and textwrap's import was a millisecond of every command.
    prefix = " " * spaces
    return "".join(
        prefix + line if line.strip() else line for line in code.splitlines(True)
    )

"""vllm#38040, part ``pruning-no-graphs``: no encoder CUDA graphs under pruning.

With multimodal (EVS) pruning on, the graph path skips the embedding
post-processing eager mode does, so its embeddings have another format.
Qwen3-VL ``get_encoder_cudagraph_config`` returns no modalities (no encoder
CUDA graphs) when ``self.is_multimodal_pruning_enabled``. 0.20-0.21 build the
list then append ``"video"`` unless pruning; 0.19.x passes a literal
``modalities=["image"]``. Both become ``[] if <pruning> else [...]``.

Only where the list is known to be the graphs' modalities: the built list
must reach ``EncoderCudaGraphConfig(modalities=<name>)`` and nothing else may
change or rebind it (a later ``<name>.append(...)`` is drifted), and the
literal must be the ``modalities=`` keyword of ``EncoderCudaGraphConfig``
itself, not of another call.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.syntax import (
    FunctionNode,
    called_name,
    dotted,
    is_self_attribute,
    matches_code,
)

from .common import PRUNING, comment_lines, part_finding

if TYPE_CHECKING:
    import libcst

PART = "pruning-no-graphs"
CONFIG = "EncoderCudaGraphConfig"
PRUNING_COMMENT = (
    "# When EVS pruning is enabled, embed_multimodal post-processes both",
    "# image and video embeddings (mrope positions are appended for image,",
    "# prune+append for video). The encoder CUDA graph path bypasses that",
    "# post-process, producing inconsistent embedding formats vs eager. So",
    "# disable CUDA graph for all modalities when pruning is on.",
)
#: The two shapes of the bug, as ``details["shape"]``.
LIST_THEN_APPEND = "list-then-append"
LITERAL_KEYWORD = "literal-keyword"


# --- recognition ------------------------------------------------------------


def assigns_pruning(cls: ast.ClassDef) -> bool:
    """The class sets ``self.is_multimodal_pruning_enabled`` somewhere."""
    for node in ast.walk(cls):
        match node:
            case ast.Assign(targets=targets) if any(
                is_self_attribute(t, PRUNING) for t in targets
            ):
                return True
            case ast.AnnAssign(target=target) if is_self_attribute(target, PRUNING):
                return True
    return False


def _is_pruning_ifexp(value: ast.AST) -> bool:
    """``[] if self.is_multimodal_pruning_enabled else [...]``."""
    match value:
        case ast.IfExp(test=test, body=ast.List(elts=[]), orelse=ast.List()):
            return is_self_attribute(test, PRUNING)
    return False


def _is_string_list(value: ast.AST) -> bool:
    match value:
        case ast.List(elts=elements):
            return all(
                isinstance(e, ast.Constant) and isinstance(e.value, str)
                for e in elements
            )
    return False


def _is_append_video_unless_pruning(statement: ast.stmt, name: str) -> bool:
    """``if not self.<pruning>: <name>.append("<modality>")``."""
    match statement:
        case ast.If(
            test=ast.UnaryOp(op=ast.Not(), operand=flag),
            body=[ast.Expr(ast.Call(func=append, args=[ast.Constant(value=str())]))],
            orelse=[],
        ):
            return (
                is_self_attribute(flag, PRUNING) and dotted(append) == f"{name}.append"
            )
    return False


def _is_config_call(node: ast.AST) -> bool:
    return called_name(node) == CONFIG


def _other_use(function: FunctionNode, name: str, built: list[ast.stmt]) -> str:
    """Why the list ``name`` is not known to be only the graphs' modalities
    (empty if it is): it must reach ``EncoderCudaGraphConfig(modalities=name)``
    and nothing but the recognised statements may change it."""
    passed = any(
        _is_config_call(node)
        and any(
            k.arg == "modalities" and matches_code(k.value, name) for k in node.keywords
        )
        for node in ast.walk(function)
    )
    if not passed:
        return (
            f"`{name}` is not passed as {CONFIG}(modalities={name}); expected the "
            "list built here to be the graphs' modalities"
        )
    inside = {id(node) for statement in built for node in ast.walk(statement)}
    for node in ast.walk(function):
        if id(node) in inside:
            continue
        match node:
            case ast.Name(id=used, ctx=ast.Store() | ast.Del()) if used == name:
                return f"`{name}` is bound again at line {node.lineno}"
            case (
                ast.Attribute(value=ast.Name(id=used))
                | ast.Subscript(value=ast.Name(id=used), ctx=ast.Store() | ast.Del())
            ) if used == name:
                return (
                    f"`{name}` is used as {ast.unparse(node)} at line {node.lineno}; "
                    f"expected it only in {CONFIG}(modalities={name})"
                )
    return ""


def _modalities_state(function: FunctionNode) -> tuple[PatchState, str, int]:
    """The state, with the shape of the bug (or what drifted), and its index."""
    for statement in function.body:
        match statement:
            case ast.Assign(targets=[ast.Name()], value=value) if _is_pruning_ifexp(
                value
            ):
                return PatchState.APPLIED, "", -1
    body = function.body
    for index, statement in enumerate(body[:-1]):
        # 0.20-0.21: `modalities = ["image"]` then `if not pruning: append("video")`.
        match statement:
            case ast.Assign(targets=[ast.Name(name)], value=value) if _is_string_list(
                value
            ) and _is_append_video_unless_pruning(body[index + 1], name):
                unknown = _other_use(function, name, body[index : index + 2])
                if unknown:
                    return PatchState.DRIFTED, unknown, -1
                return PatchState.NEEDED, LIST_THEN_APPEND, index
    keywords = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.keyword) and node.arg == "modalities"
    ]
    configs = [node for node in ast.walk(function) if _is_config_call(node)]
    if len(keywords) == 1 and not any(keywords[0] in c.keywords for c in configs):
        return (
            PatchState.DRIFTED,
            (
                f"a modalities= keyword at line {keywords[0].value.lineno} that is "
                f"not {CONFIG}'s; expected {CONFIG}(modalities=[...], ...)"
            ),
            -1,
        )
    if len(keywords) == 1:
        value = keywords[0].value
        if _is_pruning_ifexp(value):
            return PatchState.APPLIED, "", -1
        if _is_string_list(value):
            if any(
                isinstance(n, ast.Attribute) and n.attr == PRUNING
                for n in ast.walk(function)
            ):
                return (
                    PatchState.DRIFTED,
                    (
                        "a literal modalities=[...] in a function that already reads "
                        f"self.{PRUNING}"
                    ),
                    -1,
                )
            return PatchState.NEEDED, LITERAL_KEYWORD, -1
    return (
        PatchState.DRIFTED,
        (
            f"expected `modalities = [...]` then `if not self.{PRUNING}: "
            "modalities.append(...)`, or a literal modalities=[...] keyword (needed), "
            f"or `[] if self.{PRUNING} else [...]` (applied)"
        ),
        -1,
    )


def recognise(symbol: str, function: FunctionNode, has_flag: bool) -> Finding:
    """``has_flag``: the class sets the pruning flag the fix reads."""
    state, detail, index = _modalities_state(function)
    if state is PatchState.NEEDED and not has_flag:
        return part_finding(
            PatchState.DRIFTED,
            symbol,
            function,
            PART,
            f"the class never sets self.{PRUNING}, so graphs cannot be made "
            "conditional on it",
            upstream_identical=False,
        )
    if state is PatchState.NEEDED:
        return part_finding(
            state,
            symbol,
            function,
            PART,
            upstream_identical=False,
            details={"shape": detail, "index": index},
        )
    reason = detail if state is PatchState.DRIFTED else ""
    return part_finding(state, symbol, function, PART, reason, upstream_identical=False)


# --- rewriting --------------------------------------------------------------


def _pruning_or(kept: libcst.BaseExpression) -> libcst.IfExp:
    import libcst

    return libcst.IfExp(
        test=libcst.parse_expression(f"self.{PRUNING}"),
        body=libcst.List([]),
        orelse=kept,
    )


def rewrite(function: libcst.FunctionDef, found: Finding) -> libcst.FunctionDef:
    """``[] if self.<pruning> else [...]`` in place of the modalities."""
    import libcst

    if found.details["shape"] == LIST_THEN_APPEND:
        index = found.details["index"]
        body = list(function.body.body)
        statement, appending = body[index], body[index + 1]
        assert isinstance(statement, libcst.SimpleStatementLine)
        assign = statement.body[0]
        assert isinstance(assign, libcst.Assign)
        kept = libcst.parse_expression(
            "[" + ", ".join(_strings(assign.value, appending)) + "]"
        )
        new = statement.with_changes(
            body=[assign.with_changes(value=_pruning_or(kept))],
            leading_lines=[*statement.leading_lines, *comment_lines(PRUNING_COMMENT)],
        )
        body[index : index + 2] = [new]
        return function.with_changes(body=function.body.with_changes(body=body))

    class LiteralKeyword(libcst.CSTTransformer):
        def leave_Arg(self, original: libcst.Arg, updated: libcst.Arg) -> libcst.Arg:
            if updated.keyword is None or updated.keyword.value != "modalities":
                return updated
            return updated.with_changes(value=_pruning_or(updated.value))

    return function.visit(LiteralKeyword())


def _strings(
    listed: libcst.BaseExpression, appending: libcst.BaseStatement
) -> list[str]:
    """The modalities of ``x = [...]`` plus the one ``x.append(...)`` adds, as
    written (quotes kept)."""
    import libcst

    names = [
        element.value.value
        for element in (listed.elements if isinstance(listed, libcst.List) else [])
        if isinstance(element.value, libcst.SimpleString)
    ]

    # A plain visitor, not libcst.matchers: importing that module costs
    # longer than the whole rewrite.
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

"""vllm#38933, part ``callers-mark-unbacked``: mark the batch dimension unbacked.

Every caller of ``batched_count_greater_than`` (``Sampler.gather_logprobs``)
marks the batch dimension of both tensors with
``torch._dynamo.decorators.mark_unbacked(<tensor>, 0)`` right before the
call, so dynamo never specialises it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.syntax import FunctionNode, called_name, dotted, finding

from .compiled import COUNT_FUNCTION

if TYPE_CHECKING:
    import libcst

PART = "callers-mark-unbacked"
MARK_UNBACKED = "torch._dynamo.decorators.mark_unbacked"

# The comment upstream puts above the marks: it says why they are there.
MARK_COMMENT = (
    "# Avoid 0/1 specialization recompile on the batch dimension",
    "# of the compiled batched_count_greater_than. mark_unbacked makes",
    "# the size fully symbolic so dynamo doesn't specialize when",
    "# batch_size transitions from 1 to >=2.",
)


# --- recognition ------------------------------------------------------------


def _statement_blocks(function: FunctionNode) -> Iterator[list[ast.stmt]]:
    """Every list of statements in ``function``, nested blocks included."""
    for node in ast.walk(function):
        if node is not function and isinstance(node, FunctionNode | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
        for handler in getattr(node, "handlers", []):
            yield handler.body
        for case in getattr(node, "cases", []):
            yield case.body


def count_calls(node: ast.AST) -> list[ast.Call]:
    """The calls of batched_count_greater_than in ``node``, those in functions
    and classes nested in it aside (they are recognised on their own)."""
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call) and called_name(current) == COUNT_FUNCTION:
            found.append(current)
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, FunctionNode | ast.ClassDef):
                stack.append(child)
    return sorted(found, key=lambda call: (call.lineno, call.col_offset))


def _quoted(node: ast.AST) -> str:
    """A node's code for a message, long code shortened."""
    code = " ".join(ast.unparse(node).split())
    return f"`{code}`" if len(code) <= 80 else f"`{code[:77]}...`"


def _is_whole_value(statement: ast.stmt, call: ast.Call) -> bool:
    """``call`` is all the statement computes: ``x = call``, ``return call``,
    ``call``. Only there do marks right before the statement mark the very
    tensors the call gets, each time it is made."""
    match statement:
        case (
            ast.Assign(value=value)
            | ast.AnnAssign(value=value)
            | ast.Return(value=value)
            | ast.Expr(value=value)
        ):
            return value is call
    return False


def _is_mark(statement: ast.stmt) -> str | None:
    """The tensor name of ``torch._dynamo.decorators.mark_unbacked(<name>, 0)``."""
    match statement:
        case ast.Expr(
            ast.Call(
                func=func, args=[ast.Name(name), ast.Constant(value=0)], keywords=[]
            )
        ) if dotted(func) == MARK_UNBACKED:
            return name
    return None


def _call_states(function: FunctionNode) -> list[tuple[PatchState, str]]:
    """The state of each call of batched_count_greater_than in ``function``."""
    states = []
    placed: set[int] = set()
    for block in _statement_blocks(function):
        for index, statement in enumerate(block):
            if any(
                isinstance(getattr(statement, f, None), list) for f in ("body", "cases")
            ):
                continue  # a compound statement: its blocks are visited on their own
            for call in count_calls(statement):
                placed.add(id(call))
                if _is_whole_value(statement, call):
                    states.append(_call_state(call, block[:index]))
                    continue
                states.append(
                    (
                        PatchState.DRIFTED,
                        f"line {call.lineno}: {COUNT_FUNCTION} is called inside "
                        f"{_quoted(statement)}; expected the call as the "
                        "whole value of an assignment, return or expression "
                        f"statement (`ranks = {COUNT_FUNCTION}(a, b)`)",
                    )
                )
    for call in count_calls(function):
        if id(call) not in placed:
            states.append(
                (
                    PatchState.DRIFTED,
                    f"line {call.lineno}: {COUNT_FUNCTION} is called in the header "
                    "of a compound statement, where no statement can go before it",
                )
            )
    return states


def _call_state(call: ast.Call, earlier: list[ast.stmt]) -> tuple[PatchState, str]:
    """Needed without marks right before the call; applied with both marks."""
    if (
        len(call.args) != 2
        or call.keywords
        or not all(isinstance(a, ast.Name) for a in call.args)
    ):
        return (
            PatchState.DRIFTED,
            f"line {call.lineno}: {COUNT_FUNCTION} is not called with two plain "
            "tensor names, so there is no name to mark",
        )
    names = {a.id for a in call.args if isinstance(a, ast.Name)}
    marked: set[str] = set()
    for statement in reversed(earlier):
        name = _is_mark(statement)
        if name is None:
            break
        marked.add(name)
    if not marked:
        return PatchState.NEEDED, ""
    if names <= marked:
        return PatchState.APPLIED, ""
    return (
        PatchState.DRIFTED,
        f"line {call.lineno}: mark_unbacked(..., 0) right before the call covers "
        f"{', '.join(sorted(marked))}, but the call passes "
        f"{', '.join(sorted(names))}",
    )


def recognise(qualname: str, function: FunctionNode) -> Finding:
    """The state of every call of batched_count_greater_than in ``function``."""
    part = PART
    states = _call_states(function)
    drifted = [reason for state, reason in states if state is PatchState.DRIFTED]
    if drifted:
        reason = "; ".join(drifted)
        return finding(PatchState.DRIFTED, qualname, function, reason, part=part)
    if all(state is PatchState.APPLIED for state, _ in states):
        return finding(PatchState.APPLIED, qualname, function, part=part)
    return finding(PatchState.NEEDED, qualname, function, part=part)


# --- rewriting --------------------------------------------------------------


def rewrite(function: libcst.FunctionDef, found: Finding) -> libcst.FunctionDef:
    """Insert the two ``mark_unbacked`` calls before each unmarked call.

    The calls are found again by a LibCST matcher: recognition decided that
    every call is needed or marked; the rewrite marks those not yet marked.
    """
    import libcst
    import libcst.matchers as m

    count_call = m.Call(
        func=m.Name(COUNT_FUNCTION) | m.Attribute(attr=m.Name(COUNT_FUNCTION))
    )

    def mark_name(statement: libcst.BaseStatement) -> str | None:
        found = m.extract(
            statement,
            m.SimpleStatementLine(
                body=[
                    m.Expr(
                        value=m.Call(
                            func=m.Attribute(attr=m.Name("mark_unbacked")),
                            args=[
                                m.Arg(value=m.SaveMatchedNode(m.Name(), "name")),
                                m.Arg(),
                            ],
                        )
                    )
                ]
            ),
        )
        return found["name"].value if found else None

    def whole_value_call(statement: libcst.BaseStatement) -> libcst.Call | None:
        """The count call a statement consists of, as recognition accepts it."""
        match statement:
            case libcst.SimpleStatementLine(
                body=[
                    libcst.Assign(value=libcst.Call() as call)
                    | libcst.AnnAssign(value=libcst.Call() as call)
                    | libcst.Return(value=libcst.Call() as call)
                    | libcst.Expr(value=libcst.Call() as call)
                ]
            ) if m.matches(call, count_call):
                return call
        return None

    class InsertMarks(libcst.CSTTransformer):
        def visit_FunctionDef(self, node: libcst.FunctionDef) -> bool:
            return node is function  # a nested function is a finding of its own

        def visit_ClassDef(self, node: libcst.ClassDef) -> bool:
            return False

        def leave_IndentedBlock(
            self, original: libcst.IndentedBlock, updated: libcst.IndentedBlock
        ) -> libcst.IndentedBlock:
            body: list[libcst.BaseStatement] = []
            for statement in updated.body:
                call = whole_value_call(statement)
                already = bool(body) and mark_name(body[-1]) is not None
                if call is not None and not already:
                    names = [arg.value for arg in call.args]
                    comment = [
                        libcst.EmptyLine(comment=libcst.Comment(text))
                        for text in MARK_COMMENT
                    ]
                    marks = [
                        libcst.parse_statement(f"{MARK_UNBACKED}({name.value}, 0)\n")
                        for name in names
                        if isinstance(name, libcst.Name)
                    ]
                    marks[0] = marks[0].with_changes(
                        leading_lines=[*statement.leading_lines, *comment]
                    )
                    body.extend(marks)
                    statement = statement.with_changes(leading_lines=[])
                body.append(statement)
            return updated.with_changes(body=body)

    return function.visit(InsertMarks())

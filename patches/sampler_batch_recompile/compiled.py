"""vllm#38933, part ``compiled-count``: compile the count once for every batch.

``batched_count_greater_than`` loses ``dynamic=True`` (its other compile
arguments stay) and states its preconditions with
``torch._check(x.shape[0] >= 1)`` and
``torch._check(x.shape[0] == values.shape[0])``, so the compiler can reason
about an unbacked batch size.

Only a function at module level is recognised: a method or a nested
function of that name is reported drifted (a method's first parameter is
``self``, which the checks would test).

Recognised as fixed as well (never rewritten): the function compiled by a
call at module level (``batched_count_greater_than = torch.compile(_impl)``)
without ``dynamic=True``, and the function not compiled at all (a vendor
commented the decorator out), each with both checks.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.syntax import (
    FunctionNode,
    dotted,
    finding,
    matches_code,
    parameter_names,
)

if TYPE_CHECKING:
    import libcst

PART = "compiled-count"
COUNT_FUNCTION = "batched_count_greater_than"
CHECKS = (
    "torch._check({x}.shape[0] >= 1)",
    "torch._check({x}.shape[0] == {values}.shape[0])",
)
EXPECTED = (
    "expected @torch.compile(dynamic=True, ...) and no torch._check (needed), "
    "or @torch.compile(...) without dynamic plus torch._check(x.shape[0] >= 1) "
    "and torch._check(x.shape[0] == values.shape[0]) (applied)"
)

#: ``batched_count_greater_than = <compile>(...)`` at module level, by the
#: name of the function it compiles: the statement and the compile call.
ModuleLevelCompiles = dict[str, tuple[ast.Assign, ast.Call]]


# --- recognition ------------------------------------------------------------


def module_level_compiles(tree: ast.Module) -> ModuleLevelCompiles:
    """``batched_count_greater_than = torch.compile(impl, ...)`` (or
    ``torch.compile(...)(impl)``, or another ``*compile*`` wrapper) at the
    top of the module, by the compiled function's name."""
    found: ModuleLevelCompiles = {}
    for statement in tree.body:
        match statement:
            case ast.Assign(
                targets=[ast.Name(target)],
                value=ast.Call(func=ast.Call() as compile_call, args=[ast.Name(impl)]),
            ) if target == COUNT_FUNCTION and _is_compile(compile_call):
                found[impl] = (statement, compile_call)
            case ast.Assign(
                targets=[ast.Name(target)],
                value=ast.Call(args=[ast.Name(impl), *_]) as compile_call,
            ) if target == COUNT_FUNCTION and _is_compile(compile_call):
                found[impl] = (statement, compile_call)
    return found


def _is_compile(call: ast.Call) -> bool:
    """``torch.compile(...)``, or a wrapper whose name says it compiles."""
    name = dotted(call.func) or ""
    return "compile" in name.rsplit(".", 1)[-1]


def _compile_decorator(function: FunctionNode) -> tuple[int, ast.Call] | None:
    """The ``@torch.compile(...)`` decorator and its index."""
    for index, decorator in enumerate(function.decorator_list):
        match decorator:
            case ast.Call(func=func) if dotted(func) == "torch.compile":
                return index, decorator
    return None


def recognise(
    qualname: str,
    function: FunctionNode,
    compiled_at_module_level: tuple[ast.Assign, ast.Call] | None = None,
) -> Finding:
    """Needed: ``@torch.compile(dynamic=True, ...)`` and no checks; applied:
    compiled without ``dynamic`` (or not at all) and both checks present."""
    params = parameter_names(function)
    if "." in qualname:
        # A method's first parameter is `self`, a nested function's names are
        # its enclosing function's business: the checks would test the wrong
        # thing. Upstream's count is a function of the module.
        return finding(
            PatchState.DRIFTED,
            qualname,
            function,
            f"{qualname} is not a function at module level; {EXPECTED} on a "
            f"module-level def {COUNT_FUNCTION}(x, values)",
            part=PART,
        )
    if compiled_at_module_level is not None:
        return _recognise_compiled_call(qualname, function, *compiled_at_module_level)
    decorator = _compile_decorator(function)
    if decorator is None and not function.decorator_list and _has_checks(function):
        # Not compiled at all (a vendor commented the decorator out): nothing
        # can recompile, and upstream's checks are there.
        return finding(PatchState.APPLIED, qualname, function, part=PART, rewrites=())
    if decorator is None or decorator[1].args or len(params) < 2:
        return finding(
            PatchState.DRIFTED,
            qualname,
            function,
            f"not decorated with torch.compile(...) or fewer than two parameters; "
            f"{EXPECTED}",
            part=PART,
        )
    index, call = decorator
    if _is_dynamic(call) and not _calls_check(function):
        details = {"decorator": index, "parameters": tuple(params[:2])}
        return finding(
            PatchState.NEEDED, qualname, function, part=PART, details=details
        )
    if not _has_dynamic_keyword(call) and _has_checks(function):
        return finding(PatchState.APPLIED, qualname, function, part=PART)
    return finding(PatchState.DRIFTED, qualname, function, EXPECTED, part=PART)


def _recognise_compiled_call(
    qualname: str, function: FunctionNode, statement: ast.Assign, call: ast.Call
) -> Finding:
    """The function compiled by a call at module level: never rewritten."""
    where = [function, statement]
    if not _has_dynamic_keyword(call) and _has_checks(function):
        return finding(PatchState.APPLIED, qualname, where, part=PART, rewrites=())
    return finding(
        PatchState.DRIFTED,
        qualname,
        where,
        f"{COUNT_FUNCTION} is compiled at module level (line {statement.lineno}); "
        "it is fixed when that call has no dynamic argument and the function "
        "has both torch._check calls, and this patch rewrites only the "
        "@torch.compile(dynamic=True, ...) decorator",
        part=PART,
        rewrites=(),
    )


def _has_dynamic_keyword(call: ast.Call) -> bool:
    return any(keyword.arg == "dynamic" for keyword in call.keywords)


def _is_dynamic(call: ast.Call) -> bool:
    for keyword in call.keywords:
        match keyword:
            case ast.keyword(arg="dynamic", value=ast.Constant(value=True)):
                return True
            case ast.keyword(arg="dynamic"):
                return False
    return False


def _calls_check(function: FunctionNode) -> bool:
    return any(
        isinstance(node, ast.Call) and dotted(node.func) == "torch._check"
        for node in ast.walk(function)
    )


def _has_checks(function: FunctionNode) -> bool:
    """Both of upstream's checks, on the function's own parameter names, as
    statements of its body."""
    params = parameter_names(function)
    if len(params) < 2:
        return False
    x, values = params[:2]
    return all(
        any(matches_code(s, check, x=x, values=values) for s in function.body)
        for check in CHECKS
    )


# --- rewriting --------------------------------------------------------------


def rewrite(function: libcst.FunctionDef, found: Finding) -> libcst.FunctionDef:
    """Drop ``dynamic=True`` from the torch.compile decorator recognise found;
    add the two checks on the parameter names it found."""
    import libcst

    decorator = found.details["decorator"]
    decorators = list(function.decorators)
    call = decorators[decorator].decorator
    assert isinstance(call, libcst.Call)
    kept = [a for a in call.args if not (a.keyword and a.keyword.value == "dynamic")]
    if kept:
        # The last argument keeps the original last argument's comma, so
        # a trailing comma (and the line break after it) survives.
        kept[-1] = kept[-1].with_changes(comma=call.args[-1].comma)
    decorators[decorator] = decorators[decorator].with_changes(
        decorator=call.with_changes(args=kept)
    )

    x, values = found.details["parameters"]
    checks = [
        libcst.parse_statement(check.format(x=x, values=values) + "\n")
        for check in CHECKS
    ]
    body = list(function.body.body)
    position = 1 if body and _is_docstring(body[0]) else 0
    # Comments above the first statement stay above the checks.
    if position < len(body):
        first = body[position]
        checks[0] = checks[0].with_changes(leading_lines=first.leading_lines)
        body[position] = first.with_changes(leading_lines=[])
    body[position:position] = checks
    return function.with_changes(
        decorators=decorators, body=function.body.with_changes(body=body)
    )


def _is_docstring(statement: libcst.BaseStatement) -> bool:
    import libcst.matchers as m

    return m.matches(
        statement,
        m.SimpleStatementLine(
            body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())]
        ),
    )

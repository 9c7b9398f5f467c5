"""vllm#38933: the sampler's compiled rank count recompiles when the batch grows.

Symptom: a run stalls for about 205 ms the first time the batch size goes from
1 to 2 or more (common in reinforcement-learning loops that sample one
sequence, then many). ``batched_count_greater_than`` is compiled with
``@torch.compile(dynamic=True, ...)``, but dynamo still specialises sizes 0
and 1: the graph built for a batch of one is only valid for a batch of one, so
the next batch compiles again.

The fix has two halves that only work together:

- ``batched_count_greater_than`` loses ``dynamic=True`` (its other decorator
  arguments stay) and states its preconditions with
  ``torch._check(x.shape[0] >= 1)`` and
  ``torch._check(x.shape[0] == values.shape[0])``, so the compiler can reason
  about an unbacked batch size;
- every caller (``Sampler.gather_logprobs``) marks the batch dimension of both
  tensors with ``torch._dynamo.decorators.mark_unbacked(<tensor>, 0)`` right
  before the call, so dynamo never specialises it.

Upstream: https://github.com/vllm-project/vllm/pull/38933 (first in 0.20.0).

Fix safety: the decorator keeps every argument but ``dynamic``, so only the
batch dimension is symbolic; the other dimension (the vocabulary) becomes
static, as upstream intends. The two ``torch._check`` calls go right after the
docstring and use the function's own parameter names. The two
``mark_unbacked`` calls (with upstream's comment) go right before each call of
``batched_count_greater_than`` whose arguments are plain names; nothing else in
either function changes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import (
    FunctionNode,
    called_name,
    dotted,
    finding,
    iter_functions,
    parameter_names,
    rewrite_definitions,
)

if TYPE_CHECKING:
    import libcst

COUNT_FUNCTION = "batched_count_greater_than"
MARK_UNBACKED = "torch._dynamo.decorators.mark_unbacked"

# The comment upstream puts above the marks: it says why they are there.
MARK_COMMENT = (
    "# Avoid 0/1 specialization recompile on the batch dimension",
    "# of the compiled batched_count_greater_than. mark_unbacked makes",
    "# the size fully symbolic so dynamo doesn't specialize when",
    "# batch_size transitions from 1 to >=2.",
)

COMPILED_BEFORE = '''
@torch.compile(dynamic=True, backend=current_platform.simple_compile_backend)
def batched_count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How many entries of each row of x are >= its value."""
    return (x >= values).sum(-1)
'''

COMPILED_AFTER = '''
@torch.compile(backend=current_platform.simple_compile_backend)
def batched_count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How many entries of each row of x are >= its value."""
    torch._check(x.shape[0] >= 1)
    torch._check(x.shape[0] == values.shape[0])
    return (x >= values).sum(-1)
'''

CALLER_BEFORE = """
class Sampler(nn.Module):
    @staticmethod
    def gather_logprobs(logprobs, num_logprobs, token_ids):
        token_logprobs = logprobs.gather(-1, token_ids.unsqueeze(-1))

        # Rank of the chosen token.
        token_ranks = batched_count_greater_than(logprobs, token_logprobs)
        return token_logprobs, token_ranks
"""

CALLER_AFTER = """
class Sampler(nn.Module):
    @staticmethod
    def gather_logprobs(logprobs, num_logprobs, token_ids):
        token_logprobs = logprobs.gather(-1, token_ids.unsqueeze(-1))

        # Rank of the chosen token.
        # Avoid 0/1 specialization recompile on the batch dimension
        # of the compiled batched_count_greater_than. mark_unbacked makes
        # the size fully symbolic so dynamo doesn't specialize when
        # batch_size transitions from 1 to >=2.
        torch._dynamo.decorators.mark_unbacked(logprobs, 0)
        torch._dynamo.decorators.mark_unbacked(token_logprobs, 0)
        token_ranks = batched_count_greater_than(logprobs, token_logprobs)
        return token_logprobs, token_ranks
"""

# A vendor renamed the parameters, added a decorator argument and split the
# decorator over lines: the checks use the names the function has, and the
# other arguments stay as they are.
RENAMED_COMPILED_BEFORE = '''
@torch.compile(
    fullgraph=True,
    dynamic=True,
    backend="inductor",
)
def batched_count_greater_than(scores, thresholds):
    """Count per row."""
    counts = (scores >= thresholds).sum(-1)
    return counts
'''

RENAMED_COMPILED_AFTER = '''
@torch.compile(
    fullgraph=True,
    backend="inductor",
)
def batched_count_greater_than(scores, thresholds):
    """Count per row."""
    torch._check(scores.shape[0] >= 1)
    torch._check(scores.shape[0] == thresholds.shape[0])
    counts = (scores >= thresholds).sum(-1)
    return counts
'''

# The call sits inside a `with` block and the locals have other names.
NESTED_CALLER_BEFORE = """
class Sampler:
    def gather_logprobs(self, lp, k, ids):
        chosen = lp.gather(-1, ids)
        with record_function("ranks"):
            ranks = batched_count_greater_than(lp, chosen)  # per row
        return ranks
"""

NESTED_CALLER_AFTER = """
class Sampler:
    def gather_logprobs(self, lp, k, ids):
        chosen = lp.gather(-1, ids)
        with record_function("ranks"):
            # Avoid 0/1 specialization recompile on the batch dimension
            # of the compiled batched_count_greater_than. mark_unbacked makes
            # the size fully symbolic so dynamo doesn't specialize when
            # batch_size transitions from 1 to >=2.
            torch._dynamo.decorators.mark_unbacked(lp, 0)
            torch._dynamo.decorators.mark_unbacked(chosen, 0)
            ranks = batched_count_greater_than(lp, chosen)  # per row
        return ranks
"""

# Half a fix: only one of the two tensors is marked.
HALF_MARKED = """
class Sampler:
    def gather_logprobs(self, logprobs, k, ids):
        chosen = logprobs.gather(-1, ids)
        torch._dynamo.decorators.mark_unbacked(logprobs, 0)
        return batched_count_greater_than(logprobs, chosen)
"""

# dynamic=True dropped without the checks: not upstream's shape, not the bug's.
UNCHECKED_STATIC = '''
@torch.compile(backend="inductor")
def batched_count_greater_than(x, values):
    """Count per row."""
    return (x >= values).sum(-1)
'''

# The argument is an expression: there is no tensor name to mark.
EXPRESSION_ARGUMENT = """
class Sampler:
    def gather_logprobs(self, logprobs, k, ids):
        return batched_count_greater_than(logprobs, logprobs.gather(-1, ids))
"""


class SamplerBatchRecompile(Patch):
    id = "vllm#38933"
    title = "Sampler: no recompile of batched_count_greater_than when batch size grows"
    upstream_url = "https://github.com/vllm-project/vllm/pull/38933"
    fixed_in = "0.20.0"
    symptom = (
        "a ~205 ms stall when the batch size first goes from 1 to >=2: the "
        "compiled batched_count_greater_than specialises on sizes 0/1 and "
        "recompiles"
    )
    also_changes = (
        "torch.compile loses dynamic=True (only the batch dimension stays "
        "symbolic, via mark_unbacked); two torch._check preconditions are "
        "added; callers gain two mark_unbacked calls before the call."
    )
    paths = ("vllm/v1/sample/**/*.py",)
    markers = (COUNT_FUNCTION.encode(),)
    parts = {
        "compiled-count": (
            "torch.compile'd batched_count_greater_than(x, values) "
            "(vllm/v1/sample/ops/logprobs.py)"
        ),
        "callers-mark-unbacked": (
            "caller of batched_count_greater_than such as Sampler.gather_logprobs "
            "(vllm/v1/sample/sampler.py)"
        ),
    }
    examples = (
        Example(
            "compiled count, upstream 0.19.x shape", COMPILED_BEFORE, COMPILED_AFTER
        ),
        Example("gather_logprobs, upstream 0.19.x shape", CALLER_BEFORE, CALLER_AFTER),
        Example(
            "renamed parameters, more decorator arguments over several lines",
            RENAMED_COMPILED_BEFORE,
            RENAMED_COMPILED_AFTER,
        ),
        Example(
            "call inside a with block, other local names",
            NESTED_CALLER_BEFORE,
            NESTED_CALLER_AFTER,
        ),
        Example(
            "compiled count already fixed (0.20.0)",
            COMPILED_AFTER,
            state=PatchState.APPLIED,
        ),
        Example(
            "caller already marks (0.20.0)", CALLER_AFTER, state=PatchState.APPLIED
        ),
        Example("only one tensor marked", HALF_MARKED, state=PatchState.DRIFTED),
        Example(
            "dynamic=True gone but no checks",
            UNCHECKED_STATIC,
            state=PatchState.DRIFTED,
        ),
        Example(
            "argument is an expression", EXPRESSION_ARGUMENT, state=PatchState.DRIFTED
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        findings = []
        for qualname, function in iter_functions(tree):
            if function.name == COUNT_FUNCTION:
                findings.append(_recognise_compiled(qualname, function))
            elif _count_calls(function):
                findings.append(_recognise_caller(qualname, function))
        return findings

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        rewriters = {}
        for found in needed:
            if found.part == "compiled-count":
                rewriters[found.symbol] = _fix_compiled
            else:
                rewriters[found.symbol] = _mark_before_calls
        return rewrite_definitions(module, rewriters)

    def prove(self, tree: Path) -> None:
        _prove_single_compile()


# --- recognition ------------------------------------------------------------


def _compile_decorator(function: FunctionNode) -> ast.Call | None:
    for decorator in function.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and dotted(decorator.func) == "torch.compile"
        ):
            return decorator
    return None


def _check_statements(x: str, values: str) -> list[str]:
    return [
        f"torch._check({x}.shape[0] >= 1)",
        f"torch._check({x}.shape[0] == {values}.shape[0])",
    ]


def _recognise_compiled(qualname: str, function: FunctionNode) -> Finding:
    part = "compiled-count"
    expected = (
        "expected @torch.compile(dynamic=True, ...) and no torch._check (needed), "
        "or @torch.compile(...) without dynamic plus torch._check(x.shape[0] >= 1) "
        "and torch._check(x.shape[0] == values.shape[0]) (applied)"
    )
    decorator = _compile_decorator(function)
    params = parameter_names(function)
    if decorator is None or decorator.args or len(params) < 2:
        return finding(
            PatchState.DRIFTED,
            qualname,
            function,
            f"not decorated with torch.compile(...) or fewer than two parameters; "
            f"{expected}",
            part=part,
        )
    dynamic = [k for k in decorator.keywords if k.arg == "dynamic"]
    dynamic_true = (
        bool(dynamic)
        and isinstance(dynamic[0].value, ast.Constant)
        and (dynamic[0].value.value is True)
    )
    wanted = {
        ast.dump(ast.parse(code).body[0]) for code in _check_statements(*params[:2])
    }
    present = {ast.dump(s) for s in function.body} & wanted
    checks_anywhere = any(
        isinstance(node, ast.Call) and dotted(node.func) == "torch._check"
        for node in ast.walk(function)
    )
    if dynamic_true and not checks_anywhere:
        return finding(PatchState.NEEDED, qualname, function, part=part)
    if not dynamic and present == wanted:
        return finding(PatchState.APPLIED, qualname, function, part=part)
    return finding(PatchState.DRIFTED, qualname, function, expected, part=part)


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


def _count_calls(function: FunctionNode) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and called_name(node) == COUNT_FUNCTION
    ]


def _is_mark(statement: ast.stmt) -> str | None:
    """The tensor name of ``torch._dynamo.decorators.mark_unbacked(<name>, 0)``."""
    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
        return None
    call = statement.value
    if (
        dotted(call.func) == MARK_UNBACKED
        and len(call.args) == 2
        and not call.keywords
        and isinstance(call.args[0], ast.Name)
        and isinstance(call.args[1], ast.Constant)
        and call.args[1].value == 0
    ):
        return call.args[0].id
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
            for call in _count_calls(statement):
                placed.add(id(call))
                states.append(_call_state(call, block[:index]))
    for call in _count_calls(function):
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


def _recognise_caller(qualname: str, function: FunctionNode) -> Finding:
    part = "callers-mark-unbacked"
    states = _call_states(function)
    drifted = [reason for state, reason in states if state is PatchState.DRIFTED]
    if drifted:
        reason = "; ".join(drifted)
        return finding(PatchState.DRIFTED, qualname, function, reason, part=part)
    if all(state is PatchState.APPLIED for state, _ in states):
        return finding(PatchState.APPLIED, qualname, function, part=part)
    return finding(PatchState.NEEDED, qualname, function, part=part)


# --- rewriting --------------------------------------------------------------


def _fix_compiled(function: libcst.FunctionDef) -> libcst.FunctionDef:
    """Drop ``dynamic=True`` from torch.compile; add the two checks."""
    import libcst
    import libcst.matchers as m

    decorators = []
    for decorator in function.decorators:
        call = decorator.decorator
        if m.matches(
            call,
            m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("compile"))),
        ):
            assert isinstance(call, libcst.Call)
            kept = [
                a for a in call.args if not (a.keyword and a.keyword.value == "dynamic")
            ]
            if kept:
                # The last argument keeps the original last argument's comma, so
                # a trailing comma (and the line break after it) survives.
                kept[-1] = kept[-1].with_changes(comma=call.args[-1].comma)
            decorator = decorator.with_changes(decorator=call.with_changes(args=kept))
        decorators.append(decorator)

    params = [p.name.value for p in function.params.params]
    params = [*(p.name.value for p in function.params.posonly_params), *params]
    checks = [
        libcst.parse_statement(code + "\n") for code in _check_statements(*params[:2])
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


def _mark_before_calls(function: libcst.FunctionDef) -> libcst.FunctionDef:
    """Insert the two ``mark_unbacked`` calls before each unmarked call."""
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

    class InsertMarks(libcst.CSTTransformer):
        def leave_IndentedBlock(
            self, original: libcst.IndentedBlock, updated: libcst.IndentedBlock
        ) -> libcst.IndentedBlock:
            body: list[libcst.BaseStatement] = []
            for statement in updated.body:
                calls = (
                    m.findall(statement, count_call)
                    if isinstance(statement, libcst.SimpleStatementLine)
                    else []
                )
                already = bool(body) and mark_name(body[-1]) is not None
                if calls and not already:
                    call = calls[0]
                    assert isinstance(call, libcst.Call)
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


# --- proof ------------------------------------------------------------------


def _prove_single_compile() -> None:
    """Count the graph builds of the tree's own compiled function.

    The module defining ``batched_count_greater_than`` is executed again with
    ``torch.compile`` swapped for a wrapper that keeps every argument the
    tree's decorator passes (``dynamic`` above all) but compiles through a
    counting backend. ``Sampler.gather_logprobs`` then runs for batch sizes
    1, 2 and 8. Each half of the fix shows in what the backend sees: without
    ``mark_unbacked`` a second graph is built for batch 2; with
    ``dynamic=True`` the vocabulary dimension is symbolic too; without
    ``torch._check(x.shape[0] >= 1)`` the batch size's lower bound is 0.
    """
    import importlib

    import torch
    import vllm.v1.sample.ops.logprobs as logprobs_module
    import vllm.v1.sample.sampler as sampler_module

    graphs: list[tuple[object, object, int]] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        tensors = [
            n.meta.get("example_value")
            for n in gm.graph.nodes
            if n.op == "placeholder"
            and isinstance(n.meta.get("example_value"), torch.Tensor)
        ]
        x = tensors[0]
        batch, vocab = x.shape[0], x.shape[1]
        lower = 0
        if isinstance(batch, torch.SymInt):
            shape_env = batch.node.shape_env
            lower = int(shape_env.bound_sympy(batch.node.expr).lower)
        else:
            lower = int(batch)
        graphs.append((batch, vocab, lower))
        return gm.forward

    real_compile = torch.compile

    def compile_with_counter(*args: object, **kwargs: object) -> object:
        kwargs["backend"] = counting_backend
        return real_compile(*args, **kwargs)

    original = sampler_module.__dict__.get(COUNT_FUNCTION)
    torch._dynamo.reset()
    torch.compile = compile_with_counter
    try:
        importlib.reload(logprobs_module)
    finally:
        torch.compile = real_compile
    sampler_module.__dict__[COUNT_FUNCTION] = getattr(logprobs_module, COUNT_FUNCTION)
    try:
        vocab_size, num_logprobs = 32, 3
        for batch_size in (1, 2, 8):
            logprobs = torch.randn(batch_size, vocab_size)
            token_ids = torch.randint(0, vocab_size, (batch_size,), dtype=torch.int64)
            result = sampler_module.Sampler.gather_logprobs(
                logprobs, num_logprobs, token_ids
            )
            expected = (logprobs >= logprobs.gather(-1, token_ids.unsqueeze(-1))).sum(
                -1
            )
            assert torch.equal(result.selected_token_ranks, expected), (
                f"wrong token ranks for batch size {batch_size}"
            )
    finally:
        sampler_module.__dict__[COUNT_FUNCTION] = original
        importlib.reload(logprobs_module)
        torch._dynamo.reset()

    problems = []
    if len(graphs) != 1:
        problems.append(
            f"{COUNT_FUNCTION} was compiled {len(graphs)} times for batch sizes "
            "1, 2, 8 (expected once: the batch dimension is not marked unbacked, "
            "so dynamo specialises batch size 1 and recompiles)"
        )
    if graphs:
        batch, vocab, lower = graphs[0]
        if not isinstance(batch, torch.SymInt):
            problems.append(f"the first graph has a static batch size {batch}")
        if isinstance(vocab, torch.SymInt):
            problems.append(
                "the vocabulary dimension is symbolic (torch.compile still has "
                "dynamic=True)"
            )
        if isinstance(batch, torch.SymInt) and lower < 1:
            problems.append(
                f"the batch size's lower bound is {lower}, not 1 "
                "(torch._check(x.shape[0] >= 1) is missing)"
            )
    assert not problems, "vllm#38933 not in effect: " + "; ".join(problems)


PATCH = SamplerBatchRecompile()

"""vllm#38933: the sampler's compiled rank count recompiles when the batch grows.

Symptom: a ~205 ms stall when the batch size first goes from 1 to >=2: the
compiled batched_count_greater_than specialises on sizes 0/1 and recompiles

Why: reinforcement-learning loops often sample one sequence, then many.
``batched_count_greater_than`` is compiled with
``@torch.compile(dynamic=True, ...)``, but dynamo still specialises sizes 0
and 1: the graph built for a batch of one is only valid for a batch of one, so
the next batch compiles again.

The fix has two halves that only work together, one part each:
``compiled-count`` (``compiled.py``: the compiled function loses
``dynamic=True`` and states its preconditions with ``torch._check``) and
``callers-mark-unbacked`` (``callers.py``: every caller marks the batch
dimension of both tensors unbacked right before the call).

Upstream: https://github.com/vllm-project/vllm/pull/38933 (first in 0.20.0).

Fix safety: torch.compile loses dynamic=True (only the batch dimension stays
symbolic, via mark_unbacked); two torch._check preconditions are added;
callers gain two mark_unbacked calls before the call.

The decorator keeps every argument but ``dynamic``, so only the batch
dimension is symbolic; the other dimension (the vocabulary) becomes static, as
upstream intends. The two ``torch._check`` calls go right after the docstring
and use the function's own parameter names. The two ``mark_unbacked`` calls
(with upstream's comment) go right before each call of
``batched_count_greater_than`` whose arguments are plain names; nothing else in
either function changes.

Recognised: the count as a function at module level (a method or a nested
function of that name is drifted), and each call as the whole value of an
assignment, ``return`` or expression statement. A call inside a
comprehension, a lambda, a conditional expression or any other expression is
drifted: marks before that statement are not known to mark the tensors the
call gets.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import iter_functions, rewrite_definitions

from . import callers, compiled
from .compiled import COUNT_FUNCTION

if TYPE_CHECKING:
    import libcst

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


# Issue 12: shapes that are fixed already, another way than upstream's.
# A vendor compiles the count by a call at module level, without dynamic=True,
# and has both checks.
COMPILED_BY_CALL = '''
def _batched_count_greater_than(x, values):
    """Count per row."""
    torch._check(x.shape[0] >= 1)
    torch._check(x.shape[0] == values.shape[0])
    return (x >= values).sum(-1)


batched_count_greater_than = torch.compile(
    _batched_count_greater_than, backend=current_platform.simple_compile_backend
)
'''

# A vendor commented the decorator out (nothing compiles, nothing recompiles)
# and kept upstream's checks.
DECORATOR_COMMENTED_OUT = '''
# @torch.compile(dynamic=True, backend=current_platform.simple_compile_backend)
def batched_count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How many entries of each row of x are >= its value."""
    torch._check(x.shape[0] >= 1)
    torch._check(x.shape[0] == values.shape[0])
    return (x >= values).sum(-1)
'''

# Compiled by a call with dynamic=True: the bug, in a shape this patch does not
# rewrite.
COMPILED_BY_CALL_DYNAMIC = """
def _count(x, values):
    return (x >= values).sum(-1)


batched_count_greater_than = torch.compile(_count, dynamic=True)
"""


# A method of that name: its first parameter is `self`, so the checks would
# read `self.shape[0]`. Only the module's function is the count.
COUNT_AS_METHOD = """
class Ops:
    @torch.compile(dynamic=True)
    def batched_count_greater_than(self, x, values):
        return (x >= values).sum(-1)
"""

# Calls whose tensors are not the names in scope right before the statement
# (a comprehension's or a lambda's own names), or that are only part of what
# the statement computes: marks before the statement are not known to mark
# what the call gets.
CALL_IN_COMPREHENSION = """
class Sampler:
    def gather_logprobs(self, logprobs, k, ids):
        chosen = logprobs.gather(-1, ids)
        return [batched_count_greater_than(row, v) for row, v in zip(logprobs, chosen)]
"""

CALL_IN_LAMBDA = """
class Sampler:
    def gather_logprobs(self, logprobs, k, ids):
        chosen = logprobs.gather(-1, ids)
        rank = lambda logprobs: batched_count_greater_than(logprobs, chosen)
        return rank(logprobs)
"""

CALL_UNDER_CONDITION = """
class Sampler:
    def gather_logprobs(self, logprobs, k, ids):
        chosen = logprobs.gather(-1, ids)
        ranks = batched_count_greater_than(logprobs, chosen) if k else None
        return ranks
"""


class SamplerBatchRecompile(Patch):
    id = "vllm#38933"
    title = "Sampler: no recompile of batched_count_greater_than when batch size grows"
    upstream_url = "https://github.com/vllm-project/vllm/pull/38933"
    fixed_in = "0.20.0"
    # The module docstring (the class has none) is the one source of both.
    symptom = section(__doc__, "Symptom")
    also_changes = section(__doc__, "Fix safety")
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
        Example(
            "compiled by a call at module level, with the checks (vendor)",
            COMPILED_BY_CALL,
            state=PatchState.APPLIED,
        ),
        Example(
            "decorator commented out, checks kept (vendor)",
            DECORATOR_COMMENTED_OUT,
            state=PatchState.APPLIED,
        ),
        Example(
            "compiled by a call at module level with dynamic=True",
            COMPILED_BY_CALL_DYNAMIC,
            state=PatchState.DRIFTED,
        ),
        Example("a method of that name", COUNT_AS_METHOD, state=PatchState.DRIFTED),
        Example(
            "call in a comprehension", CALL_IN_COMPREHENSION, state=PatchState.DRIFTED
        ),
        Example("call in a lambda", CALL_IN_LAMBDA, state=PatchState.DRIFTED),
        Example(
            "call under a condition", CALL_UNDER_CONDITION, state=PatchState.DRIFTED
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        compiled_by_call = compiled.module_level_compiles(tree)
        findings = []
        for qualname, function in iter_functions(tree):
            if function.name == COUNT_FUNCTION or qualname in compiled_by_call:
                found = compiled.recognise(
                    qualname, function, compiled_by_call.get(qualname)
                )
                findings.append(found)
            elif callers.count_calls(function):
                findings.append(callers.recognise(qualname, function))
        return findings

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        rewrites = {compiled.PART: compiled.rewrite, callers.PART: callers.rewrite}
        return rewrite_definitions(
            module,
            {f.symbol: functools.partial(rewrites[f.part], found=f) for f in needed},
        )

    def prove(self, tree: Path) -> None:
        from .proof import prove_single_compile

        prove_single_compile()


PATCH = SamplerBatchRecompile()

"""vllm#40932: Qwen3-VL deepstack bounds checks crash padded steps.

Symptom: ValueError: Requested more deepstack tokens than available in buffer
(or: Requested to clear more deepstack tokens ...) on Qwen3-VL / Qwen3-Omni
when the step's token count is padded, e.g. under sequence parallelism

Why: vllm#40145 (0.20.0 and 0.20.1) added a token counter to the deepstack
buffers and two bounds checks against it: ``_get_deepstack_input_embeds`` and
``_clear_deepstack_input_embeds`` raise when a step asks for more rows than
the encoder stored. A step asks for more whenever its token count is padded,
as sequence parallelism and CUDA-graph batch sizes pad it, so correct
requests crash. The buffers are allocated for the padded size and rows past
the stored ones are zeros, so the fix removes both checks (upstream did the
same in 0.20.2).

Fix safety: Deletes the two ``if num_tokens >
self.deepstack_input_embeds_num_tokens: raise ValueError(...)`` statements and
comment lines directly above them; nothing else.

A check is dropped only where upstream has it: a statement of the method's
body, or of an ``if`` body in it. The same check anywhere else (inside a
``try``, an ``else``/``elif`` branch, a loop, a ``with`` block or a nested
function) is reported drifted, naming what holds it, and so is any other
``raise`` in those methods (a vendor's own check). Releases before 0.20.0
have no counter and never had the checks: the patch does not apply to them.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import FunctionNode, finding, rewrite_definitions

from .._deepstack_buffer import (
    CLEAR,
    GET,
    MARKERS,
    MODEL_PATHS,
    NOT_PRESENT,
    deepstack_classes,
    has_counter,
    is_bounds_check,
    token_parameter,
)

if TYPE_CHECKING:
    import libcst

BEFORE = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens: int):
        if not getattr(self, "deepstack_input_embeds", None):
            return None
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None
        if num_tokens > self.deepstack_input_embeds_num_tokens:
            raise ValueError("more deepstack rows asked for than stored")

        return IntermediateTensors(
            {
                f"ds_{i}": b[:num_tokens]
                for i, b in enumerate(self.deepstack_input_embeds)
            }
        )

    def _clear_deepstack_input_embeds(self, num_tokens: int) -> None:
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return
        if num_tokens > 0:
            if num_tokens > self.deepstack_input_embeds_num_tokens:
                raise ValueError("more deepstack rows to clear than stored")
            for b in self.deepstack_input_embeds:
                b[:num_tokens].zero_()
            self.deepstack_input_embeds_num_tokens = 0
"""

AFTER = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens: int):
        if not getattr(self, "deepstack_input_embeds", None):
            return None
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None

        return IntermediateTensors(
            {
                f"ds_{i}": b[:num_tokens]
                for i, b in enumerate(self.deepstack_input_embeds)
            }
        )

    def _clear_deepstack_input_embeds(self, num_tokens: int) -> None:
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return
        if num_tokens > 0:
            for b in self.deepstack_input_embeds:
                b[:num_tokens].zero_()
            self.deepstack_input_embeds_num_tokens = 0
"""

# A vendor renamed the parameter, reads the counter with a plain attribute,
# and commented the check: the comment goes with the check, others stay.
RENAMED_BEFORE = """
class VendorModel:
    def _get_deepstack_input_embeds(self, n):  # rows of this step
        if not self.deepstack_input_embeds_num_tokens:
            return None
        # guard against reading stale rows
        if n > self.deepstack_input_embeds_num_tokens:
            raise RuntimeError(f"{n=}")
        # rows past the stored ones are zeros
        return IntermediateTensors({"ds_0": self.deepstack_input_embeds[0][:n]})
"""

RENAMED_AFTER = """
class VendorModel:
    def _get_deepstack_input_embeds(self, n):  # rows of this step
        if not self.deepstack_input_embeds_num_tokens:
            return None
        # rows past the stored ones are zeros
        return IntermediateTensors({"ds_0": self.deepstack_input_embeds[0][:n]})
"""

# Before vllm#40145 (0.19.x and older): no counter, so no check to remove.
NO_COUNTER = """
class TinyDeepstackModel(nn.Module):
    def _get_deepstack_input_embeds(self, num_tokens: int):
        if not getattr(self, "deepstack_input_embeds", None):
            return None
        return IntermediateTensors(
            {
                f"ds_{i}": b[:num_tokens]
                for i, b in enumerate(self.deepstack_input_embeds)
            }
        )

    def _clear_deepstack_input_embeds(self, num_tokens: int) -> None:
        for b in self.deepstack_input_embeds:
            b[:num_tokens].zero_()
"""

# The check logs before it raises: not the check this fix knows how to drop.
LOGGING_CHECK = """
class VendorModel:
    def _get_deepstack_input_embeds(self, num_tokens):
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None
        if num_tokens > self.deepstack_input_embeds_num_tokens:
            logger.error("deepstack buffer underrun")
            raise ValueError(num_tokens)
        rows = self.deepstack_input_embeds[0][:num_tokens]
        return IntermediateTensors({"ds_0": rows})
"""

# A bound other than the token counter.
OTHER_BOUND = """
class VendorModel:
    def _get_deepstack_input_embeds(self, num_tokens):
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None
        if num_tokens > self.max_deepstack_rows:
            raise ValueError(num_tokens)
        rows = self.deepstack_input_embeds[0][:num_tokens]
        return IntermediateTensors({"ds_0": rows})
"""


# The check where upstream never had it: inside a `try` whose handler catches
# its error (dropping it changes what the handler does), or inside a function
# nested in the method (which the rewrite does not enter).
CHECK_IN_TRY = """
class VendorModel:
    def _get_deepstack_input_embeds(self, num_tokens):
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None
        try:
            if num_tokens > self.deepstack_input_embeds_num_tokens:
                raise ValueError(num_tokens)
            rows = self.deepstack_input_embeds[0][:num_tokens]
        except ValueError:
            return None
        return IntermediateTensors({"ds_0": rows})
"""

CHECK_IN_NESTED_FUNCTION = """
class VendorModel:
    def _get_deepstack_input_embeds(self, num_tokens):
        if getattr(self, "deepstack_input_embeds_num_tokens", 0) == 0:
            return None

        def rows(num_tokens):
            if num_tokens > self.deepstack_input_embeds_num_tokens:
                raise ValueError(num_tokens)
            return self.deepstack_input_embeds[0][:num_tokens]

        return IntermediateTensors({"ds_0": rows(num_tokens)})
"""


class Qwen3VLDeepstackBoundsCheck(Patch):
    id = "vllm#40932"
    title = "Qwen3-VL deepstack: drop the bounds checks that reject padded steps"
    upstream_url = "https://github.com/vllm-project/vllm/pull/40932"
    fixed_in = "0.20.2"
    # The module docstring (the class has none) is the one source of both.
    symptom = section(__doc__, "Symptom")
    also_changes = section(__doc__, "Fix safety")
    paths = MODEL_PATHS
    markers = MARKERS
    parts = {"": "class defining _get_deepstack_input_embeds"}
    examples = (
        Example("upstream 0.20.0 shape", BEFORE, AFTER),
        Example("renamed parameter, comments", RENAMED_BEFORE, RENAMED_AFTER),
        Example("checks removed (upstream 0.20.2)", AFTER, state=PatchState.APPLIED),
        Example(
            "no token counter (0.19.x)", NO_COUNTER, state=PatchState.NOT_APPLICABLE
        ),
        Example("check that also logs", LOGGING_CHECK, state=PatchState.DRIFTED),
        Example("bound other than the counter", OTHER_BOUND, state=PatchState.DRIFTED),
        Example("check inside a try", CHECK_IN_TRY, state=PatchState.DRIFTED),
        Example(
            "check in a nested function",
            CHECK_IN_NESTED_FUNCTION,
            state=PatchState.DRIFTED,
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        return [
            self._recognise_class(qualname, cls, methods)
            for qualname, cls, methods in deepstack_classes(tree)
        ]

    def _recognise_class(
        self, qualname: str, cls: ast.ClassDef, methods: dict[str, FunctionNode]
    ) -> Finding:
        targets = [methods[name] for name in (GET, CLEAR) if name in methods]
        # What the rewrite needs: in each method, which of its `if` statements
        # (counted in source order) are the checks.
        placed = {id(check) for m in targets for check in placed_checks(m)}
        checks_at = {
            f"{qualname}.{m.name}": tuple(
                index
                for index, statement in enumerate(if_statements(m))
                if id(statement) in placed
            )
            for m in targets
        }

        def result(state: PatchState, reason: str = "") -> Finding:
            fixed = tuple(checks_at) if state is not PatchState.NOT_APPLICABLE else ()
            return finding(
                state,
                f"{qualname}.{GET}",
                [methods[GET], *(m for m in targets if m is not methods[GET])],
                reason,
                rewrites=fixed,
                details={"checks": checks_at},
            )

        checks = 0
        for method in targets:
            parameter = token_parameter(method)
            known = placed_checks(method)
            misplaced = misplaced_checks(method)
            if misplaced:
                check, holder = misplaced[0]
                return result(
                    PatchState.DRIFTED,
                    f"the bounds check at line {check.lineno} sits in {holder}; "
                    f"expected it directly in {method.name} or in the body of "
                    "an `if` there",
                )
            known_raises = {id(check.body[0]) for check in known}
            for node in ast.walk(method):
                if isinstance(node, ast.Raise) and id(node) not in known_raises:
                    return result(
                        PatchState.DRIFTED,
                        f"{method.name} raises at line {node.lineno} in a way this "
                        f"patch does not know; expected only `if {parameter} > "
                        "self.deepstack_input_embeds_num_tokens: raise ...` "
                        "(needed) or no raise (applied)",
                    )
            for check in known:
                if _only_statement(method, check):
                    return result(
                        PatchState.DRIFTED,
                        f"the bounds check at line {check.lineno} is the only "
                        "statement of its block; removing it leaves no code",
                    )
            checks += len(known)
        if checks:
            return result(PatchState.NEEDED)
        if not has_counter(cls):
            return result(PatchState.NOT_APPLICABLE, NOT_PRESENT)
        return result(PatchState.APPLIED)

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        checks_at = {
            method: checks
            for found in needed
            for method, checks in found.details["checks"].items()
        }
        removed: list[int] = []
        result = rewrite_definitions(
            module,
            {
                method: _bounds_check_dropper(checks, removed)
                for method, checks in checks_at.items()
            },
        )
        if not removed:
            raise LookupError(
                f"no bounds check found in {', '.join(sorted(checks_at))}"
            )
        return result

    def prove(self, tree: Path) -> None:
        from .proof import prove_padded_steps

        prove_padded_steps(tree)


def placed_checks(method: FunctionNode) -> list[ast.If]:
    """The bounds checks of ``method`` where upstream has them: statements of
    its body, or of an ``if`` body in it (``_clear_``'s ``if num_tokens > 0``).
    Only there is dropping the check known to leave the rest as it was."""
    parameter = token_parameter(method)
    found: list[ast.If] = []

    def visit(block: list[ast.stmt]) -> None:
        for statement in block:
            if is_bounds_check(statement, parameter):
                found.append(statement)  # type: ignore[arg-type]
            elif isinstance(statement, ast.If):
                visit(statement.body)

    visit(method.body)
    return found


#: How a message names what holds a check elsewhere.
HOLDERS = {
    ast.Try: "a `try` statement",
    ast.If: "an `else` or `elif` branch",
    ast.For: "a loop",
    ast.While: "a loop",
    ast.With: "a `with` block",
    ast.FunctionDef: "a nested function",
    ast.AsyncFunctionDef: "a nested function",
}


def misplaced_checks(method: FunctionNode) -> list[tuple[ast.If, str]]:
    """Bounds checks anywhere else in ``method``, with what holds each."""
    parameter = token_parameter(method)
    placed = {id(check) for check in placed_checks(method)}
    found = []
    for holder in ast.walk(method):
        for child in ast.iter_child_nodes(holder):
            if is_bounds_check(child, parameter) and id(child) not in placed:
                name = HOLDERS.get(type(holder), f"a {type(holder).__name__}")
                found.append((child, name))  # type: ignore[arg-type]
    return found


def if_statements(function: FunctionNode) -> list[ast.If]:
    """The ``if`` statements of ``function`` in source order (``elif`` too), not
    those of functions nested in it: the order LibCST visits them in."""
    found: list[ast.If] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(child, ast.If):
                found.append(child)
            visit(child)

    visit(function)
    return found


def _bounds_check_dropper(
    checks: Sequence[int], removed: list[int]
) -> Callable[[Any], Any]:
    """A rewriter of one method: its ``if`` statements at ``checks`` (source
    order, as :func:`if_statements` counts them) go."""
    import libcst

    class DropBoundsChecks(libcst.CSTTransformer):
        def __init__(self) -> None:
            self.depth = 0
            self.ifs = 0
            self.dropped: list[libcst.If] = []

        def visit_FunctionDef(self, node: libcst.FunctionDef) -> bool:
            # The method itself, not functions nested in it.
            self.depth += 1
            return self.depth == 1

        def leave_FunctionDef(
            self, original: libcst.FunctionDef, updated: libcst.FunctionDef
        ) -> libcst.FunctionDef:
            self.depth -= 1
            return updated

        def visit_If(self, node: libcst.If) -> None:
            if self.ifs in checks:
                self.dropped.append(node)
            self.ifs += 1

        def leave_IndentedBlock(
            self, original: libcst.IndentedBlock, updated: libcst.IndentedBlock
        ) -> libcst.IndentedBlock:
            body = []
            for old, statement in zip(original.body, updated.body, strict=True):
                if any(old is check for check in self.dropped):
                    removed.append(1)
                    continue
                body.append(statement)
            return updated.with_changes(body=body)

    return lambda function: function.visit(DropBoundsChecks())


def _only_statement(function: FunctionNode, statement: ast.stmt) -> bool:
    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and statement in block:
                return len(block) == 1
    return False


PATCH = Qwen3VLDeepstackBoundsCheck()

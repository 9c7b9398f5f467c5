"""Moved code: a function or method of a fix, absent under its qualified
name, looked for among the file's other functions of that name.

Upstream moves methods between classes (vllm#46168's ``load_weights`` went
from ``DeepseekV2ForCausalLM`` to ``DeepseekV2Model``), and a release older
than the move has the code the fix changes under the other name. Where a
unit's definition is absent, each other function of the file with its name
(a method of another class, a module-level function) is tried in its place
(:func:`candidates`, :func:`relocated`); recognition then runs as it
always does, so every statement the fix must find is still found exactly
once, where it expects it. Where exactly one of them holds the fix's
statements (needed or applied there), the fix is carried there and the
report says so (``found as `DeepseekV2ForCausalLM.load_weights```); where
several do, the unit drifts naming them. And where the statements the fix
removes are anywhere in the file (:func:`removed_at`), the unit is never
``not-applicable``: it drifts, saying where they are.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from deepstack_patch.engine.derived import shapes
from deepstack_patch.engine.derived.data import Edit, Step, Unit
from deepstack_patch.engine.derived.match import (
    CompiledEdit,
    ShapeCache,
    occurrences,
    one_statement,
    with_block,
)
from deepstack_patch.engine.protocol import PatchState

#: The key of a finding's details that names where the unit was found.
FOUND_AS = "found_as"


class _State(Protocol):
    state: PatchState
    reason: str
    details: dict[str, Any]
    line: int


State = TypeVar("State", bound=_State)


class _Found(Protocol):
    @property
    def details(self) -> Mapping[str, Any]: ...


def found_elsewhere(
    unit: Unit,
    tree: ast.Module,
    state_of: Callable[[Unit], State | None],
    excluded: frozenset[str] = frozenset(),
) -> State | None:
    """The unit's state where exactly one other function of its name holds
    its fix (needed or applied there: ``state_of`` the unit relocated
    there), with a reason and a detail naming it; drifted, naming them,
    where several do; None where none does. The functions named in
    ``excluded`` (the patch's other units, and where they were found) are
    never its place: a fix is never made twice in one function."""
    holding = []
    for qualified, _ in candidates(tree, unit):
        if qualified in excluded:
            continue
        state = state_of(relocated(unit, qualified))
        # Needed or applied there: not a function that merely lacks what
        # the fix changes (not-applicable, a bug never there).
        if state is not None and state.state in (
            PatchState.NEEDED,
            PatchState.APPLIED,
        ):
            holding.append((qualified, state))
    match holding:
        case [(qualified, state)]:
            found_as = f"found as `{qualified}`"
            state.reason = "; ".join(filter(None, [found_as, state.reason]))
            state.details[FOUND_AS] = qualified
            return state
        case [(_, first), *_]:
            where = ", ".join(f"`{q}` (line {s.line})" for q, s in holding)
            return dataclasses.replace(
                first,
                state=PatchState.DRIFTED,
                reason=f"{absent(unit)}; the code the fix changes is in "
                f"{len(holding)} functions of that name, {where}: which one it "
                "means cannot be told",
                details={},
            )
    return None


def absent(unit: Unit) -> str:
    return f"no {unit.kind} {unit.name} in {unit.path}"


def candidates(tree: ast.Module, unit: Unit) -> list[tuple[str, ast.stmt]]:
    """The file's other functions named as the unit's (qualified name and
    definition, in the file's order): module-level functions and methods
    of its classes, nested classes included; none where an edit of the unit
    does not go through its definition (a method the fix adds)."""
    name = unit.name.rsplit(".", 1)[-1]
    if unit.kind not in ("function", "method") or not all(
        _definition_step(edit, name) is not None
        for edit in unit.edits
        if edit.kind != "imports"
    ):
        return []
    found: dict[str, ast.stmt] = {}
    for qualified, node in _functions(tree.body, ()):
        if qualified.rsplit(".", 1)[-1] == name and qualified != unit.name:
            found.setdefault(qualified, node)
    return list(found.items())


def _functions(
    block: Sequence[ast.stmt], prefix: tuple[str, ...]
) -> Iterator[tuple[str, ast.stmt]]:
    for node in block:
        match node:
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                yield ".".join((*prefix, name)), node
            case ast.ClassDef(name=name, body=body):
                yield from _functions(body, (*prefix, name))


def placed(unit: Unit, found: _Found | None) -> Unit:
    """The unit where recognition found it (``found``: its state or
    finding): under another name where its own is absent."""
    qualified = found.details.get(FOUND_AS, "") if found is not None else ""
    return relocated(unit, qualified) if qualified else unit


def relocated(unit: Unit, qualified: str) -> Unit:
    """The unit as if its definition were ``qualified`` (``B.f`` for the
    recorded ``A.f``; ``f`` at the module level): each edit's way into the
    definition goes through the classes that name says; from the definition
    on it is the recorded one."""
    *classes, name = qualified.split(".")
    way = tuple(Step(f"class {cls}:\n") for cls in classes)

    def moved(edit: Edit) -> Edit:
        at = _definition_step(edit, name)
        if at is None:  # the imports: the module's, wherever the code is
            return edit
        return dataclasses.replace(edit, block=(*way, *edit.block[at:]))

    return dataclasses.replace(unit, edits=tuple(map(moved, unit.edits)))


def _definition_step(edit: Edit, name: str) -> int | None:
    """The index of the step that is the unit's definition."""
    for index, step in enumerate(edit.block):
        if shapes.identity(one_statement(with_block(step.header))) == f"def {name}":
            return index
    return None


def removed_at(
    unit: Unit,
    edits: Sequence[CompiledEdit],
    tree: ast.Module,
    shapes_of: ShapeCache,
    others: frozenset[str] = frozenset(),
) -> tuple[str, tuple[int, int], int] | None:
    """Where the statements an edit of the absent ``unit`` removes are in
    the file, whatever block holds them, outside the definitions named
    ``others`` (the patch's other units there: their own code is theirs):
    why it drifts, the lines of the innermost definition holding them, and
    its first line (0: the module's statements); None where they are
    nowhere."""
    for compiled in edits:
        if not compiled.removed:
            continue
        # A shape starts with its node's type: only a block holding a
        # statement of the first one's type is compared (the file's shapes
        # are not all made where a unit is absent).
        kind = compiled.removed[0].key.partition("(")[0]
        for block, owner, qualified in _blocks(tree, tree, ""):
            if (
                qualified in others
                or not any(type(node).__name__ == kind for node in block)
                or not occurrences(block, compiled.removed, False, False, shapes_of)
            ):
                continue
            where = "the module's statements"
            span = (1, max((n.end_lineno or 1 for n in tree.body), default=1))
            match owner:
                case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                    where = f"def {name}"
                case ast.ClassDef(name=name):
                    where = f"class {name}"
            if isinstance(owner, shapes.DEFINITIONS):
                decorators = [d.lineno for d in owner.decorator_list]
                first = min([owner.lineno, *decorators])
                span = (first, owner.end_lineno or first)
                where += f" at line {first}"
            code = shapes.quoted(compiled.edit.removed)
            reason = f"{absent(unit)}, but the code the fix removes (`{code}`) "
            return reason + f"is in {where}", span, span[0] if owner is not tree else 0
    return None


def _blocks(
    node: ast.AST, owner: ast.AST, qualified: str
) -> Iterator[tuple[list[ast.stmt], ast.AST, str]]:
    """Every block of ``node`` with the innermost definition holding it and
    that definition's qualified name."""
    if isinstance(node, shapes.DEFINITIONS):
        owner = node
        qualified = f"{qualified}.{node.name}" if qualified else node.name
    for name in shapes.BLOCK_FIELDS:
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block, owner, qualified
            for statement in block:
                yield from _blocks(statement, owner, qualified)
    for handler in getattr(node, "handlers", []):
        yield from _blocks(handler, owner, qualified)

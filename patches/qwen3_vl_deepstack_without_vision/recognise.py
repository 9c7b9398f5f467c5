"""vllm#49397's recognition helpers: the ``__init__`` methods that build the
deepstack buffers, the tower block and the flag in them, and whether the flag
already reads false for a skipped tower.
"""

from __future__ import annotations

import ast

from deepstack_patch.engine.syntax import is_self_attribute, iter_classes

from .._deepstack_buffer import BUFFERS
from .imports import GUARD
from .rewrite import USE

TOWER = "_mark_tower_model"


def buffer_building_inits(
    tree: ast.Module,
) -> list[tuple[str, ast.FunctionDef]]:
    """Every ``__init__`` (by class) that assigns ``self.deepstack_input_embeds``."""
    found = []
    for qualname, cls in iter_classes(tree):
        for node in cls.body:
            match node:
                case ast.FunctionDef(name="__init__") if builds_buffers(node):
                    found.append((qualname, node))
    return found


def builds_buffers(node: ast.AST) -> bool:
    return any(_assigns_buffers(statement) for statement in ast.walk(node))


def _assigns_buffers(node: ast.AST) -> bool:
    """``self.deepstack_input_embeds = <buffers>``; setting it to None (a model
    that keeps its features per step, as MossAudio does) builds nothing."""
    match node:
        case (
            ast.Assign(targets=[target], value=value)
            | ast.AnnAssign(target=target, value=value)
        ) if value is not None:
            return is_self_attribute(target, BUFFERS) and not (
                isinstance(value, ast.Constant) and value.value is None
            )
    return False


def is_tower_block(node: ast.AST) -> bool:
    """``with self._mark_tower_model(...):`` with nothing else in the header."""
    match node:
        case ast.With(items=[ast.withitem(context_expr=ast.Call(func=func))]):
            return is_self_attribute(func, TOWER)
    return False


def self_attribute_assigned(statement: ast.stmt) -> str | None:
    match statement:
        case ast.Assign(targets=[ast.Attribute(value=ast.Name("self"), attr=name)]):
            return name
        case ast.AnnAssign(target=ast.Attribute(value=ast.Name("self"), attr=name)):
            return name
    return None


def is_flag_guard(node: ast.AST) -> bool:
    """``if self.use_deepstack:`` with no ``else``."""
    match node:
        case ast.If(test=test, orelse=[]):
            return is_self_attribute(test, USE)
    return False


def _skips_for_missing(value: ast.AST, tower: str | None = None) -> bool:
    """``not isinstance(self.<tower>, StageMissingLayer)`` somewhere in ``value``."""
    for node in ast.walk(value):
        match node:
            case ast.UnaryOp(
                op=ast.Not(),
                operand=ast.Call(
                    func=ast.Name("isinstance"),
                    args=[ast.Attribute(value=ast.Name("self"), attr=attr), guard],
                ),
            ) if tower in (None, attr):
                match guard:
                    case ast.Name(id=name) | ast.Attribute(attr=name) if name == GUARD:
                        return True
    return False


def flag_index_before(init: ast.FunctionDef, block_index: int) -> int | None:
    """The index in ``__init__``'s body of ``self.use_deepstack = ...``, None
    unless it comes before the tower block with only assignments to ``self``
    between them."""
    flag_index = next(
        (
            i
            for i, s in enumerate(init.body[:block_index])
            if self_attribute_assigned(s) == USE
        ),
        None,
    )
    if flag_index is None or not all(
        self_attribute_assigned(s) for s in init.body[flag_index:block_index]
    ):
        return None
    return flag_index


def attributes_read(names: set[str | None], nodes: list[ast.AST]) -> list[str]:
    """The ``self.<name>`` of ``names`` that ``nodes`` read, sorted."""
    return sorted(
        {
            node.attr
            for statement in nodes
            for node in ast.walk(statement)
            if isinstance(node, ast.Attribute)
            and node.attr in names
            and is_self_attribute(node, node.attr)
        }
    )


def flag_skips_missing_tower(init: ast.FunctionDef) -> bool:
    """``self.use_deepstack = ... not isinstance(self.<tower>, StageMissingLayer)``."""
    return any(
        _skips_for_missing(node.value)
        for node in ast.walk(init)
        if isinstance(node, ast.Assign) and self_attribute_assigned(node) == USE
    )


def later_flag_checks(init: ast.FunctionDef, block_index: int) -> tuple[int, ...]:
    """The ``if`` statements after the tower block that read the flag.

    Such a check (CohereCompass asserts the pipeline split with `if not first
    rank and self.use_deepstack`) means "the model has deepstack": with the
    tower skipped on a later pipeline stage it would read false and check
    nothing, so the rewrite keeps the flag's old condition there.
    """
    return tuple(
        i
        for i, statement in enumerate(init.body)
        if i > block_index
        and isinstance(statement, ast.If)
        and any(is_self_attribute(n, USE) for n in ast.walk(statement.test))
    )

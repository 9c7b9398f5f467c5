"""vllm#43617's recognition helpers: the buffer growth ``_set_`` has inline,
and what it reads that the new ``_resize_`` method would not have.
"""

from __future__ import annotations

import ast

from deepstack_patch.engine.syntax import FunctionNode, is_self_attribute, matches_code

from .._deepstack_buffer import BUFFERS, is_buffer_size_test


def inline_growth(statement: ast.stmt) -> bool:
    """``if <n> > self.<buffers>[0].size(0): self.<buffers> = [...]`` where the
    new buffers keep the old ones' device and dtype."""
    if not (
        isinstance(statement, ast.If)
        and not statement.orelse
        and is_buffer_size_test(statement.test)
        and len(statement.body) == 1
    ):
        return False
    assign = statement.body[0]
    if not (
        isinstance(assign, ast.Assign)
        and len(assign.targets) == 1
        and is_self_attribute(assign.targets[0], BUFFERS)
    ):
        return False
    keeps = {
        keyword.arg
        for call in ast.walk(assign.value)
        if isinstance(call, ast.Call)
        for keyword in call.keywords
        if keyword.arg in ("device", "dtype")
        and isinstance(keyword.value, ast.Attribute)
        and keyword.value.attr == keyword.arg
        and matches_code(keyword.value.value, "self.{buffers}[0]", buffers=BUFFERS)
    }
    return keeps == {"device", "dtype"}


def setter_locals_read(setter: FunctionNode, growth: ast.If) -> list[str]:
    """Names the reallocation reads that ``_set_`` binds (its parameters and
    locals), its row count aside: moved into ``_resize_`` they would be
    undefined there."""
    rows = is_buffer_size_test(growth.test)
    value = growth.body[0]
    own = {
        node.id
        for node in ast.walk(value)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }
    args = setter.args
    bound = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs][1:]}
    bound |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    bound |= {
        node.id
        for statement in setter.body
        if statement is not growth
        for node in ast.walk(statement)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }
    read = {
        node.id
        for node in ast.walk(value)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    return sorted((read - own - {rows}) & bound)


def reads_other_num_tokens(growth: ast.If) -> bool:
    rows = is_buffer_size_test(growth.test)
    return rows != "num_tokens" and any(
        isinstance(node, ast.Name) and node.id == "num_tokens"
        for node in ast.walk(growth.body[0])
    )

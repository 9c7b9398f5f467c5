"""vllm#49397's rewrite of one ``__init__``: the tower block first, then the
flag (now false for a skipped tower) and what follows it, then the buffers.

``rewrite_init`` takes what recognition found (the indices of the flag, the
block and the buffer statement in ``__init__``'s body, the tower attribute,
later checks of the flag) from the finding's details, so nothing is
recognised twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Finding

from .imports import GUARD

if TYPE_CHECKING:
    import libcst

USE = "use_deepstack"
#: The comment upstream dropped with the move; others move with their statement.
DROPPED_COMMENT = "# register buffer for deepstack"
#: Upstream's formatter (ruff) lays the flag out for this width.
LINE_LENGTH = 88


def rewrite_init(
    init: libcst.FunctionDef, fix: Finding, module: libcst.Module
) -> libcst.FunctionDef:
    """Tower block, then the flag and what follows it, then the buffers."""
    import libcst

    body = list(init.body.body)
    first, block_at = fix.details["flag_index"], fix.details["block_index"]
    moved = body[first:block_at]
    block = body[block_at]
    assert isinstance(block, libcst.With)
    inside = list(block.body.body)
    buffer = inside.pop(fix.details["buffer_index"])
    block = block.with_changes(
        body=block.body.with_changes(body=inside),
        leading_lines=moved[0].leading_lines,
    )
    flag = _guarded_flag(
        moved[0], fix.details["tower"], fix.details["column"], module
    ).with_changes(leading_lines=body[block_at].leading_lines)
    kept = [
        line
        for line in buffer.leading_lines
        if line.comment is None or line.comment.value != DROPPED_COMMENT
    ]
    blank = [line for line in body[block_at].leading_lines if line.comment is None]
    if blank and not any(line.comment is None for line in kept):
        kept.insert(0, blank[0])  # the spacing the block had
    buffer = buffer.with_changes(leading_lines=kept)
    for index in fix.details["later_checks"]:
        body[index] = _checks_old_flag(body[index], moved[0], module)
    body[first : block_at + 1] = [block, flag, *moved[1:], buffer]
    return init.with_deep_changes(init.body, body=body)


def _checks_old_flag(
    check: libcst.BaseStatement, flag: libcst.BaseStatement, module: libcst.Module
) -> libcst.BaseStatement:
    """``if ... self.use_deepstack ...:`` reading the flag's old condition."""
    import libcst

    assert isinstance(check, libcst.If) and isinstance(flag, libcst.SimpleStatementLine)
    (assign,) = flag.body
    assert isinstance(assign, libcst.Assign)
    old = assign.value
    if not isinstance(old, libcst.Call | libcst.Name | libcst.Attribute) or old.lpar:
        old = old.with_changes(lpar=[libcst.LeftParen()], rpar=[libcst.RightParen()])

    class OldFlag(libcst.CSTTransformer):
        def leave_Attribute(
            self, original: libcst.Attribute, updated: libcst.Attribute
        ) -> libcst.BaseExpression:
            match updated:
                case libcst.Attribute(
                    value=libcst.Name(value="self"), attr=libcst.Name(value=name)
                ) if name == USE:
                    return old
            return updated

    return check.with_changes(test=check.test.visit(OldFlag()))


def _guarded_flag(
    statement: libcst.BaseStatement, tower: str, column: int, module: libcst.Module
) -> libcst.BaseStatement:
    """``self.use_deepstack = <old> and not isinstance(self.<tower>, ...)``,
    laid out as ruff formats it (upstream's formatter)."""
    import libcst

    assert isinstance(statement, libcst.SimpleStatementLine)
    (assign,) = statement.body
    assert isinstance(assign, libcst.Assign)
    target = module.code_for_node(assign.targets[0].target)
    value = assign.value
    old = module.code_for_node(value)
    match value:
        case (
            libcst.BooleanOperation(operator=libcst.Or())
            | libcst.IfExp()
            | (libcst.Lambda() | libcst.NamedExpr())
        ) if not value.lpar:
            old = f"({old})"
    guard = f"not isinstance(self.{tower}, {GUARD})"
    line = f"{target} = {old} and {guard}"
    comment = statement.trailing_whitespace.comment
    if "\n" in old or column + len(line) <= LINE_LENGTH:
        text = line
    elif isinstance(value, libcst.Call) and not value.lpar:
        callee = module.code_for_node(value.func)
        arguments = module.code_for_node(value).removeprefix(callee)[1:-1]
        text = (
            f"{target} = {callee}(\n{module.default_indent}{arguments}\n) and {guard}"
        )
    else:
        inner = module.default_indent
        text = f"{target} = (\n{inner}{old}\n{inner}and {guard}\n)"
    if comment is not None:
        text += f"  {comment.value}"
    return libcst.parse_statement(text + "\n", config=module.config_for_parsing)

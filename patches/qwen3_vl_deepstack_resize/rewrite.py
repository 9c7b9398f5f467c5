"""vllm#43617's rewrite of one class: ``_resize_deepstack_input_embeds``
added after ``_get_``, made of ``_set_``'s own buffer growth; ``_get_`` grows
the buffers instead of returning None, ``_set_`` calls the new method.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._deepstack_buffer import (
    BUFFERS,
    GET,
    RESIZE,
    SET,
    is_buffer_size_test,
    is_empty_counter_return,
    statement_ast,
)
from .recognise import inline_growth

if TYPE_CHECKING:
    import libcst


def rewrite_class(cls: libcst.ClassDef, module: libcst.Module) -> libcst.ClassDef:
    """Add ``_resize_`` after ``_get_``; route ``_get_`` and ``_set_`` to it."""
    import libcst

    methods = {
        s.name.value: s for s in cls.body.body if isinstance(s, libcst.FunctionDef)
    }
    setter = methods[SET]
    growth = next(
        s
        for s in setter.body.body
        if isinstance(s, libcst.If) and inline_growth(statement_ast(s, module))
    )
    rows = is_buffer_size_test(statement_ast(growth, module).test)
    assert rows is not None
    resize = _resize_method(growth, rows, module, spacing=setter.leading_lines)

    def call(name: str) -> libcst.BaseStatement:
        return libcst.parse_statement(
            f"self.{RESIZE}({name})\n", config=module.config_for_parsing
        )

    body: list[libcst.BaseStatement] = []
    for statement in cls.body.body:
        if statement is methods[GET]:
            body += [_grow_instead_of_none(statement, module), resize]
            continue
        if statement is setter:
            new_growth = growth.with_changes(
                body=growth.body.with_changes(body=[call(rows)])
            )
            statement = statement.with_deep_changes(
                statement.body,
                body=[new_growth if s is growth else s for s in statement.body.body],
            )
        body.append(statement)
    return cls.with_changes(body=cls.body.with_changes(body=body))


def _grow_instead_of_none(
    get: libcst.FunctionDef, module: libcst.Module
) -> libcst.FunctionDef:
    import libcst

    names = [p.name.value for p in get.params.params]
    rows = names[1]
    indent = module.default_indent
    grow = libcst.parse_statement(
        f"if {rows} > self.{BUFFERS}[0].size(0):\n{indent}self.{RESIZE}({rows})\n",
        config=module.config_for_parsing,
    )
    body = []
    for statement in get.body.body:
        if isinstance(statement, libcst.If) and is_empty_counter_return(
            statement_ast(statement, module)
        ):
            # Comments above the early return describe the step it guards;
            # they stay with what replaces it.
            statement = grow.with_changes(leading_lines=statement.leading_lines)
        body.append(statement)
    return get.with_deep_changes(get.body, body=body)


def _resize_method(
    growth: libcst.If,
    rows: str,
    module: libcst.Module,
    spacing: Sequence[libcst.EmptyLine],
) -> libcst.FunctionDef:
    """``_resize_`` made of ``_set_``'s own reallocation."""
    import libcst

    (assign,) = growth.body.body

    class RenameRows(libcst.CSTTransformer):
        def leave_Name(
            self, original: libcst.Name, updated: libcst.Name
        ) -> libcst.Name:
            if updated.value != rows:
                return updated
            return updated.with_changes(value="num_tokens")

        # Attribute and keyword names are not the local variable.
        def leave_Attribute(
            self, original: libcst.Attribute, updated: libcst.Attribute
        ) -> libcst.Attribute:
            return updated.with_changes(attr=original.attr)

        def leave_Arg(self, original: libcst.Arg, updated: libcst.Arg) -> libcst.Arg:
            return updated.with_changes(keyword=original.keyword)

    if rows != "num_tokens":
        assign = assign.visit(RenameRows())
    # Continuation lines inside brackets are indented relative to the block
    # in LibCST, so the statement moves one level out as it is.
    method = libcst.parse_statement(
        f"def {RESIZE}(self, num_tokens: int) -> None:\n{module.default_indent}pass\n",
        config=module.config_for_parsing,
    )
    assert isinstance(method, libcst.FunctionDef)
    method = method.with_deep_changes(
        method.body, body=[assign.with_changes(leading_lines=[])]
    )
    blank = [line for line in spacing if line.comment is None] or [libcst.EmptyLine()]
    return method.with_changes(leading_lines=blank)

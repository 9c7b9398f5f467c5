"""vllm#40917's rewrite of one function: ``n = inputs_embeds.size(0)`` before
each ``IntermediateTensors`` build of the known shape, and that build's
buffer sliced to ``[:n]``.

libcst is imported inside the functions: recognition never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import libcst


def slice_buffers(function: libcst.FunctionDef) -> libcst.FunctionDef:
    """Insert ``n = inputs_embeds.size(0)`` before each build of the known
    shape and slice that build's comprehension value to ``[:n]``.

    Nothing else is touched: not a buffer subscript elsewhere in the
    statement, nor code in nested functions (recognised on their own).
    """
    import libcst

    class InsertRowCount(libcst.CSTTransformer):
        def visit_FunctionDef(self, node: libcst.FunctionDef) -> bool:
            return node is function  # a nested function is not this finding

        def visit_ClassDef(self, node: libcst.ClassDef) -> bool:
            return False

        def leave_IndentedBlock(
            self, original: libcst.IndentedBlock, updated: libcst.IndentedBlock
        ) -> libcst.IndentedBlock:
            body: list[libcst.BaseStatement] = []
            for statement in updated.body:
                sliced = _sliced_build(statement)
                if sliced is not None:
                    row_count = libcst.parse_statement("n = inputs_embeds.size(0)\n")
                    # Comments above the statement stay above the group.
                    body.append(
                        row_count.with_changes(leading_lines=statement.leading_lines)
                    )
                    statement = sliced.with_changes(leading_lines=[])
                body.append(statement)
            return updated.with_changes(body=body)

    return function.visit(InsertRowCount())


# Plain `match` patterns, not libcst.matchers: importing that module
# costs longer than the whole rewrite.
def _is_level_buffer(node: libcst.BaseExpression, level: str) -> bool:
    """``self._ds_buffers[<level>]``."""
    import libcst

    match node:
        case libcst.Subscript(
            value=libcst.Attribute(
                value=libcst.Name(value="self"),
                attr=libcst.Name(value="_ds_buffers"),
            ),
            slice=[
                libcst.SubscriptElement(
                    slice=libcst.Index(value=libcst.Name(value=index))
                )
            ],
        ):
            return index == level
    return False


def _sliced_build(
    statement: libcst.BaseStatement,
) -> libcst.SimpleStatementLine | None:
    """``statement`` with its build's value sliced, None if not a build."""
    import libcst

    match statement:
        case libcst.SimpleStatementLine(
            body=[
                libcst.Assign(
                    targets=[libcst.AssignTarget(target=libcst.Name())],
                    value=libcst.Call() as call,
                )
                | libcst.AnnAssign(
                    target=libcst.Name(), value=libcst.Call() as call
                ) as assignment
            ]
        ):
            pass
        case _:
            return None
    match call:
        case libcst.Call(
            func=libcst.Name(value="IntermediateTensors")
            | libcst.Attribute(attr=libcst.Name(value="IntermediateTensors")),
            args=[
                libcst.Arg(
                    keyword=None,
                    star="",
                    value=libcst.DictComp(
                        for_in=libcst.CompFor(
                            target=libcst.Tuple(
                                elements=[
                                    libcst.Element(value=libcst.Name(value=level)),
                                    libcst.Element(value=libcst.Name()),
                                ]
                            ),
                            ifs=[],
                            inner_for_in=None,
                            asynchronous=None,
                        )
                    ) as comprehension,
                ) as argument
            ],
        ) if _is_level_buffer(comprehension.value, level):
            pass
        case _:
            return None
    sliced = libcst.Subscript(
        value=comprehension.value,
        slice=[
            libcst.SubscriptElement(
                slice=libcst.Slice(lower=None, upper=libcst.Name("n"))
            )
        ],
    )
    argument = argument.with_changes(value=comprehension.with_changes(value=sliced))
    assignment = assignment.with_changes(value=call.with_changes(args=[argument]))
    return statement.with_changes(body=[assignment])

"""Do two files parse to the same code? ``ast.dump`` equality, made cheap.

The drift corpus and the derived-vs-series comparison ask this of files of
3,000 lines hundreds of times a run, and ``ast.dump`` of such a file is a
quarter of a second. A statement whose source text is the same on both
sides, starting at the same column, parses to the same tree, so it is
compared as text; only statements whose text differs are dumped, and a class
is compared member by member. The answer is ``ast.dump``'s:
``tests/test_drift.py::test_same_code_is_ast_dump_equality`` holds the two
equal on examples built to tell them apart.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Source:
    """A file's text, its module, and each line as UTF-8 (ast's columns)."""

    text: str
    module: ast.Module = field(init=False)
    lines: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.module = ast.parse(self.text)
        self.lines = [line.encode() for line in self.text.splitlines(keepends=True)]

    def segment(self, node: ast.stmt) -> tuple[int, bytes]:
        """The statement's column and exact text, its decorators included."""
        first = min([node.lineno, *(d.lineno for d in decorators(node))])
        last, end = node.end_lineno or node.lineno, node.end_col_offset or 0
        column = node.col_offset
        if first == last:
            return column, self.lines[first - 1][column:end]
        middle = self.lines[first : last - 1]
        text = b"".join([self.lines[first - 1][column:], *middle])
        return column, text + self.lines[last - 1][:end]


def decorators(node: ast.stmt) -> list[ast.expr]:
    match node:
        case ast.FunctionDef() | ast.AsyncFunctionDef() | ast.ClassDef():
            return node.decorator_list
        case _:
            return []


def same_statements(
    a: Source, a_body: Sequence[ast.stmt], b: Source, b_body: Sequence[ast.stmt]
) -> bool:
    """``ast.dump`` of the two statement lists is equal."""
    return len(a_body) == len(b_body) and all(
        same_node(a, x, b, y) for x, y in zip(a_body, b_body, strict=True)
    )


def same_node(a: Source, x: ast.stmt, b: Source, y: ast.stmt) -> bool:
    """``ast.dump(x) == ast.dump(y)``, by text where the text is the same."""
    if type(x) is not type(y):
        return False
    if a.segment(x) == b.segment(y):
        return True
    match x, y:
        case ast.ClassDef(), ast.ClassDef():
            return _class_header(x) == _class_header(y) and same_statements(
                a, x.body, b, y.body
            )
        case _:
            return ast.dump(x) == ast.dump(y)


def _class_header(node: ast.ClassDef) -> str:
    """The class without its body: name, bases, keywords, decorators."""
    body = node.body
    node.body = []
    try:
        return ast.dump(node)
    finally:
        node.body = body


def same_code(a: str, b: str) -> bool:
    """``ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))``."""
    left, right = Source(a), Source(b)
    return same_statements(left, left.module.body, right, right.module.body)

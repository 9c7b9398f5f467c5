"""A rewritten file's ast, made from the old one's statements before the
first changed line and a parse of the rest (``SourceFile.edited``): always
the tree a whole parse gives, with every line and column."""

from __future__ import annotations

import ast

import pytest
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.source import SourceFile

BEFORE = b'''import os


class Runner:
    """A runner."""

    limit = 3

    def first(self):
        return 1

    @property
    def second(self):
        return 2

    def third(self):
        x = [
            1,
        ]
        return x


def after():
    return os.sep
'''


def _dump(tree: ast.AST) -> str:
    return ast.dump(tree, include_attributes=True)


def _edited(source: SourceFile, new: bytes) -> SourceFile:
    old = source.raw
    first_changed = next(
        (
            n
            for n, (a, b) in enumerate(
                zip(old.splitlines(True), new.splitlines(True), strict=False)
            )
            if a != b
        ),
        min(old.count(b"\n"), new.count(b"\n")),
    )
    return source.edited(new, first_changed)


def _class_of(tree: ast.Module) -> ast.ClassDef:
    (found,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    return found


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # A method's body rewritten: the statements before it are kept.
        (b"        return 2\n", b"        value = 2\n        return value\n"),
        # A method added between two.
        (
            b"    def third(self):\n",
            b"    def extra(self):\n        return 0\n\n    def third(self):\n",
        ),
        # A line dropped, the class's last statement rewritten.
        (b"        x = [\n            1,\n        ]\n", b"        x = [1]\n"),
    ],
)
def test_a_rewrite_inside_a_class_keeps_its_statements_before(
    old: bytes, new: bytes
) -> None:
    after = BEFORE.replace(old, new, 1)
    assert after != BEFORE
    source = SourceFile("runner.py", BEFORE)
    edited = _edited(source, after)
    assert _dump(edited.ast) == _dump(ast.parse(after))
    # The cut was inside the class: its docstring and ``limit`` are the old
    # tree's own nodes, under a class node of its own.
    old_class, new_class = _class_of(source.ast), _class_of(edited.ast)
    assert new_class is not old_class
    kept = zip(new_class.body[:2], old_class.body[:2], strict=True)
    assert all(a is b for a, b in kept)
    assert source.ast.body[1] is old_class  # the old tree is unchanged
    assert _dump(source.ast) == _dump(ast.parse(BEFORE))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # The class's last method removed: nothing of it to parse
        # again (the module is cut before it).
        (
            b"\n    def third(self):\n        x = [\n            1,\n        ]\n"
            b"        return x\n",
            b"",
        ),
        # Lines added at the end of a method continue it: no cut there
        # (the next method's dedent raises, or the class is kept whole).
        (b"        return 1\n", b"        return 1\n        unreachable = 0\n"),
        (b"        return x\n", b"        return x\n        y = 1\n"),
        # The last method's ``def`` line dropped: its body joins the method
        # before (the class had a statement after the cut, the file has not).
        (b"    def third(self):\n", b""),
        # A change in the class's header.
        (b"class Runner:\n", b"class Runner(object):\n"),
        # Two statements on one line.
        (b"    limit = 3\n", b"    limit = 3; top = 4\n"),
        # After the module's last statement.
        (b"    return os.sep\n", b"    return os.sep\n\n\nVALUE = 1\n"),
    ],
)
def test_a_rewrite_that_cannot_be_cut_inside_the_class_parses_as_a_whole_would(
    old: bytes, new: bytes
) -> None:
    after = BEFORE.replace(old, new, 1)
    assert after != BEFORE
    edited = _edited(SourceFile("runner.py", BEFORE), after)
    assert _dump(edited.ast) == _dump(ast.parse(after))


@pytest.mark.parametrize(
    "broken",
    [
        # An ``else`` after the class (and a change inside it): it would
        # join a wrapping ``if``.
        BEFORE.replace(
            b"\n\ndef after():", b"else:\n    pass\n\n\ndef after():"
        ).replace(b"        return 2\n", b"        return 22\n"),
        # A method's body left open.
        BEFORE.replace(b"        return 2\n", b"        return (2\n"),
        # A method indented with a tab and blanks as wide as the others'
        # (4 bytes), which Python takes for no indentation of theirs.
        BEFORE.replace(
            b"    def third(self):\n        x = [\n            1,\n        ]\n"
            b"        return x\n",
            b"\t   def third(self):\n\t\t   x = [1]\n\t\t   return x\n",
        ),
        # Lines at an indentation no block has.
        BEFORE.replace(b"        return x\n", b"        return x\n  y = 1\n"),
    ],
)
def test_a_rewrite_that_does_not_parse_is_told_so(broken: bytes) -> None:
    with pytest.raises(SyntaxError):
        ast.parse(broken)
    edited = _edited(SourceFile("runner.py", BEFORE), broken)
    with pytest.raises(DeepstackError, match="syntax error"):
        _ = edited.ast

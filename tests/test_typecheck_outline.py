"""Issue 41 item 4: what ty sees of a function's body, held against the ty
this tool pins (engine/derived/interface.py).

Two rules rest on how ty 0.0.108 reads a module, and both are checked here
by running it: a body no other module sees (its function's return is not
inferred from it, and it assigns nothing to its first parameter) can change
without another module's diagnostics changing; and a file's
``interface.outline``, those bodies left out, gives the diagnostics the
whole file gives on the functions it keeps. A ty that starts to infer
returns from bodies fails these tests before a join or an outline trusts it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from deepstack_patch.engine.derived import typecheck
from deepstack_patch.engine.derived.interface import (
    interface,
    outline,
    same_interface,
)

from tests.test_series_order import whole_tree

SHARED = """class Pool:
    def __init__(self, size: int) -> None:
        self.size = size

    def take(self, count):
        return min(count, self.size)

    def lend(self, other: "Pool") -> None:
        other.lent = 1


def helper(x):
    return x
"""
#: Every body another module cannot see, changed: no diagnostic of a
#: module that uses them moves.
SHARED_BODIES = (
    SHARED.replace("return min(count, self.size)", "return [count]")
    .replace("other.lent = 1", "other.lent = 'one'\n        other.size = 2")
    .replace("    return x\n", "    return str(x)\n")
)
#: A return annotation is seen: what a caller does with the result is
#: checked against it.
SHARED_ANNOTATED = SHARED.replace(
    "def take(self, count):\n        return min(count, self.size)",
    "def take(self, count) -> list[int]:\n        return [count]",
)
USER = """from vllm.shared import Pool, helper


def grab(pool: Pool) -> int:
    got = pool.take(1)
    got.nope
    helper(1).nope
    pool.lent
    return pool.size
"""


def ty_on(root: Path, path: str, one: str, other: str, in_place_of: str) -> tuple:
    """ty check's diagnostics on ``path`` with ``one``, then ``other``, in
    place of the file ``in_place_of``."""
    check = typecheck.Check(
        path,
        {in_place_of: one.encode()},
        {in_place_of: other.encode()},
        lambda _relpath, _appears: True,
    )
    (found,) = typecheck.diagnostics_of(root, [check])
    assert not isinstance(found, typecheck.CheckerFailed), found
    return found


def test_another_module_sees_alike_what_the_interface_says_is_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(typecheck, "SERVED", False)  # runs of ty check
    root = whole_tree(
        tmp_path / "tree", {"vllm/shared.py": SHARED, "vllm/user.py": USER}
    ).root
    assert same_interface(SHARED.encode(), SHARED_BODIES.encode())
    before, after = ty_on(root, "vllm/user.py", SHARED, SHARED_BODIES, "vllm/shared.py")
    assert before == after
    # ``pool.lent`` is declared nowhere: what ``lend`` assigns to another
    # Pool declares nothing (the rule that lets its body be left out).
    assert any("lent" in d.message for d in after)
    # The test can tell: an annotated return is seen, and is not alike.
    assert not same_interface(SHARED.encode(), SHARED_ANNOTATED.encode())
    before, after = ty_on(
        root, "vllm/user.py", SHARED, SHARED_ANNOTATED, "vllm/shared.py"
    )
    assert before != after


FIXED = """import os


class Runner:
    def __init__(self, size: int) -> None:
        self.size = size
        self.ready = False

    def prepare(self) -> None:
        self.ready = bool(os.environ)

    def helper(self, count):
        return count + self.size

    def other(self) -> int:
        return self.missing_here

    def run(self) -> int:
        total = self.helper(1)
        total.nope
        self.absent
        self.prepare(1)
        return self.size + int(self.ready)


def free(count: int, runner: Runner):
    runner.lent = count
    return undefined_name
"""


def test_an_outline_gives_the_diagnostics_of_the_whole_file_on_what_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only ``run`` is kept (the fix's lines are in it), and the bodies that
    assign to ``self`` (``__init__``, ``prepare``); ``helper``, ``other`` and
    ``free`` are left out, with their own diagnostics, and what ``run`` is
    told of them (an Unknown return, attributes declared elsewhere) is as
    in the whole file."""
    monkeypatch.setattr(typecheck, "SERVED", False)
    root = whole_tree(tmp_path / "tree", {"vllm/runner.py": FIXED}).root
    lines = FIXED.splitlines()
    run = [n for n, line in enumerate(lines, 1) if "total = self.helper" in line]
    shown = outline(FIXED.encode(), frozenset(run))
    assert shown is not None
    text = shown.decode()
    assert len(text.splitlines()) == len(lines)  # every line keeps its number
    assert "self.missing_here" not in text and "undefined_name" not in text
    assert "self.ready = bool(os.environ)" in text and "total.nope" in text
    assert interface(shown) == interface(FIXED.encode())
    whole, outlined = ty_on(root, "vllm/runner.py", FIXED, text, "vllm/runner.py")
    kept = range(run[0] - 1, run[0] + 5)  # ``run``, from its def line

    def on_run(found: list[typecheck.Diagnostic]) -> list[typecheck.Diagnostic]:
        return [d for d in found if d.line in kept]

    assert on_run(whole) == on_run(outlined)
    # An Unknown return (``helper``'s) is no error; an attribute declared
    # nowhere is, and so is a call that ``prepare``'s ``def`` line refuses.
    assert [d.line for d in on_run(whole)] == [run[0] + 2, run[0] + 3]
    # What the outline left out had diagnostics of its own, gone with it;
    # a function left out that promises a return says its body is a stub,
    # on its own ``def`` line (a fix's line is never there: it is kept).
    assert len(whole) > len(on_run(whole))
    assert {(d.line, d.rule) for d in outlined if d.line not in kept} == {
        (
            FIXED.splitlines().index("    def other(self) -> int:") + 1,
            "invalid-implicit-return-in-function-with-stub-body",
        )
    }


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):\n    '''Doc.'''\n    return x\n",
        "class C:\n\tdef m(self):\n\t\treturn 1\n",
        "@decorate\ndef f():\n    if 1:\n        return 2\n    return 3\n",
        "def f():  # a comment\n    # before the body\n    return (\n        1\n    )\n"
        "\n",
        "def f(): return 1\n",
        "async def f():\n    await g()\n\n\nx = 1\n",
        "def f():\r\n    return 1\r\n\r\ny = 2\r\n",
    ],
    ids=["docstring", "tabs", "decorated", "comments", "one-line", "async", "crlf"],
)
def test_an_outline_parses_keeps_every_line_and_what_another_module_sees(
    source: str,
) -> None:
    raw = source.encode()
    shown = outline(raw, frozenset())
    assert shown is not None
    tree = ast.parse(shown)
    assert len(shown.splitlines()) == len(raw.splitlines())
    assert interface(shown) == interface(raw)
    # Every function left as a body of ``...`` (a one-line one stays whole).
    for node in ast.walk(tree):
        match node:
            case ast.FunctionDef() | ast.AsyncFunctionDef() if (
                node.body[0].lineno != node.lineno
            ):
                assert ast.unparse(node.body) == "..."


def test_an_outline_keeps_a_function_whose_decorator_the_fix_wrote() -> None:
    raw = b"@cache\ndef f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert outline(raw, frozenset({1})) == (
        b"@cache\ndef f():\n    return 1\n\n\ndef g():\n    ...\n"
    )
    assert outline(b"def f(:\n", frozenset()) is None

"""What ty can see of a module from another one: its interface.

A typed check (:mod:`.typecheck`) depends on every module its file can
reach (:mod:`.closure`), so two checks whose fixes change modules each other
reaches could never share a run of ty. Most fixes only change what a
function does, though, and what ty infers in an importing module never
depends on that: ty reads a function's signature from its ``def`` line
(ty 0.0.108 gives a call of a function without a return annotation the
type ``Unknown`` in another module; this module asks for the annotation all
the same, so a checker that infers return types is no surprise), and a
class's attributes from its body and from what its methods assign to
``self``.

So the interface of a module is its text with the body of each function
(at the module's level or a class's) left out, where leaving it out cannot
change what is seen from outside: the function has a return annotation
(or is ``__init__``, whose return no caller reads), and its body binds no
attribute (``self.x = …`` declares an attribute of the class) and declares
no ``global``. Two versions of a file with the same interface give another
file's check the same diagnostics.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterator

from deepstack_patch.engine.source import parsed


@functools.lru_cache(maxsize=4096)
def interface(raw: bytes) -> str | None:
    """A digest of what ty can see of the module ``raw`` from another
    module, or None where ``raw`` does not parse: its text without the lines
    of each body left out (see the module's docstring; two versions whose
    other lines differ, in code or in comments, never agree)."""
    try:
        tree = parsed(raw)
    except (SyntaxError, ValueError):
        return None
    lines = raw.splitlines(keepends=True)
    for first, last in sorted(_unseen_bodies(tree.body), reverse=True):
        lines[first - 1 : last] = [b"\0\n"]  # the body's place
    return hashlib.sha256(b"".join(lines)).hexdigest()


def _unseen_bodies(body: list[ast.stmt]) -> Iterator[tuple[int, int]]:
    """The first and last line of each function body in ``body`` (classes
    searched, never a body left out) that no other module sees."""
    for node in body:
        match node:
            case ast.ClassDef():
                yield from _unseen_bodies(node.body)
            case ast.FunctionDef() | ast.AsyncFunctionDef() if _body_unseen(node):
                yield node.body[0].lineno, node.end_lineno or node.body[-1].lineno


def same_interface(one: bytes, other: bytes) -> bool:
    """Whether another module's check sees ``one`` and ``other`` alike."""
    if one == other:
        return True
    seen = interface(one)
    return seen is not None and seen == interface(other)


def _body_unseen(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether nothing in ``function``'s body reaches its module's
    interface (see the module's docstring); a body on the ``def`` line stays."""
    if function.returns is None and function.name != "__init__":
        return False
    if function.body[0].lineno == function.lineno:
        return False
    for node in ast.walk(ast.Module(body=function.body, type_ignores=[])):
        match node:
            case ast.Attribute(ctx=ast.Store() | ast.Del()) | ast.Global():
                return False
    return True

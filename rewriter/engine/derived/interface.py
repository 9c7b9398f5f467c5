"""What ty can see of a module from another one: its interface.

A typed check (:mod:`.typecheck`) depends on every module its file can
reach (:mod:`.closure`), so two checks whose fixes change modules each other
reaches could never share a run of ty. Most fixes only change what a
function does, though, and what ty infers in an importing module never
depends on that: ty reads a function's signature from its ``def`` line, and
a class's attributes from its body and from what its methods assign to
``self``. The ty this tool pins (0.0.108, pyproject.toml) gives a call of a
function without a return annotation the type ``Unknown``, in another
module and in the function's own alike: it infers no return type from a
body (tests/test_typecheck_outline.py holds that against the pinned ty, so
a ty that starts to is caught before these rules are trusted with it).

So the interface of a module is its text with the body of each function
(at the module's level or a class's) left out, where leaving it out cannot
change what is seen from outside: its body binds no attribute of its
first parameter (``self.x = …`` declares an attribute of the class) and
declares no ``global``. Two versions of a file with the same interface give
another file's check the same diagnostics.

For the same reason a function's own diagnostics never depend on another
function's body that is left out: a check that reads only the diagnostics
on some lines of a file may have ty check the file's :func:`outline`, with
the other bodies left out (ty infers each body it checks: most of a big
file's cost).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Collection, Iterator

from deepstack_patch.engine.source import parsed
from deepstack_patch.engine.syntax import span


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
        # With the blank lines after it: they lie between two statements (no
        # string holds them), and an outline leaves them where a body was.
        while last < len(lines) and not lines[last].strip():
            last += 1
        lines[first - 1 : last] = [b"\0\n"]  # the body's place
    return hashlib.sha256(b"".join(lines)).hexdigest()


def _unseen_bodies(body: list[ast.stmt]) -> Iterator[tuple[int, int]]:
    """The first and last line of each function body in ``body`` (classes
    searched, never a body left out) that no other module sees."""
    for function in _unseen_functions(body):
        yield _body_lines(function)


def _unseen_functions(
    body: list[ast.stmt],
) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions of ``body`` (and of its classes) whose bodies no other
    module sees."""
    for node in body:
        match node:
            case ast.ClassDef():
                yield from _unseen_functions(node.body)
            case ast.FunctionDef() | ast.AsyncFunctionDef() if _body_unseen(node):
                yield node


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    return function.body[0].lineno, function.end_lineno or function.body[-1].lineno


def outline(raw: bytes, kept: Collection[int]) -> bytes | None:
    """``raw`` with the body of every function that no other module sees
    and that holds none of the 1-based lines ``kept`` (from its first
    decorator to its last line) left out: its lines blank but the first,
    ``...``, so every other line keeps its number. ty's diagnostics on the
    functions kept, and on the module's and classes' own statements, are
    those of ``raw``: what they read of another function is its ``def``
    line (see the module's docstring). None where ``raw`` does not parse."""
    try:
        tree = parsed(raw)
    except (SyntaxError, ValueError):
        return None
    lines = raw.splitlines(keepends=True)
    spans = []
    for function in _unseen_functions(tree.body):
        first, last = span(function)  # its decorators included
        if not any(first <= line <= last for line in kept):
            spans.append(_body_lines(function))
    for first, last in sorted(spans, reverse=True):
        opening = lines[first - 1]
        indent = opening[: len(opening) - len(opening.lstrip(b" \t\f"))]
        lines[first - 1 : last] = [indent + b"...\n", *[b"\n"] * (last - first)]
    return b"".join(lines)


def same_interface(one: bytes, other: bytes) -> bool:
    """Whether another module's check sees ``one`` and ``other`` alike."""
    if one == other:
        return True
    seen = interface(one)
    return seen is not None and seen == interface(other)


def _body_unseen(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether nothing in ``function``'s body reaches its module's
    interface (see the module's docstring); a body on the ``def`` line stays.

    ty declares an attribute only where a function assigns it to (or
    deletes it from) its first parameter, a method's ``self`` or ``cls``
    (``other.x = …``, ``self.part.x = …`` and ``type(self).x = …`` declare
    nothing: each is an error where ``x`` is not declared elsewhere)."""
    if function.body[0].lineno == function.lineno:
        return False
    first = [*function.args.posonlyargs, *function.args.args][:1]
    owner = first[0].arg if first else None
    for node in ast.walk(ast.Module(body=function.body, type_ignores=[])):
        match node:
            case ast.Global():
                return False
            case ast.Attribute(
                value=ast.Name(id=name), ctx=ast.Store() | ast.Del()
            ) if name == owner:
                return False
    return True

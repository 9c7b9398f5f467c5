"""The names a module ``__getattr__`` answers, where it declares them
(issue 34, item 1).

A module ``__getattr__`` may answer any name; :mod:`.names` then accepts
every name read off the module. Many answer only names they list, and say
so in a shape this recogniser knows: ``vllm.envs`` answers ``name in
environment_variables`` (a dict literal of the module) and raises
``AttributeError`` for the rest; ``vllm.platforms`` answers ``name ==
"current_platform"`` and ``name in globals()``. There a name that is not
declared is missing, as for any module.

The known shape: after setup statements (imports, ``global``), a chain of
``if``/``elif``/``else`` whose tests are ``name == "x"``, ``name in X``
or ``name not in X`` (``X`` a literal of strings, a module-level name bound
once to one, never changed at the top level, or ``globals()``), each branch
answering only the names its test lets through, and every other name
meeting a ``raise``. Anything else answers any name: None.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

_MUTATORS = frozenset({"update", "setdefault", "append", "extend", "add", "insert"})


def declared_names(body: Sequence[ast.stmt], bound: set[str]) -> set[str] | None:
    """The names the module's ``__getattr__`` answers, beyond ``bound`` (what
    the module binds at its top level); None where it may answer any name
    (or the module has none: then the caller decides)."""
    function = _getattr_of(body)
    if function is None or len(function.args.args) != 1:
        return None
    literals = _literals(body)
    param = function.args.args[0].arg
    statements = function.body
    if statements and _is_docstring(statements[0]):
        statements = statements[1:]
    return _answers(statements, param, literals, bound)


def _getattr_of(body: Sequence[ast.stmt]) -> ast.FunctionDef | None:
    """The module's one ``def __getattr__`` (at the top level, or in its
    top-level ``if``/``else`` blocks)."""
    found = []
    stack = list(body)
    while stack:
        node = stack.pop()
        match node:
            case ast.FunctionDef(name="__getattr__"):
                found.append(node)
            case ast.If(body=inner, orelse=other) | ast.Try(body=inner, orelse=other):
                stack += [*inner, *other]
    return found[0] if len(found) == 1 else None


def _literals(body: Sequence[ast.stmt]) -> dict[str, set[str] | None]:
    """Module-level name -> the strings of the literal it is bound to (a
    dict's keys); None where it is bound twice, to something else, or
    changed at the top level."""
    found: dict[str, set[str] | None] = {}
    for node in body:
        match node:
            case (
                ast.Assign(targets=[ast.Name(id=name)], value=value)
                | ast.AnnAssign(target=ast.Name(id=name), value=ast.AST() as value)
            ):
                found[name] = None if name in found else _strings(value)
    for node in body:
        for inner in ast.walk(node):
            match inner:
                case ast.Subscript(
                    value=ast.Name(id=name), ctx=ast.Store() | ast.Del()
                ):
                    found[name] = None
                case ast.Call(
                    func=ast.Attribute(value=ast.Name(id=name), attr=attr)
                ) if attr in _MUTATORS:
                    found[name] = None
                case ast.AugAssign(target=ast.Name(id=name)):
                    found[name] = None
    return found


def _strings(node: ast.AST) -> set[str] | None:
    match node:
        case ast.Dict(keys=keys):
            items: list[ast.expr | None] = list(keys)
        case ast.List(elts=elts) | ast.Tuple(elts=elts) | ast.Set(elts=elts):
            items = list(elts)
        case _:
            return None
    strings = {
        item.value
        for item in items
        if isinstance(item, ast.Constant) and isinstance(item.value, str)
    }
    return strings if len(strings) == len(items) else None


def _guard(
    test: ast.expr,
    param: str,
    literals: dict[str, set[str] | None],
    bound: set[str],
) -> tuple[bool, set[str]] | None:
    """A test of the known shape: (True, names) for ``param`` among
    ``names``, (False, names) for not among them; None for another test."""
    match test:
        case ast.Compare(
            left=ast.Name(id=left),
            ops=[ast.Eq()],
            comparators=[ast.Constant(value=str() as one)],
        ) if left == param:
            return True, {one}
        case ast.Compare(
            left=ast.Name(id=left),
            ops=[ast.In() | ast.NotIn() as op],
            comparators=[among],
        ) if left == param:
            names = _among(among, literals, bound)
            return None if names is None else (isinstance(op, ast.In), names)
        case ast.BoolOp(op=ast.Or(), values=values):
            guards = [_guard(v, param, literals, bound) for v in values]
            if all(g is not None and g[0] for g in guards):
                return True, set().union(*(g[1] for g in guards if g))
    return None


def _among(
    node: ast.expr, literals: dict[str, set[str] | None], bound: set[str]
) -> set[str] | None:
    match node:
        case ast.Call(func=ast.Name(id="globals"), args=[], keywords=[]):
            return set(bound)
        case ast.Name(id=name):
            return literals.get(name)
    return _strings(node)


def _answers(
    statements: Sequence[ast.stmt],
    param: str,
    literals: dict[str, set[str] | None],
    bound: set[str],
) -> set[str] | None:
    """The names ``statements`` answer: a name outside them meets a raise."""
    for index, node in enumerate(statements):
        match node:
            case ast.Import() | ast.ImportFrom() | ast.Global():
                continue
            case ast.Raise():
                return set()
            case ast.If(test=test, body=body, orelse=orelse):
                guard = _guard(test, param, literals, bound)
                if guard is None:
                    return None
                letting, names = guard
                rest = [*orelse, *statements[index + 1 :]]
                if letting:  # the body answers these; the others go on
                    others = _answers(rest, param, literals, bound)
                    return None if others is None else names | others
                # ``not in``: where its body raises, only ``names`` get past
                return (
                    names if _answers(body, param, literals, bound) == set() else None
                )
        return None
    return None  # falling off the end answers None for any name


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )

"""Which changed units a test executed, told by running it, not by reading it.

``impact.py`` selects a release's tests statically: a test that names a
class whose changed method it may call. Whether it called it is told only
at run time. For the patched tree's run, verify gives the results plugin
(``pytest_results.py``) the lines of each changed function and method as
that tree has them (:func:`watched_lines`); the plugin traces each test
(``sys.settrace``, only frames of those files look at their lines) and
reports the changed units it executed. A test that passes on both trees
and executed none is no evidence for the fix: ``release_tests.py`` counts it
apart (``did not reach the changed code``).

Only code that runs when called is watched: a module-level statement, a
class attribute or an import runs when the module is first imported, which
in a run shared by many tests is whichever test imported it first. A test
that reaches such a unit keeps its static selection, as before.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from deepstack_patch.proof.pytest_results import WATCH_OPTION
from deepstack_patch.proof.reaching import ChangedUnit, read_text

#: The kinds of unit whose lines run when called (the others at import).
CALLED = ("function", "method", "class")


def watched_lines(
    tree: Path, units: Iterable[ChangedUnit]
) -> dict[str, list[tuple[int, int, str]]]:
    """Per file of the tree, the line ranges of each changed function and
    method as the tree has it (``(first, last, part)``: its body, not its
    ``def`` line, which runs at import); a class's methods for a changed
    class. A unit that cannot be found (or runs at import) is left out."""
    watched: dict[str, list[tuple[int, int, str]]] = {}
    parsed: dict[str, ast.Module | None] = {}
    for unit in units:
        if unit.kind not in CALLED:
            continue
        if unit.path not in parsed:
            parsed[unit.path] = _parse(tree / unit.path)
        module = parsed[unit.path]
        if module is None:
            continue
        for node in _functions_of(module, unit):
            first, last = node.body[0].lineno, node.end_lineno or node.lineno
            watched.setdefault(unit.path, []).append((first, last, unit.part))
    return watched


def watch_options(
    watch: Mapping[str, Sequence[tuple[int, int, str]]], folder: Path
) -> list[str]:
    """pytest's options that hand ``watch`` (:func:`watched_lines`) to the
    results plugin, through a file written in ``folder``; none where
    nothing is watched."""
    if not watch:
        return []
    path = folder / ".deepstack-watched.json"
    path.write_text(json.dumps(watch))
    return [f"{WATCH_OPTION}={path}"]


def parts_of(watched: Mapping[str, Sequence[tuple[int, int, str]]]) -> set[str]:
    """The units whose lines ``watched`` holds."""
    return {part for spans in watched.values() for *_, part in spans}


def _parse(path: Path) -> ast.Module | None:
    source = read_text(path) if path.is_file() else None
    if source is None:
        return None
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _functions_of(module: ast.Module, unit: ChangedUnit) -> list[ast.AST]:
    """The function nodes whose bodies are ``unit``'s code: the function or
    method by its dotted name, each method of a class (every definition of
    the name, as an ``if``/``else`` may hold two)."""
    scopes: list[list[ast.stmt]] = [module.body]
    found: list[ast.AST] = []
    *outer, last = unit.name.split(".")
    for name in outer:
        scopes = [node.body for node in _named(scopes, name, ast.ClassDef)]
    for node in _named(scopes, last, ast.FunctionDef | ast.AsyncFunctionDef):
        found.append(node)
    if unit.kind == "class":
        for node in _named(scopes, last, ast.ClassDef):
            found += [
                inner
                for inner in ast.walk(node)
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
    return found


def _named(scopes: list[list[ast.stmt]], name: str, kind: object) -> list:
    """The definitions of ``name`` in the blocks ``scopes`` (and in their
    ``if``/``try`` blocks, where a module defines a name two ways)."""
    found = []
    pending = [statement for body in scopes for statement in body]
    while pending:
        statement = pending.pop(0)
        match statement:
            case ast.If(body=inner, orelse=other) | ast.Try(body=inner, orelse=other):
                pending += [*inner, *other]
            case _ if isinstance(statement, kind) and statement.name == name:  # type: ignore[arg-type]
                found.append(statement)
    return found

"""The tests a pull request added or changed in one test file.

A fix's pull request usually touches one or two tests of a large upstream
test file; the rest test other things, and many need what the CPU proof
environment lacks (a GPU, a model download). ``verify`` runs only the tests
the diff added or changed, by pytest node id, so that a fix's proof is its
own tests, not the whole file's.

A test counts as changed when its own definition changed (a function
``test*`` at module level, or a method ``test*`` of a class ``Test*``), when
it is new, or when it uses a module-level definition that changed: a
fixture it names as a parameter, a helper or constant it reads, followed
through the definitions that use them. Code is compared as Python's ``ast``
reads it, so a change of formatting or comments changes no test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator


def changed_tests(before: str, after: str) -> tuple[str, ...]:
    """The node ids (below the file: ``test_x``, ``TestY::test_z``) of the
    tests in ``after`` that are new or changed since ``before`` (``""`` for a
    new file). Empty where none is, or where either text does not parse: the
    whole file then runs, as a file without names always does."""
    try:
        old, new = ast.parse(before), ast.parse(after)
    except SyntaxError:
        return ()
    old_defs, new_defs = _definitions(old), _definitions(new)
    changed = {
        name
        for name, node in new_defs.items()
        if name not in old_defs or ast.dump(old_defs[name]) != ast.dump(node)
    }
    changed = _users_of(changed, new_defs)
    old_tests = dict(_tests(old))
    found = []
    for nodeid, node in _tests(new):
        own = nodeid not in old_tests or ast.dump(old_tests[nodeid]) != ast.dump(node)
        class_name = nodeid.split("::")[0] if "::" in nodeid else ""
        if own or class_name in changed or _names_in(node) & changed:
            found.append(nodeid)
    return tuple(found)


def _definitions(module: ast.Module) -> dict[str, ast.AST]:
    """Module-level definitions by name: functions, classes, assignments."""
    found: dict[str, ast.AST] = {}
    for node in module.body:
        match node:
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                found[name] = node
            case ast.ClassDef(name=name):
                found[name] = _class_without_tests(node)
            case ast.Assign(targets=[ast.Name(id=name)]):
                found[name] = node
            case ast.AnnAssign(target=ast.Name(id=name)):
                found[name] = node
    return found


def _class_without_tests(node: ast.ClassDef) -> ast.ClassDef:
    """A test class as its tests share it (fixtures, attributes, bases): its
    own test methods are compared one by one."""
    body = [
        item
        for item in node.body
        if not (_is_test_function(item) and node.name.startswith("Test"))
    ]
    return ast.ClassDef(
        name=node.name,
        bases=node.bases,
        keywords=node.keywords,
        body=body,
        decorator_list=node.decorator_list,
        type_params=getattr(node, "type_params", []),
    )


def _users_of(changed: set[str], definitions: dict[str, ast.AST]) -> set[str]:
    """``changed`` and every definition that uses one of them, to a fixed point."""
    found = set(changed)
    grew = True
    while grew:
        grew = False
        for name, node in definitions.items():
            if name not in found and _names_in(node) & found:
                found.add(name)
                grew = True
    return found


def _tests(module: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """pytest's default collection: ``test*`` functions, ``test*`` methods of
    ``Test*`` classes, by the node id below the file."""
    for node in module.body:
        if _is_test_function(node):
            yield node.name, node  # type: ignore[attr-defined]
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if _is_test_function(item):
                    yield f"{node.name}::{item.name}", item  # type: ignore[attr-defined]


def _is_test_function(node: ast.AST) -> bool:
    match node:
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
            return name.startswith("test")
    return False


def _names_in(node: ast.AST) -> set[str]:
    """The names a definition reads, and its parameters (fixtures by name)."""
    found = set()
    for child in ast.walk(node):
        match child:
            case ast.Name(id=name):
                found.add(name)
            case ast.arg(arg=name):
                found.add(name)
            case ast.Attribute(value=ast.Name(id=name)):
                found.add(name)
    return found

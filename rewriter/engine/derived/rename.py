"""A derived patch's function matched up to a renaming of its locals.

A vendor may rename a local variable of the function a fix changes, every
use of it. The statements the fix must find (the headers on the way to its
blocks, the statements it removes or replaces, its anchors, and for
``applied`` the ones it inserts) then differ from the recorded ones only in
that name. :func:`renaming_of` finds the renaming the target shows: each
such statement is compared with every statement of the target function that
has the same shape up to names; where the names differ, both must be local
to their function (bound in its own scope: never a parameter, a global, an
import, a name a nested scope uses), the recorded one absent from the
target function and the target's absent from the recorded function. Every
pair found must agree, one to one; a name matched to two names, or two
names to one, is a conflict and the unit drifts. Nothing is guessed from a
single statement: recognition then runs on the target function renamed
back (:func:`renamed_back`), so every statement must still be found where
the fix expects it, and the rewrite writes the inserted statements under
the same renaming (:func:`renamed_code`).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator, Mapping, Sequence

from deepstack_patch.engine.derived import shapes
from deepstack_patch.engine.derived.match import CompiledEdit, one_statement, with_block

#: Nodes that open a scope of their own inside a function.
NESTED_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)

Renaming = dict[str, str]


def function_of(tree: ast.Module, compiled: CompiledEdit) -> ast.AST | None:
    """The function a unit's edit is in (the last ``def`` on its way)."""
    block: list[ast.stmt] = tree.body
    function: ast.AST | None = None
    for identity, field_name, _ in compiled.steps:
        found = [node for node in block if shapes.identity(node) == identity]
        if len(found) != 1:
            return None if identity.startswith(("def ", "class ")) else function
        node = found[0]
        match node:
            case ast.FunctionDef() | ast.AsyncFunctionDef():
                function = node
            case ast.ClassDef():
                pass
            case _:
                return function
        inner = getattr(node, field_name, None)
        if not isinstance(inner, list):
            return function
        block = inner
    return function


def local_names(function: ast.AST) -> set[str]:
    """The names every use of which in the function is one of its own
    variables, so that renaming all of them changes nothing: bound in its own
    scope, or only ever used inside the comprehensions that bind them. Never
    a parameter (its own or a nested one's), a ``global``/``nonlocal``, an
    import, an ``except ... as``, a ``:=`` target, a pattern capture, a
    nested definition's name, or a name a nested class uses."""
    excluded: set[str] = set()
    comprehension_bound: dict[str, list[ast.AST]] = {}
    for node in ast.walk(function):
        match node:
            case ast.arg(arg=name) | ast.ExceptHandler(name=str() as name):
                excluded.add(name)
            case ast.Global(names=names) | ast.Nonlocal(names=names):
                excluded.update(names)
            case ast.Import(names=aliases) | ast.ImportFrom(names=aliases):
                excluded.update((a.asname or a.name).split(".")[0] for a in aliases)
            case ast.NamedExpr(target=ast.Name(id=name)):
                excluded.add(name)
            case ast.MatchAs(name=str() as name) | ast.MatchStar(name=str() as name):
                excluded.add(name)
            case ast.ClassDef():
                excluded |= names_in(node)
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                excluded.add(name)
            case ast.ListComp() | ast.SetComp() | ast.DictComp() | ast.GeneratorExp():
                for generator in node.generators:
                    for target in ast.walk(generator.target):
                        if isinstance(target, ast.Name):
                            comprehension_bound.setdefault(target.id, []).append(node)
    own = {
        node.id
        for node in _own_scope(function)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }
    inner = {
        name
        for name, comprehensions in comprehension_bound.items()
        if name not in own and _only_inside(function, name, comprehensions)
    }
    return (own | inner) - excluded


def _only_inside(function: ast.AST, name: str, comprehensions: list[ast.AST]) -> bool:
    """Whether every use of ``name`` is inside a comprehension binding it
    (its first iterable is evaluated outside it: not inside)."""

    def uses(node: ast.AST) -> set[int]:
        return {
            id(n) for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name
        }

    covered: set[int] = set()
    for comprehension in comprehensions:
        first = comprehension.generators[0].iter  # type: ignore[attr-defined]
        covered |= uses(comprehension) - uses(first)
    return uses(function) <= covered


def _own_scope(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of the function's body, a nested scope's node included but
    not what is inside it."""
    pending: list[ast.AST] = list(getattr(function, "body", []))
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, NESTED_SCOPES):
            pending.extend(ast.iter_child_nodes(node))


def names_in(node: ast.AST) -> set[str]:
    """Every variable the code names: names, parameters, imports, definitions
    (not attributes or keywords: ``x.n`` and ``f(n=...)`` are no variable)."""
    found: set[str] = set()
    for child in ast.walk(node):
        match child:
            case (
                ast.Name(id=name) | ast.arg(arg=name) | ast.alias(asname=str() as name)
            ):
                found.add(name)
            case ast.alias(name=name):
                found.add(name.split(".")[0])
            case ast.Global(names=names) | ast.Nonlocal(names=names):
                found.update(names)
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                found.add(name)
            case ast.ClassDef(name=name) | ast.ExceptHandler(name=str() as name):
                found.add(name)
            case ast.MatchAs(name=str() as name) | ast.MatchStar(name=str() as name):
                found.add(name)
    return found


def _skeleton(node: ast.stmt, header_only: bool) -> tuple[str, list[str]]:
    """The statement's key with every name blanked, and its names in order."""
    blank = copy.deepcopy(node)
    if header_only:
        for name in shapes.BLOCK_FIELDS:
            if isinstance(getattr(blank, name, None), list):
                setattr(blank, name, [])
    names = []
    for child in ast.walk(blank):
        if isinstance(child, ast.Name):
            names.append(child.id)
            child.id = "_"
    return shapes.shape(blank), names


def _patterns(compiled: CompiledEdit) -> Iterator[list[tuple[ast.stmt, bool]]]:
    """The recorded statements the edit must find, each run of consecutive
    ones a pattern (bool: compared by header only)."""
    for identity, _, code in compiled.steps:
        if not identity.startswith(("def ", "class ")):
            yield [(one_statement(with_block(code)), True)]
    edit = compiled.edit
    around = []
    for anchor in (edit.before_anchor, edit.after_anchor):
        node = one_statement(anchor.code) if anchor is not None else None
        header_only = anchor is not None and anchor.match == "header"
        around.append([(node, header_only)] if node is not None else [])
    removed = [(n, False) for n in shapes.parse_statements(edit.removed)]
    yield [*around[0], *removed, *around[1]] if compiled.anchored else removed
    yield [(n, False) for n in shapes.parse_statements(edit.inserted)]
    if followed(compiled) and edit.kind == "header":  # an `if`'s, the fix's own
        yield [(one_statement(with_block(edit.header_after)), True)]


def renaming_of(
    edits: Sequence[CompiledEdit], recorded: ast.AST, target: ast.AST
) -> Renaming | str:
    """The renaming (recorded name -> target name) the target function shows
    for every statement the edits must find, or why there is none that is
    one to one (a conflict). Empty where the names are the same.

    A pattern (consecutive statements) found in several places of the
    target with different names is no evidence; all the others must agree.
    """
    recorded_locals, target_locals = local_names(recorded), local_names(target)
    recorded_names, target_names = names_in(recorded), names_in(target)

    def renamable(old: str, new: str) -> bool:
        return old == new or (
            old in recorded_locals
            and new in target_locals
            and old not in target_names
            and new not in recorded_names
        )

    blocks = list(shapes.blocks_of(target))
    keys: dict[tuple[int, bool], tuple[str, list[str]]] = {}
    pairs: dict[str, str] = {}
    for compiled in edits:
        for pattern in _patterns(compiled):
            found = _renamings(pattern, blocks, keys)
            valid = {f for f in found if all(renamable(o, n) for o, n in f)}
            if len(valid) != 1:
                continue  # not there, or there under several names: no evidence
            for old, new in next(iter(valid)):
                evidence = old in recorded_locals or new in target_locals
                if evidence and pairs.setdefault(old, new) != new:
                    return _conflict(old, pairs[old], new)
    inverse: dict[str, str] = {}
    for old, new in pairs.items():
        if inverse.setdefault(new, old) != old:
            return _conflict(new, inverse[new], old, backwards=True)
    return {old: new for old, new in pairs.items() if old != new}


def _renamings(
    pattern: list[tuple[ast.stmt, bool]],
    blocks: list[list[ast.stmt]],
    keys: dict[tuple[int, bool], tuple[str, list[str]]],
) -> set[frozenset[tuple[str, str]]]:
    """The name pairs of each place where ``pattern`` is found up to names."""
    if not pattern:
        return set()
    wanted = [_skeleton(node, header_only) for node, header_only in pattern]
    found = set()
    for block in blocks:
        for start in range(len(block) - len(pattern) + 1):
            pairs: set[tuple[str, str]] = set()
            for offset, (key, names) in enumerate(wanted):
                node, header_only = block[start + offset], pattern[offset][1]
                cached = keys.get((id(node), header_only))
                if cached is None:
                    cached = keys[(id(node), header_only)] = _skeleton(
                        node, header_only
                    )
                if cached[0] != key or len(cached[1]) != len(names):
                    break
                pairs.update(zip(names, cached[1], strict=True))
            else:
                found.add(frozenset(pairs))
    return found


def _conflict(name: str, first: str, second: str, backwards: bool = False) -> str:
    if backwards:
        return (
            f"renaming conflict: the target's `{name}` stands for both "
            f"`{first}` and `{second}` of the fix; not renamed"
        )
    return (
        f"renaming conflict: the fix's `{name}` is `{first}` in one statement "
        f"of the target and `{second}` in another; not renamed"
    )


def collision(
    edits: Sequence[CompiledEdit],
    recorded: ast.AST,
    target: ast.AST,
    renaming: Mapping[str, str],
) -> str:
    """Why the inserted statements cannot be written under ``renaming``: a
    name the fix brings that the target function already uses, or a local
    of the fix's function they read that the target does not have."""
    recorded_names, target_names = names_in(recorded), names_in(target)
    recorded_locals = local_names(recorded)
    for compiled in edits:
        for node in _written(compiled):
            for name in sorted(names_in(node)):
                if name in renaming:
                    continue
                if name not in recorded_names and name in target_names:
                    return (
                        f"the fix introduces `{name}`, which the target function "
                        "already uses (its locals are renamed); not written"
                    )
                if name in recorded_locals and name not in target_names:
                    return (
                        f"the fix uses the local `{name}`, which the target "
                        "function (its locals renamed) does not have"
                    )
    return ""


def followed(compiled: CompiledEdit) -> bool:
    """Whether an edit is matched up to a renaming: a body edit, or the
    header of an ``if``/``for``/``while``/``with`` (a definition's header
    names no locals of its own)."""
    edit = compiled.edit
    return edit.kind == "body" or (
        edit.kind == "header"
        and not compiled.steps[-1][0].startswith(("def ", "class "))
    )


def _written(compiled: CompiledEdit) -> list[ast.stmt]:
    """The statements the edit writes (a header edit: its header after)."""
    if compiled.edit.kind == "header":
        return [one_statement(with_block(compiled.edit.header_after))]
    return shapes.parse_statements(compiled.edit.inserted)


class Rename(ast.NodeTransformer):
    def __init__(self, renaming: Mapping[str, str]) -> None:
        self.renaming = renaming

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.renaming.get(node.id, node.id)
        return node


def renamed_back(
    tree: ast.Module, function: ast.AST, renaming: Mapping[str, str]
) -> ast.Module:
    """A copy of ``tree`` whose ``function`` has the fix's names (target name
    -> recorded name); positions kept. Only ``function`` and the statements
    that hold it are copied, the rest is shared with ``tree`` (read, never
    changed): a deep copy of a 2,000-line model file per renamed function
    was a tenth of a drift corpus's time."""
    inverse = {new: old for old, new in renaming.items()}
    renamed = copy.deepcopy(function)
    Rename(inverse).visit(renamed)
    copied = _with_replaced(tree, function, renamed)
    assert isinstance(copied, ast.Module), "the function is not in its tree"
    return copied


def _with_replaced(node: ast.AST, old: ast.AST, new: ast.AST) -> ast.AST | None:
    """A shallow copy of ``node`` with ``new`` where ``old`` stood, copying
    only the statements on the way down; None where ``old`` is not a
    statement inside ``node``."""
    if node is old:
        return new
    for field, value in ast.iter_fields(node):
        if not isinstance(value, list):
            continue
        for index, child in enumerate(value):
            match child:
                case ast.stmt() | ast.excepthandler() | ast.match_case():
                    replaced = _with_replaced(child, old, new)
                case _:
                    continue
            if replaced is not None:
                clone = copy.copy(node)
                setattr(clone, field, [*value[:index], replaced, *value[index + 1 :]])
                return clone
    return None


def renamed_code(code: str, renaming: Mapping[str, str]) -> str:
    """``code`` with its names renamed in place (comments and layout kept)."""
    if not renaming or not code.strip():
        return code
    lines = code.splitlines(keepends=True)
    spots = sorted(
        (
            (node.lineno, node.col_offset, node.end_col_offset or 0, node.id)
            for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Name) and node.id in renaming
        ),
        reverse=True,
    )
    for line, start, end, name in spots:
        text = lines[line - 1].encode()
        lines[line - 1] = (text[:start] + renaming[name].encode() + text[end:]).decode()
    return "".join(lines)

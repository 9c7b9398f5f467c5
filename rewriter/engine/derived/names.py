"""Whether the code a derived patch writes can run in its target: every name
its new statements read is there (issue 30, item 1).

A fix's inserted statements (and a changed header) may read names its
removed statements did not. Before a unit is called ``needed``, each such
name must be, in the target file: a builtin; a local of the function (its
parameters, any name bound in it or in the fix's own statements, theirs and
their comprehensions' and lambdas' included); a global or an import of the
file; or a name the patch itself adds there (a new definition or module
statement, an import it adds). Where the tree being recognised is known
(:func:`deepstack_patch.engine.tree.tree_context`, which the plan sets), a
name the fix imports from a ``vllm`` module, and an attribute it reads off an
imported ``vllm`` module (``envs.X``, ``vllm.a.b.f``), must be defined,
imported or a submodule there, as the tree's file of that module has it.

Nothing undecidable is refused: a file or module with a ``*`` import or a
module ``__getattr__`` accepts every name; a module the tree does not have
is judged missing only where the tree would have it
(:meth:`~deepstack_patch.engine.tree.TreeContext.lacks`: a whole tree, or a
partial extraction asked for it, as it is for the modules a derived patch
reads, :mod:`.reads`); attributes of objects (``self.x``, ``cls.x``,
a config's fields) and names of modules outside ``vllm`` are not checked.
docs/derive.md says the same.

:func:`settle` also makes a file's states whole (item 3): imports alone never
make a patch ``applied`` or ``needed``; code units all absent leave nothing
(not-applicable); some absent and some there drift.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deepstack_patch.engine.context import TreeContext, tree_context
from deepstack_patch.engine.derived import shapes
from deepstack_patch.engine.derived.data import Edit, Unit, new_modules
from deepstack_patch.engine.derived.declared import declared_names
from deepstack_patch.engine.derived.match import (
    bound_name,
    code_nodes,
    import_aliases,
    one_statement,
    with_block,
)
from deepstack_patch.engine.derived.never import imports_alone, is_there
from deepstack_patch.engine.derived.shapes import statements_in
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.source import SourceFile

#: Names every module has without binding them.
_IMPLICIT = frozenset(dir(builtins)) | {
    "__file__",
    "__name__",
    "__doc__",
    "__spec__",
    "__package__",
    "__loader__",
    "__path__",
    "__builtins__",
    "__annotations__",
    "__class__",  # a method's implicit cell (super())
    "__module__",
    "__qualname__",
}


class _State(Protocol):
    state: PatchState
    reason: str
    details: dict[str, Any]


class DerivedPatch(Protocol):
    """What is read of a :class:`~deepstack_patch.engine.derived.DerivedPatch`
    (named here without importing it: derived imports this module)."""

    id: str
    units: tuple[Unit, ...]

    def unit_states(
        self, tree: ast.Module, path: str
    ) -> Mapping[str, _State | None]: ...


# -- the states of one file, made whole -----------------------------------------


def settle(
    patch: DerivedPatch,
    units: Sequence[Unit],
    states: Mapping[str, _State | None],
    tree: ast.Module,
    path: str,
) -> dict[str, _State | None]:
    """``states`` (unit part -> state, None where absent) as the patch
    reports them: whole, importing nothing alone, reading only names that
    resolve."""
    settled = dict(states)
    # Documentation never holds the code back, nor stands for it
    # (engine/whole.py settles it across the patch's files).
    code = [
        unit for unit in units if unit.kind != "import" and not unit.documentation_only
    ]
    imports = [unit for unit in units if unit.kind == "import"]
    if code:
        code_states = [states[unit.part] for unit in code]
    else:  # an imports-only file: the patch's code is in its other files
        code_states = _code_states_elsewhere(patch, path)
    present = [s for s in code_states or () if is_there(s)]
    _documentation_of_absent_code(patch, units, code, settled, path)
    if code_states and not present:
        # No code of the fix here: its imports alone are nothing to do.
        for unit in imports:
            settled[unit.part] = imports_alone(unit, states[unit.part], tree, path)
        return settled
    absent = [unit for unit in code if states[unit.part] is None]
    for unit in code:
        state = states[unit.part]
        if absent and is_there(state):
            settled[unit.part] = dataclasses.replace(
                state,
                state=PatchState.DRIFTED,
                reason=f"{absent[0].description} is absent while {unit.name} "
                "is there: a derived patch applies whole or not at all",
            )
    if present and all(s.state is PatchState.APPLIED for s in present):
        for unit in imports:  # the fix is in: nothing to import for it
            state = states[unit.part]
            if state is not None and state.state is PatchState.NEEDED:
                settled[unit.part] = dataclasses.replace(
                    state, state=PatchState.APPLIED, details={}
                )
    needed = [
        unit
        for unit in code
        if (s := settled[unit.part]) is not None and s.state is PatchState.NEEDED
    ]
    importing = not code and any(
        s is not None and s.state is PatchState.NEEDED for s in settled.values()
    )
    why = unresolved(patch, needed, settled, tree, path) if needed or importing else ""
    if why:
        for part, state in settled.items():
            if state is not None and state.state is PatchState.NEEDED:
                settled[part] = dataclasses.replace(
                    state, state=PatchState.DRIFTED, reason=why, details={}
                )
    return settled


def _documentation_of_absent_code(
    patch: DerivedPatch,
    units: Sequence[Unit],
    code: Sequence[Unit],
    settled: dict[str, _State | None],
    path: str,
) -> None:
    """The documentation units of ``path`` not applicable where some of the
    fix's code is not in the tree (here, or in its other files): the patch
    then has nothing to do, or refuses (engine/whole.py), and documentation
    alone never makes it needed or applied. (Its rewrite is computed before
    the patch is judged whole: a docstring left needed here would be written
    while the patch says it is not applicable.)"""
    documentation = [unit for unit in units if unit.documentation_only]
    if not documentation:
        return
    states = [settled[unit.part] for unit in code]
    states += _code_states_elsewhere(patch, path) or []
    if not states or all(is_there(state) for state in states):
        return  # the fix's code is there, or it has none: documentation alone
    for unit in documentation:
        state = settled[unit.part]
        if state is not None and state.state in (PatchState.NEEDED, PatchState.APPLIED):
            settled[unit.part] = dataclasses.replace(
                state,
                state=PatchState.NOT_APPLICABLE,
                reason="documentation of a fix whose code is not in this release",
                details={},
            )


def _code_states_elsewhere(
    patch: DerivedPatch, path: str
) -> list[_State | None] | None:
    """The states of the patch's code units in its other files, read from the
    tree being recognised; None where no tree is known, or the patch has no
    code at all (its imports then stand for themselves)."""
    context = tree_context()
    code = [u for u in patch.units if u.kind != "import" and not u.documentation_only]
    others = sorted({u.path for u in code} - {path})
    if context is None or not others:
        return None
    found: list[_State | None] = []
    for other in others:
        if other in getattr(patch, "whole_files", ()):  # a file it adds or deletes
            found += patch.whole_file_states(other) or [None]  # type: ignore[attr-defined]
            continue
        if not context.is_file(other):  # its code is absent
            found += [None for u in code if u.path == other]
            continue
        tree = _parsed(context, other)
        if tree is None:
            return None  # unreadable here: undecidable, the file decides
        states = patch.unit_states(tree, other)
        found += [states[u.part] for u in code if u.path == other]
    return found


# -- the names the fix reads ----------------------------------------------------


def unresolved(
    patch: DerivedPatch,
    needed: Sequence[Unit],
    states: Mapping[str, _State | None],
    tree: ast.Module,
    path: str,
) -> str:
    """Why the needed units' fix cannot run in ``tree``: the first name it
    reads that is not there; empty where every name resolves."""
    context = tree_context()
    file_names, stars, (top, inner) = _file_facts(tree)
    patch_names = _patch_bindings(patch, path)
    # The modules the file imports, and those the patch's imports add to it
    # (at the top level: read after the file's own there, before those in
    # its blocks, as a walk of the module with them would).
    imported = imported_modules([*top, *added_imports(patch, path), *inner], path)
    for unit in needed:
        state = states[unit.part]
        renaming: Mapping[str, str] = state.details.get("renaming", {}) if state else {}
        scope = _scope_bindings(unit, tree)
        new_code = [code_nodes(e.inserted, e.header_after) for e in unit.edits]
        old_code = [code_nodes(e.removed, e.header_before) for e in unit.edits]
        new_nodes = [n for nodes in new_code for n in nodes]
        old_nodes = [n for nodes in old_code for n in nodes]
        local = scope | bound_in(new_nodes, nested=True)
        known = local | file_names | patch_names | _IMPLICIT
        if not stars:
            for name in sorted(reads(new_nodes) - reads(old_nodes)):
                if name not in known and renaming.get(name) not in known:
                    return (
                        f"the fix reads `{name}`, which {path} does not define "
                        "or import"
                    )
        if context is None:
            continue
        aliases = [
            a
            for a in import_aliases(imports_in(new_nodes))
            if a not in import_aliases(imports_in(old_nodes))
        ]
        why = _missing_import(context, patch, aliases, path)
        if why:
            return why
        modules = {**imported, **imported_modules(imports_in(new_nodes), path)}
        chains = attribute_chains(new_nodes) - attribute_chains(old_nodes)
        for chain in sorted(chains):
            if chain[0] in modules and chain[0] not in scope:
                why = _missing_attribute(context, patch, modules[chain[0]], chain[1:])
                if why:
                    return why
    if context is None:
        return ""
    return _missing_import(context, patch, _added_aliases(states, patch, path), path)


def _file_facts(
    tree: ast.Module,
) -> tuple[frozenset[str], bool, tuple[list[ast.stmt], list[ast.stmt]]]:
    """The names ``tree`` binds at its top level, whether it imports ``*``,
    and its import statements, those of its top level and then those in its
    blocks (in :func:`imports_in`'s order): once per tree in a plan, each a
    walk of every statement of the file, asked again by every patch of the
    file and every pass."""
    context = tree_context()
    key = ("file facts", id(tree))
    kept = context.on_disk.get(key) if context is not None else None
    if isinstance(kept, tuple) and kept[0] is tree:  # the tree's id is its own
        return kept[1]
    imports = imports_in(tree.body)  # the top level's first: breadth first
    top = sum(isinstance(node, ast.Import | ast.ImportFrom) for node in tree.body)
    found = (
        frozenset(bound_in(tree.body, nested=False)),
        _has_star_import(tree.body),
        (imports[:top], imports[top:]),
    )
    if context is not None:
        context.on_disk[key] = (tree, found)
    return found


def _scope_bindings(unit: Unit, tree: ast.Module) -> set[str]:
    """Every name bound in the outermost definition the unit's edits are in
    (its parameters and all its locals, nested ones included: more than the
    scope, never less); empty for a module-level edit."""
    outermost: dict[int, ast.stmt] = {}
    for edit in unit.edits:
        if not edit.block:
            continue
        identity = shapes.identity(one_statement(with_block(edit.block[0].header)))
        for node in tree.body:
            if isinstance(node, shapes.DEFINITIONS) and (
                shapes.identity(node) == identity
            ):
                outermost[id(node)] = node
    found: set[str] = set()
    for node in outermost.values():
        found |= _bound_in_definition(node)
    return found


def _bound_in_definition(node: ast.stmt) -> frozenset[str]:
    """``bound_in([node], nested=True)``, once per node in a plan: every
    method a fix changes in a class walks the whole class (thousands of
    lines in vLLM's model runner), and a file's tree is shared by every
    patch that reads the same bytes."""
    context = tree_context()
    if context is None:
        return frozenset(bound_in([node], nested=True))
    key = ("bound in a definition", id(node))
    kept = context.on_disk.get(key)
    if isinstance(kept, tuple) and kept[0] is node:  # the node's id is its own
        return kept[1]
    found = frozenset(bound_in([node], nested=True))
    context.on_disk[key] = (node, found)
    return found


def _patch_bindings(patch: DerivedPatch, path: str) -> set[str]:
    """The module-level names the patch binds in ``path``: its new
    definitions and module statements, and the names its imports add."""
    found: set[str] = set()
    for unit in getattr(patch, "units", ()):  # a hand-written one: unknown
        if unit.path != path:
            continue
        for edit in unit.edits:
            if edit.kind == "imports":  # what it adds, not its context
                found |= {bound_name(alias) for alias in wanted_imports(edit)}
            elif edit.kind != "header" and not any(
                isinstance(one_statement(with_block(step.header)), shapes.DEFINITIONS)
                for step in edit.block
            ):  # at the top level, or in its `if`/`try` blocks
                found |= bound_in(shapes.parse_statements(edit.inserted), nested=False)
    return found


def _added_aliases(
    states: Mapping[str, _State | None], patch: DerivedPatch, path: str
) -> list[tuple[str, str, int, str, str]]:
    """The imports the patch's import edits will add to ``path``."""
    added: list[tuple[str, str, int, str, str]] = []
    for unit in patch.units:
        state = states.get(unit.part)
        if unit.path != path or unit.kind != "import" or state is None:
            continue
        if state.state is not PatchState.NEEDED:
            continue
        for details in state.details.values():
            if isinstance(details, Mapping):
                added += [tuple(a) for a in details.get("add", ())]  # type: ignore[misc]
    return added


def added_imports(patch: DerivedPatch, path: str) -> list[ast.stmt]:
    """The import statements of the patch's import edits in ``path``."""
    return [
        node
        for unit in patch.units
        if unit.path == path
        for edit in unit.edits
        if edit.kind == "imports"
        for node in shapes.parse_statements(edit.inserted)
    ]


def wanted_imports(edit: Edit) -> list[tuple[str, str, int, str, str]]:
    """The names an import edit brings: those of its new statements that its
    old ones did not import (a name on a context line is never added)."""
    before = set(import_aliases(shapes.parse_statements(edit.removed)))
    return [
        alias
        for alias in import_aliases(shapes.parse_statements(edit.inserted))
        if alias not in before
    ]


# -- reading the code -------------------------------------------------------------


def reads(nodes: Iterable[ast.AST]) -> set[str]:
    """The names ``nodes`` read."""
    return {
        node.id
        for root in nodes
        for node in ast.walk(root)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def attribute_chains(nodes: Iterable[ast.AST]) -> set[tuple[str, ...]]:
    """``a.b.c`` as ``("a", "b", "c")``, for every attribute read off a name."""
    found: set[tuple[str, ...]] = set()
    for root in nodes:
        for node in ast.walk(root):
            chain: list[str] = []
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if chain and isinstance(node, ast.Name):
                found.add((node.id, *reversed(chain)))
    return found


def bound_in(nodes: Iterable[ast.AST], *, nested: bool) -> set[str]:
    """The names ``nodes`` bind; with ``nested``, also inside the functions,
    classes and lambdas among them (else only their names, and what their
    ``global`` statements declare)."""
    # Every node of a class thousands of lines long is visited (a fix in a
    # method of vLLM's model runner): a name, a constant or an operator,
    # most of them, is told by its type before the match, and children
    # are read off the node's fields, not through ast.iter_child_nodes.
    found: set[str] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is not ast.Load:  # type: ignore[attr-defined]
                found.add(node.id)  # type: ignore[attr-defined]
            continue
        if kind is ast.Constant or kind in _BIND_NOTHING:
            continue
        match node:
            case (
                ast.FunctionDef(name=name)
                | ast.AsyncFunctionDef(name=name)
                | ast.ClassDef(name=name)
            ):
                found.add(name)
                if not nested:
                    for inner in statements_in([node]):
                        if isinstance(inner, ast.Global):
                            found.update(inner.names)
                    continue
            case ast.Lambda() if not nested:
                continue
            case ast.arg(arg=name):
                found.add(name)
            case ast.alias(name=name, asname=asname) if name != "*":
                found.add(asname or name.split(".")[0])
            case (
                ast.ExceptHandler(name=str() as name)
                | ast.MatchAs(name=str() as name)
                | ast.MatchStar(name=str() as name)
                | ast.MatchMapping(rest=str() as name)
            ):
                found.add(name)
            case ast.Global(names=names) | ast.Nonlocal(names=names):
                found.update(names)
        for field in kind._fields:
            value = getattr(node, field, None)
            if type(value) is list:
                stack.extend([item for item in value if isinstance(item, ast.AST)])
            elif isinstance(value, ast.AST):
                stack.append(value)
    return found


#: Nodes that hold nothing (a name's context, an operator): they bind nothing.
_BIND_NOTHING = frozenset(
    kind
    for kind in vars(ast).values()
    if isinstance(kind, type)
    and issubclass(
        kind, (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)
    )
)


def imports_in(nodes: Iterable[ast.AST]) -> list[ast.stmt]:
    return [
        node
        for node in statements_in(nodes)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]


def _has_star_import(body: Sequence[ast.stmt]) -> bool:
    return any(
        isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
        for node in statements_in(body)
    )


def absolute_module(module: str, level: int, path: str) -> str:
    """The dotted module an import in the file ``path`` names."""
    if not level:
        return module
    package = path.split("/")[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join([*package, *([module] if module else [])])


def imported_modules(body: Iterable[ast.AST], path: str) -> dict[str, str]:
    """Name -> dotted module, for the names imports bind to a ``vllm`` module
    (``import vllm.envs as envs``, ``import vllm``, ``from vllm import envs``:
    the last one a module only where the tree has it as one)."""
    found: dict[str, str] = {}
    for kind, module, level, name, asname in import_aliases(imports_in(body)):
        if kind == "import":
            dotted = name if asname else name.split(".")[0]
        else:
            dotted = f"{absolute_module(module, level, path)}.{name}"
        if dotted.split(".")[0] == "vllm":
            found[bound_name((kind, module, level, name, asname))] = dotted
    return found


# -- the modules of the tree ------------------------------------------------------


@dataclass(frozen=True)
class _Module:
    """What one module of the tree binds at its top level."""

    names: frozenset[str]
    package: Path | None  # its folder, where it is a package
    open: bool  # a module __getattr__ or a * import: any name may be there

    def has(self, name: str, context: TreeContext) -> bool:
        """Whether ``name`` is bound here, or may be a submodule: one the
        tree has, or one a partial extraction cannot tell about."""
        if self.open or name in self.names:
            return True
        if self.package is None:
            return False
        folder = self.package.relative_to(context.root).as_posix()
        return context.is_dir(f"{folder}/{name}") or not (
            context.lacks(f"{folder}/{name}.py")
            and context.lacks(f"{folder}/{name}/__init__.py")
        )


#: A module the tree cannot tell about (a partial extraction).
_UNKNOWN = _Module(frozenset(), None, True)


def _module(
    context: TreeContext, dotted: str, seen: frozenset[str] = frozenset()
) -> _Module | None:
    """The tree's module ``dotted``; None where a whole tree lacks it."""
    key = ("module", dotted)
    if key in context.memo:
        return context.memo[key]
    base = context.root.joinpath(*dotted.split("."))
    relpath = "/".join(dotted.split("."))
    package: Path | None = None
    if context.is_file(f"{relpath}/__init__.py"):
        file, package = f"{relpath}/__init__.py", base
    elif context.is_file(f"{relpath}.py"):
        file = f"{relpath}.py"
    elif not context.lacks(f"{relpath}/__init__.py"):
        # A partial extraction not asked for the module: it cannot tell.
        context.memo[key] = _UNKNOWN
        return context.memo[key]
    elif context.is_dir(relpath):  # a namespace package: its submodules only
        context.memo[key] = _Module(frozenset(), base, False)
        return context.memo[key]
    else:  # not in the release (a whole tree, or asked for and not there)
        context.memo[key] = None if context.lacks(f"{relpath}.py") else _UNKNOWN
        return context.memo[key]
    tree = _parsed(context, file)
    if tree is None:
        found: _Module | None = _UNKNOWN
    else:
        found = _module_of(context, tree, dotted, package, seen | {dotted})
    context.memo[key] = found
    return found


def _module_of(
    context: TreeContext,
    tree: ast.Module,
    dotted: str,
    package: Path | None,
    seen: frozenset[str],
) -> _Module:
    names = bound_in(tree.body, nested=False) | _all_of(tree.body)
    # A __getattr__ answers any name, unless it declares them (vllm.envs).
    declared = declared_names(tree.body, names) if "__getattr__" in names else None
    is_open = "__getattr__" in names and declared is None
    names |= declared or set()
    relpath = "/".join(dotted.split(".")) + ("/__init__.py" if package else ".py")
    for node in imports_in(tree.body):
        if not isinstance(node, ast.ImportFrom) or node.names[0].name != "*":
            continue
        source = absolute_module(node.module or "", node.level or 0, relpath)
        star = (
            _module(context, source, seen)
            if source.split(".")[0] == "vllm" and source not in seen
            else _UNKNOWN
        )
        if star is None or star.open:
            is_open = True
        else:
            names |= star.names
    return _Module(frozenset(names), package, is_open)


def _all_of(body: Sequence[ast.stmt]) -> set[str]:
    """The words of the module's ``__all__`` (a list or tuple of strings)."""
    found: set[str] = set()
    for node in body:
        match node:
            case (
                ast.Assign(
                    targets=[ast.Name(id="__all__")],
                    value=ast.List() | ast.Tuple() as v,
                )
                | ast.AugAssign(
                    target=ast.Name(id="__all__"), value=ast.List() | ast.Tuple() as v
                )
            ):
                found |= {
                    e.value
                    for e in v.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
    return found


def _parsed(context: TreeContext, relpath: str) -> ast.Module | None:
    key = ("parsed", relpath)
    if key not in context.memo:
        try:  # as the engine parses a file: its comments can be read back
            context.memo[key] = SourceFile(relpath, context.read(relpath)).ast
        except (OSError, DeepstackError, ValueError):
            context.memo[key] = None
    return context.memo[key]  # type: ignore[return-value]


def _own_names(patch: DerivedPatch, dotted: str) -> set[str]:
    """What the patch itself adds to the module ``dotted`` (a file it changes
    or adds), and the submodules it adds to it (new files)."""
    relpath = "/".join(dotted.split("."))
    own = _patch_bindings(patch, relpath + ".py") | new_modules(
        getattr(patch, "units", ()), dotted
    )
    return own | _patch_bindings(patch, relpath + "/__init__.py")


def _patched(context: TreeContext, patch: DerivedPatch, dotted: str) -> _Module | None:
    """The tree's module ``dotted``, or a new file of the patch (_own_names)."""
    if dotted in new_modules(getattr(patch, "units", ())):
        return _Module(frozenset(), None, False)
    return _module(context, dotted)


def _missing_import(
    context: TreeContext,
    patch: DerivedPatch,
    aliases: Iterable[tuple[str, str, int, str, str]],
    path: str,
) -> str:
    for kind, module, level, name, _asname in aliases:
        if kind == "import":
            if name.split(".")[0] == "vllm" and _patched(context, patch, name) is None:
                return f"the fix imports `{name}`, which this release lacks"
            continue
        dotted = absolute_module(module, level, path)
        if dotted.split(".")[0] != "vllm" or name == "*":
            continue
        found = _patched(context, patch, dotted)
        if found is None or not (
            found.has(name, context) or name in _own_names(patch, dotted)
        ):
            return _lacked(context, patch, name, dotted)
    return ""


def _missing_attribute(
    context: TreeContext, patch: DerivedPatch, dotted: str, chain: Sequence[str]
) -> str:
    """``dotted.a.b``: each step a submodule, or a name of the last module."""
    found = _patched(context, patch, dotted)
    if found is None:  # ``from vllm.a import b``: b is then not a module
        parent, _, name = dotted.rpartition(".")
        return (
            f"the fix needs `{name}` from `{parent}`, which this release lacks"
            if parent and _patched(context, patch, parent) is None
            else ""
        )
    for attribute in chain:
        if found.package is not None and (
            (found.package / f"{attribute}.py").is_file()
            or (found.package / attribute / "__init__.py").is_file()
        ):
            dotted = f"{dotted}.{attribute}"
            found = _module(context, dotted) or _UNKNOWN
            continue
        if found.has(attribute, context) or attribute in _own_names(patch, dotted):
            return ""
        return _lacked(context, patch, attribute, dotted)
    return ""


def _lacked(context: TreeContext, patch: DerivedPatch, name: str, dotted: str) -> str:
    """``dotted`` lacks ``name``: said, with the patch of the series that adds it."""
    said = f"the fix needs `{name}` from `{dotted}`, which this release lacks"
    return said + context.added_by(
        patch.id, name, lambda p: name in _own_names(p, dotted)
    )

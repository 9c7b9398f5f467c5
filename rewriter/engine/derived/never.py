"""A bug the release never had (issue 41, item 3).

A derived fix takes code away. Where a name its removed code reads, and its
fixed code does not (``warning_once``, ``self.use_breakable_cg``), is
nowhere in the file, the code the fix changes cannot be there in any form:
the unit is ``not-applicable``, "not in this release: ...", not drifted.
Where the fix takes away no such name (it changes a number, a string, an
order), or one of them is somewhere in the file, the target may be there
and differ: it stays drifted, and refusing stays the default. An import
the fix removes, absent with the code that used it, is named the same way.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from deepstack_patch.engine.derived import shapes
from deepstack_patch.engine.derived.data import (
    DOCUMENTATION,
    NOT_IN_RELEASE,
    Edit,
    Unit,
)
from deepstack_patch.engine.derived.match import import_aliases, with_block
from deepstack_patch.engine.protocol import PatchState

#: A builtin (``dict``, ``len``) says nothing of where the code came from.
_BUILTINS = frozenset(dir(builtins))


class _State(Protocol):
    state: PatchState
    reason: str
    details: dict[str, Any]


State = TypeVar("State", bound=_State)


def is_there(state: _State | None) -> bool:
    """Whether a unit's code is in the file: found, and not code this
    release never had (which neither needs the fix's imports nor stands
    for the fix's presence)."""
    return state is not None and state.state is not PatchState.NOT_APPLICABLE


class NeverHere:
    """Judges the drifted edits of one file; its names are read once."""

    def __init__(self, tree: ast.Module, path: str) -> None:
        self.tree = tree
        self.path = path
        self._names: frozenset[str] | None = None
        #: Unit part -> the names the fix adds that its function in this
        #: file reads already, where an edit of it is "not in this release":
        #: fixed another way, perhaps (vllm#47062 on 0.25.0, whose
        #: ``flush`` catches ``HarmonyError`` itself). Such a part never
        #: lets the fix go in where the rest of its code is (engine/whole.py).
        self.there_already: dict[str, list[str]] = {}

    def judge(
        self, unit: Unit, edit: Edit, reason: str, *, alone: bool = False
    ) -> tuple[PatchState, str]:
        """A drifted edit's state: drifted (``reason``), or not-applicable
        where a name it takes away is nowhere in the file. A local of the
        unit never counts: a vendor may have renamed it. Where the edit is
        its unit's only edit of code (``alone``), also where the code it
        changes sets an attribute of ``self`` that the class never touches
        (:meth:`_unset`); beside other edits of the same method that are
        there, the method holds the fix's code, and the edit drifts."""
        if edit.kind == "header":
            removed, kept = edit.header_before, edit.header_after
        else:
            removed, kept = edit.removed, edit.inserted
        local = bound_names(_parsed(unit.before) or _parsed(unit.after))
        taken = read_names(removed) - read_names(kept) - _BUILTINS - local
        if taken and self._names is None:
            self._names = frozenset(names_in(self.tree))
        absent = sorted(taken - (self._names or frozenset()))
        if absent:
            shown = ", ".join(f"`{name}`" for name in absent)
            verb = "is" if len(absent) == 1 else "are"
            return PatchState.NOT_APPLICABLE, (
                f"{NOT_IN_RELEASE}{shown}, which the fix takes away, {verb} "
                f"nowhere in {self.path}"
            ) + self._adds_there(unit, removed, kept, local)
        if alone:
            return self._unset(unit, removed, reason)
        return PatchState.DRIFTED, reason

    def _adds_there(self, unit: Unit, removed: str, kept: str, local: set[str]) -> str:
        """Words for a part never here whose function already reads every
        name the fix's code adds (its ``local`` names and builtins aside),
        noted in :attr:`there_already`; empty where it does not (or is no
        function)."""
        added = read_names(kept) - read_names(removed) - _BUILTINS - local
        node = _definition(self.tree, unit)
        if not added or node is None or not added <= set(names_in(node)):
            return ""
        self.there_already[unit.part] = sorted(added)
        shown = ", ".join(f"`{name}`" for name in sorted(added))
        return f"; what the fix adds ({shown}) is there already"

    def _unset(self, unit: Unit, removed: str, reason: str) -> tuple[PatchState, str]:
        """Drifted (``reason``), or not-applicable where the code the fix
        changes sets ``self.name`` in a method and the method's class never
        touches ``self.name``: that code is not in its class in any form
        (vllm#41522 guards ``self.use_mega_moe`` in two classes' ``__init__``;
        0.20.0's ``DeepseekV4Model`` has no such flag, only its
        ``DeepseekV4MoE`` does)."""
        owner = unit.name.rpartition(".")[0] if unit.kind == "method" else ""
        found = shapes.class_named(self.tree.body, owner.split(".")) if owner else None
        set_here = set_on_self(_parsed(removed))
        if found is None or not set_here or set_here & touched_on_self(found):
            return PatchState.DRIFTED, reason
        shown = ", ".join(f"`self.{name}`" for name in sorted(set_here))
        return PatchState.NOT_APPLICABLE, (
            f"{NOT_IN_RELEASE}{shown}, which the code the fix changes sets, is "
            f"nowhere in class {owner} of {self.path}"
        )


def _definition(tree: ast.Module, unit: Unit) -> ast.AST | None:
    """The function or method a unit is, in ``tree``; None for another
    kind of unit, or where it is not there."""
    if unit.kind not in ("function", "method"):
        return None
    *owner, name = unit.name.split(".")
    holder = shapes.class_named(tree.body, owner) if owner else tree
    if holder is None:
        return None
    body = holder.body
    return next(
        (
            node
            for node in body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == name
        ),
        None,
    )


def set_on_self(statements: ast.AST | None) -> set[str]:
    """The attributes of ``self`` that code assigns (``self.flag = ...``)."""
    if statements is None:
        return set()
    return shapes.self_attributes(statements, ast.Store, ast.Del)


def touched_on_self(node: ast.ClassDef) -> set[str]:
    """The attributes of ``self`` a class's code reads or sets anywhere, and
    the names its body binds (a class-level field or method)."""
    return shapes.class_defines(node) | shapes.self_attributes(node, ast.Load, ast.Del)


def _parsed(code: str) -> ast.Module | None:
    """Recorded code parsed; a header made a whole statement first."""
    if not code.strip():
        return None
    try:
        return ast.parse(code)
    except SyntaxError:
        try:
            return ast.parse(with_block(code))
        except SyntaxError:
            return None


def bound_names(statements: ast.AST | None) -> set[str]:
    """The names code binds: assigned, arguments, loop and ``with`` targets."""
    if statements is None:
        return set()
    return {
        node.id
        for node in ast.walk(statements)
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)
    } | {node.arg for node in ast.walk(statements) if isinstance(node, ast.arg)}


def read_names(code: str) -> set[str]:
    """The attributes and the names ``code`` reads without binding them: what
    it depends on from outside (its locals may be renamed in a tree)."""
    statements = _parsed(code)
    if statements is None:
        return set()
    bound = bound_names(statements)
    found: set[str] = set()
    for node in ast.walk(statements):
        match node:
            case ast.Attribute(attr=attr):
                found.add(attr)
            case ast.Name(id=name, ctx=ast.Load()) if name not in bound:
                found.add(name)
    return found


def names_in(tree: ast.AST) -> Iterator[str]:
    """Every identifier of a file: names, attributes, definitions,
    arguments, keywords, imports (a superset of what code can read)."""
    for node in ast.walk(tree):
        match node:
            case ast.Name(id=name) | ast.arg(arg=name):
                yield name
            case ast.Attribute(attr=name) | ast.keyword(arg=str(name)):
                yield name
            case (
                ast.FunctionDef(name=name)
                | ast.AsyncFunctionDef(name=name)
                | ast.ClassDef(name=name)
            ):
                yield name
            case ast.alias(name=name, asname=asname):
                yield from name.split(".")
                if asname:
                    yield asname


def imports_alone(
    unit: Unit, state: State | None, tree: ast.Module, path: str
) -> State | None:
    """The imports of a fix whose code is not in this file: nothing to do,
    with what is missing in words. None where the code is absent and the
    imports the fix removes are here (the file holds none of the fix)."""
    removed = [
        node
        for edit in unit.edits
        for node in shapes.parse_statements(edit.removed)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    kept = {
        alias
        for edit in unit.edits
        for alias in import_aliases(shapes.parse_statements(edit.inserted))
    }
    dropped = [alias for alias in import_aliases(removed) if alias not in kept]
    here = set(
        import_aliases(
            [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        )
    )
    if state is None or not dropped or any(alias in here for alias in dropped):
        return None
    shown = "; ".join(f"`{ast.unparse(node)}`" for node in removed)
    which = "import" if len(removed) == 1 else "imports"
    verb = "is" if len(removed) == 1 else "are"
    return dataclasses.replace(
        state,
        state=PatchState.NOT_APPLICABLE,
        reason=f"{NOT_IN_RELEASE}{shown}, the {which} the fix removes, {verb} "
        f"not in {path}",
        details={},
    )


def serving_only(
    units: Sequence[Unit], needed: Collection[str], never: Collection[str]
) -> list[str]:
    """The names the ``needed`` units' fix binds, where binding them is all
    it does there and the fix reads them only in the ``never`` units (code
    this release never had): what is there of the fix then only serves
    what is not (vllm#30336 on 0.17.1 adds ``self.is_blackwell`` to
    ``__init__`` for a condition of ``_run_deepgemm`` that 0.17.1 writes
    another way). Empty where a needed unit changes code, or binds a name
    the fix reads elsewhere too: that part is a fix of its own."""
    by_part = {unit.part: unit for unit in units}
    bound: set[str] = set()
    for part in needed:
        for edit in by_part[part].edits:
            if edit.kind in DOCUMENTATION:
                continue
            if edit.kind == "header" or edit.removed.strip():
                return []  # it changes code that is there
            for node in shapes.parse_statements(edit.inserted):
                names = _bindings(node)
                if not names:
                    return []
                bound |= names
    reads_there = _reads_of(by_part[part] for part in needed)
    reads_never = _reads_of(by_part[part] for part in never)
    if not bound or bound & reads_there or not bound <= reads_never:
        return []
    return sorted(bound)


def _bindings(node: ast.stmt) -> set[str]:
    """The names a statement that only binds binds (``self.flag = ...``,
    ``LIMIT: int = 4``, an import); empty for any other statement."""
    match node:
        case ast.Assign(targets=targets):
            found = [_bound(target) for target in targets]
        case ast.AnnAssign(target=target):
            found = [_bound(target)]
        case ast.Import(names=aliases) | ast.ImportFrom(names=aliases):
            found = [(a.asname or a.name).split(".")[0] for a in aliases]
        case _:
            return set()
    return set() if "" in found else set(found)


def _bound(target: ast.expr) -> str:
    match target:
        case ast.Name(id=name) | ast.Attribute(value=ast.Name(id="self"), attr=name):
            return name
    return ""


def _reads_of(units: Iterable[Unit]) -> set[str]:
    """The names and attributes the units' fixed code reads (not those it
    assigns)."""
    found: set[str] = set()
    for unit in units:
        for edit in unit.edits:
            if edit.kind in DOCUMENTATION:
                continue
            for code in (edit.inserted, edit.header_after):
                for node in ast.walk(_parsed(code) or ast.Module([], [])):
                    match node:
                        case ast.Attribute(attr=name, ctx=ast.Load()):
                            found.add(name)
                        case ast.Name(id=name, ctx=ast.Load()):
                            found.add(name)
    return found

"""Which names of a module reach what a patch changes (static, ``ast``):
the changed module's own (:func:`reaching_names`), through the calls of a
class's methods (:func:`methods_reaching`), and the helpers that read a
module's definitions and the dotted names its code uses. ``impact.py``
selects tests with them; nothing here names a fix."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChangedUnit:
    """A function, method, class or statement a patch changes."""

    path: str  # vllm/a/b.py
    kind: str  # function, method, class, class-attribute, module-statement, import
    name: str  # f, C.m, C, NAME; the path for imports

    @property
    def part(self) -> str:
        return f"{self.path}::{self.name}"

    @property
    def top_name(self) -> str:
        """The module-level name the unit lives under (``C`` for ``C.m``)."""
        return self.name.split(".")[0]


def reaching_names(
    path: Path, units: Sequence[ChangedUnit]
) -> tuple[dict[str, set[str]], dict[str, frozenset[str]]]:
    """Each top-level name of the changed module (as the tree has it) whose
    code reaches a changed unit, with the units it reaches; a unit's own
    top-level name reaches it. A unit of the whole module (a module-level
    statement, or a hand-written patch's file) is reached by any name.
    Second: for a changed method, the methods a test must name to reach it
    through its class (:func:`methods_reaching`)."""
    direct: dict[str, set[str]] = {}
    whole = [u.part for u in units if u.kind in ("module-statement", "import")]
    for unit in units:
        if unit.kind not in ("module-statement", "import"):
            direct.setdefault(unit.top_name, set()).add(unit.part)
    source = read_text(path) if path.is_file() else None
    try:
        module = ast.parse(source) if source is not None else None
    except SyntaxError:
        module = None
    if module is None:
        return {"*": set(whole), **direct}, {}
    narrowing = {
        unit.part: methods
        for unit in units
        if (methods := methods_reaching(module, unit)) is not None
    }
    defined = definitions(module.body)
    reaching = {name: set(parts) for name, parts in direct.items()}
    spread(reaching, defined)
    if whole:
        reaching["*"] = set(whole)
    return reaching, narrowing


#: Methods Python calls without naming them: a test that makes or uses an
#: instance may reach them through the class alone.
IMPLICIT_METHODS = ("__init__", "__new__", "__post_init__", "__call__")


def methods_reaching(module: ast.Module, unit: ChangedUnit) -> frozenset[str] | None:
    """The methods of the unit's class whose code reaches the changed
    method (through ``self.m``, ``cls.m`` or ``C.m``), the method included;
    None where a test can reach it without naming one (a dunder, a method
    the class's own statements use, a class the tree does not hold)."""
    owner, _, method = unit.name.rpartition(".")
    if unit.kind != "method" or "." in owner or method.startswith("__"):
        return None
    classes = [
        s for s in module.body if isinstance(s, ast.ClassDef) and s.name == owner
    ]
    if not classes:
        return None
    methods = {
        s.name: s
        for s in classes[0].body
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    selves = {"self", "cls", owner}
    reaching = {method}
    grown = True
    while grown:
        grown = False
        for name, node in methods.items():
            if name in reaching:
                continue
            chains = [r.split(".") for r in dotted_refs(node)]
            called = {c[1] for c in chains if len(c) > 1 and c[0] in selves}
            if called & reaching:
                reaching.add(name)
                grown = True
    if reaching & set(IMPLICIT_METHODS) or any(
        name.startswith("__") for name in reaching
    ):
        return None
    return frozenset(reaching)


def definitions(body: Iterable[ast.stmt]) -> dict[str, list[ast.AST]]:
    """A block's functions, classes and assigned names, with their code."""
    found: dict[str, list[ast.AST]] = {}
    for statement in body:
        match statement:
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                found.setdefault(name, []).append(statement)
            case ast.ClassDef(name=name):
                found.setdefault(name, []).append(statement)
            case ast.Assign(targets=targets, value=value):
                for target in targets:
                    for node in ast.walk(target):
                        if isinstance(node, ast.Name):
                            found.setdefault(node.id, []).append(value)
            case ast.AnnAssign(target=ast.Name(id=name), value=value) if value:
                found.setdefault(name, []).append(value)
            case ast.If(body=inner, orelse=other) | ast.Try(body=inner, orelse=other):
                for name, nodes in definitions([*inner, *other]).items():
                    found.setdefault(name, []).extend(nodes)
    return found


def dotted_refs(node: ast.AST) -> Iterator[str]:
    """Every name the code uses, whole: ``a.b.c`` for ``a.b.c()`` (not also
    ``a.b`` and ``a``), ``a`` for ``a[0]``."""
    pending = [node]
    while pending:
        child = pending.pop()
        match child:
            case ast.Attribute() if found := dotted_name(child):
                yield found
                continue
            case ast.Name(id=name):
                yield name
        pending.extend(ast.iter_child_nodes(child))


def dotted_name(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def spread(reaching: dict[str, set[str]], defined: dict[str, list[ast.AST]]) -> None:
    """A name (of ``defined``: :func:`definitions`) reaches what the names
    its code refers to reach: to a fixed point, in place."""
    changed = True
    while changed:
        changed = False
        for name, nodes in defined.items():
            refs = {r.split(".")[0] for node in nodes for r in dotted_refs(node)}
            gained = set().union(*(reaching.get(r, set()) for r in refs - {name}))
            if not gained <= reaching.get(name, set()):
                reaching.setdefault(name, set()).update(gained)
                changed = True


def read_text(path: Path) -> str | None:
    """A file's text; None where it cannot be read as UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None

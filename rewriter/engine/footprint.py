"""A patch's footprint: the code a carried fix depends on, read from the tree.

The functions a patch rewrites are not all a fix depends on: vllm#43617
rewrites the deepstack ``_get_``/``_set_`` methods, and what broke it later
(vllm#49397) was the ``__init__`` that builds the buffers those methods read.
So a footprint is

- the functions the patch's findings name (``Finding.symbol`` and
  ``Finding.rewrites``, on any state: an applied fix is watched too);
- every function that assigns ``self.<attr>`` for an ``<attr>`` those
  functions read, in their class, its subclasses and its bases, searched in
  every file the patch's ``paths`` match (a subclass may live elsewhere);
- the qualified names the patch declares in ``Patch.also_watch``;
- every other unit a finding names that is not a function: a class (its
  header: decorators, bases), a statement of a class body (``Class.attr``,
  a class attribute) or of a module (``NAME``), as a derived patch's units
  are; so a derived patch's footprint is every unit it has, its imports
  aside (imports follow the code that uses them, which is watched).

Nothing is listed by hand per release: the same rules run on every tree.
Functions are compared by :func:`code_of` without comments, formatting or
docstrings, so only a change of code counts.
"""

from __future__ import annotations

import ast
import copy
import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from deepstack_patch.engine.derived.units import statement_name
from deepstack_patch.engine.protocol import Patch, PatchReport
from deepstack_patch.engine.source import code_lines
from deepstack_patch.engine.syntax import FunctionNode, iter_classes, iter_functions
from deepstack_patch.engine.tree import VllmTree

#: Why a function is in a footprint.
REWRITTEN = "rewritten by the patch"
DECLARED = "declared by the patch (also_watch)"


@dataclass(frozen=True)
class FootprintFunction:
    """One function of a footprint, where it is in one tree.

    ``attributes`` are the ``self.<attr>`` it is watched for writing: of such
    a function only those writes count, each with the blocks around it (an
    ``__init__`` that builds a buffer inside ``with`` and later after it has
    changed; one that gained an unrelated line has not). Empty: the whole
    function counts (rewritten or declared).
    """

    path: str
    symbol: str
    line: int
    why: str
    attributes: tuple[str, ...] = ()
    #: ``function``, ``class`` (its header) or ``statement`` (:func:`unit_kind`).
    kind: str = "function"


@dataclass(frozen=True)
class FunctionCode:
    """A function's source text and its code without comments or docstrings."""

    path: str
    symbol: str
    line: int
    text: str
    normalized: str


class SourceReader:
    """Each file of a tree read and parsed at most once (None: unparsable)."""

    def __init__(
        self, tree: VllmTree | None, overrides: dict[str, bytes] | None = None
    ):
        self.tree = tree
        self._overrides = overrides or {}
        self._raw: dict[str, bytes | None] = {}
        self._parsed: dict[str, ast.Module | None] = {}
        # A watch asks for the same functions once per patch and per release
        # pair: each file's functions are indexed, and each code made, once.
        self._functions: dict[str, dict[str, FunctionNode]] = {}
        self._codes: dict[tuple[str, str, tuple[str, ...]], FunctionCode | None] = {}

    def raw(self, relpath: str) -> bytes | None:
        if relpath not in self._raw:
            if relpath in self._overrides:
                self._raw[relpath] = self._overrides[relpath]
            elif self.tree is None:
                self._raw[relpath] = None
            else:
                try:
                    self._raw[relpath] = (self.tree.root / relpath).read_bytes()
                except (FileNotFoundError, NotADirectoryError):
                    self._raw[relpath] = None
        return self._raw[relpath]

    def parsed(self, relpath: str) -> ast.Module | None:
        if relpath not in self._parsed:
            raw = self.raw(relpath)
            try:
                module = ast.parse(raw) if raw is not None else None
            except (SyntaxError, ValueError):
                module = None  # a file python cannot parse has no functions
            self._parsed[relpath] = module
        return self._parsed[relpath]

    def function(self, relpath: str, symbol: str) -> FunctionNode | None:
        if relpath not in self._functions:
            module = self.parsed(relpath)
            found: dict[str, FunctionNode] = {}
            for name, function in iter_functions(module) if module else ():
                found.setdefault(name, function)  # the first, as a search finds
            self._functions[relpath] = found
        return self._functions[relpath].get(symbol)

    def unit(self, relpath: str, symbol: str) -> ast.AST | None:
        """The function ``symbol`` of ``relpath``, else the class or the
        statement it names (see :func:`named_unit`), or None."""
        function = self.function(relpath, symbol)
        if function is not None:
            return function
        module = self.parsed(relpath)
        return named_unit(module, symbol) if module is not None else None

    def code(
        self, relpath: str, symbol: str, attributes: Sequence[str] = ()
    ) -> FunctionCode | None:
        """The function ``symbol`` of ``relpath``, or None where it is absent;
        with ``attributes``, its normalized code is only its writes of them
        (see :class:`FootprintFunction`)."""
        key = (relpath, symbol, tuple(attributes))
        if key not in self._codes:
            self._codes[key] = self._code(relpath, symbol, attributes)
        return self._codes[key]

    def _code(
        self, relpath: str, symbol: str, attributes: Sequence[str]
    ) -> FunctionCode | None:
        node = self.unit(relpath, symbol)
        raw = self.raw(relpath)
        if node is None or raw is None:
            return None
        lines = code_lines(raw.decode("utf-8", "replace"))
        first = min([node.lineno, *(d.lineno for d in _decorators(node))])
        last = node.end_lineno or node.lineno
        if isinstance(node, ast.ClassDef):  # its header: the body is not it
            node, last = _class_header(node), max(node.body[0].lineno - 1, first)
        text = "".join(lines[first - 1 : last])
        normalized = (
            normalized_writes(node, attributes)  # type: ignore[arg-type]
            if attributes
            else normalized_code(node)
        )
        return FunctionCode(relpath, symbol, first, text, normalized)


def named_unit(module: ast.Module, symbol: str) -> ast.AST | None:
    """The class, or the statement of a class body or of the module, that
    ``symbol`` names as a derived patch names its units: ``Outer.Inner``,
    ``Class.attr``, ``NAME``; ``NAME (2)`` is the second statement so named,
    and a statement that assigns no name is named by its kind (``if``,
    ``expr``); an entry of a literal (``NAME["KEY"]``, ``NAME(name=)``) is
    its statement. None where there is none, and for ``imports``."""
    symbol = _without_entry(symbol)
    *scope, last = symbol.split(".")
    body: list[ast.stmt] = module.body
    for name in scope:
        cls = next(
            (n for n in body if isinstance(n, ast.ClassDef) and n.name == name), None
        )
        if cls is None:
            return None
        body = cls.body
    name, _, number = last.partition(" (")
    index = int(number.rstrip(")")) - 1 if number.rstrip(")").isdigit() else 0
    if not scope and name == "imports":
        return None
    named = [node for node in body if statement_name([node]) == name]
    return named[index] if index < len(named) else None


def _without_entry(symbol: str) -> str:
    """``NAME["KEY"]`` or ``NAME(name=)``, an entry unit's name, is ``NAME``
    (the key may hold dots); any other name as it is."""
    import re

    entry = re.fullmatch(r"([\w.]+?)(\[.*\]|\(\w+=\))", symbol)
    return entry.group(1) if entry else symbol


def unit_kind(node: ast.AST) -> str:
    """``function``, ``class`` or ``statement``."""
    match node:
        case ast.FunctionDef() | ast.AsyncFunctionDef():
            return "function"
        case ast.ClassDef():
            return "class"
    return "statement"


def _decorators(node: ast.AST) -> list[ast.expr]:
    return list(getattr(node, "decorator_list", []))


def _class_header(node: ast.ClassDef) -> ast.ClassDef:
    """A class without its body: decorators, name, bases and keywords."""
    header = copy.copy(node)
    header.body = []
    return header


def function_code_in(raw: bytes | None, path: str, symbol: str) -> FunctionCode | None:
    """The function ``symbol`` of one file's bytes (a git blob, say)."""
    if raw is None:
        return None
    return SourceReader(None, {path: raw}).code(path, symbol)


def normalized_code(function: ast.AST) -> str:
    """The function's code: ``ast.dump`` without positions and docstrings.

    Comments and formatting never reach the ast; docstrings do, and are
    dropped here too, because they document the code rather than change it.
    """
    return ast.dump(_WithoutDocstrings().visit(copy.deepcopy(function)))


def normalized_writes(function: FunctionNode, attributes: Sequence[str]) -> str:
    """Each statement of ``function`` that writes one of ``self.<attributes>``,
    in order, with the headers of the blocks that enclose it (``with``,
    ``if``, ``for``, ``try``): what such a write depends on, and nothing else
    the function does."""
    wanted = set(attributes)
    writes: list[str] = []

    def visit(body: Sequence[ast.stmt], context: tuple[str, ...]) -> None:
        for statement in body:
            if isinstance(
                statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ):
                continue  # a nested definition's self is not this one's
            blocks = [
                getattr(statement, name)
                for name in ("body", "orelse", "finalbody")
                if isinstance(getattr(statement, name, None), list)
            ]
            blocks += [h.body for h in getattr(statement, "handlers", [])]
            if not blocks:
                if _writes(statement) & wanted:
                    writes.append(" > ".join([*context, ast.dump(statement)]))
                continue
            header = _header(statement)
            for block in blocks:
                visit(block, (*context, header))

    visit(function.body, ())
    return "\n".join(writes)


def _writes(statement: ast.stmt) -> set[str]:
    module = ast.Module(body=[statement], type_ignores=[])
    return self_attributes_assigned(module)  # type: ignore[arg-type]


def _header(statement: ast.stmt) -> str:
    """A block statement without its bodies: ``with x:``, ``if c:``."""
    bare = copy.copy(statement)
    for name in ("body", "orelse", "finalbody", "handlers"):
        if isinstance(getattr(bare, name, None), list):
            setattr(bare, name, [])
    return ast.dump(bare)


class _WithoutDocstrings(ast.NodeTransformer):
    def generic_visit(self, node: ast.AST) -> ast.AST:
        match node:
            case ast.FunctionDef(body=[ast.Expr(ast.Constant(str())), *rest]) | (
                ast.AsyncFunctionDef(body=[ast.Expr(ast.Constant(str())), *rest])
                | ast.ClassDef(body=[ast.Expr(ast.Constant(str())), *rest])
            ):
                node.body = rest or [ast.Pass()]
        return super().generic_visit(node)


def function_diff(
    before: FunctionCode | None,
    after: FunctionCode | None,
    before_label: str,
    after_label: str,
) -> str:
    """A unified diff of one function's source text between two trees."""
    old = before.text.splitlines(keepends=True) if before else []
    new = after.text.splitlines(keepends=True) if after else []
    path = (after or before).path if (after or before) else ""
    lines = difflib.unified_diff(
        old, new, f"{before_label}/{path}", f"{after_label}/{path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@dataclass
class _Class:
    path: str
    symbol: str
    node: ast.ClassDef

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def bases(self) -> set[str]:
        return {name for base in self.node.bases if (name := _base_name(base))}


def _base_name(node: ast.expr) -> str | None:
    """The simple name of a base class expression (``a.B``, ``B[T]`` → ``B``)."""
    match node:
        case ast.Name(id=name) | ast.Attribute(attr=name):
            return name
        case ast.Subscript(value=value):
            return _base_name(value)
    return None


def self_attributes_read(function: FunctionNode) -> set[str]:
    """``x`` for every ``self.x`` (or ``getattr(self, "x", ...)``) it reads."""
    read = set()
    for node in ast.walk(function):
        match node:
            case ast.Attribute(value=ast.Name("self"), attr=name, ctx=ast.Load()):
                read.add(name)
            case ast.Call(
                func=ast.Name("getattr" | "hasattr"),
                args=[ast.Name("self"), ast.Constant(value=str() as name), *_],
            ):
                read.add(name)
    return read


def self_attributes_assigned(function: FunctionNode) -> set[str]:
    """``x`` for every ``self.x = ...`` (augmented, annotated, ``setattr``)."""
    assigned = set()
    for node in ast.walk(function):
        match node:
            case ast.Attribute(value=ast.Name("self"), attr=name, ctx=ast.Store()):
                assigned.add(name)
            case ast.Call(
                func=ast.Name("setattr"),
                args=[ast.Name("self"), ast.Constant(value=str() as name), *_],
            ):
                assigned.add(name)
    return assigned


def footprint(
    report: PatchReport, tree: VllmTree, reader: SourceReader | None = None
) -> list[FootprintFunction]:
    """The footprint of one patch in ``tree``, from its report in a plan."""
    reader = reader or SourceReader(tree)
    patch = report.patch
    files = tree.glob(patch.paths)
    found: dict[tuple[str, str], FootprintFunction] = {}

    def add(
        path: str,
        symbol: str,
        node: ast.AST,
        why: str,
        attributes: tuple[str, ...] = (),
    ) -> None:
        key = (path, symbol)
        if key not in found:
            found[key] = FootprintFunction(
                path, symbol, node.lineno, why, attributes, unit_kind(node)
            )

    rewritten: list[tuple[str, str, FunctionNode]] = []
    for location in report.locations:
        finding = location.finding
        for symbol in dict.fromkeys([finding.symbol, *finding.rewrites]):
            function = reader.function(location.path, symbol)
            if function is not None:
                rewritten.append((location.path, symbol, function))
                add(location.path, symbol, function, REWRITTEN)
            elif (unit := reader.unit(location.path, symbol)) is not None:
                add(location.path, symbol, unit, REWRITTEN)
    for path, symbol, function in _declared(patch, files, reader):
        add(path, symbol, function, DECLARED)

    read = set().union(*(self_attributes_read(f) for _, _, f in rewritten))
    # Top-level functions have no owner class, and so no self to read.
    owners = {(path, owner) for path, owner in _owner_classes(rewritten) if owner}
    for cls in _family(owners, files, reader) if owners else ():
        for node in cls.node.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            written = sorted(self_attributes_assigned(node) & read)
            if written:
                names = ", ".join(f"self.{name}" for name in written)
                symbol = f"{cls.symbol}.{node.name}"
                add(cls.path, symbol, node, f"writes {names}", tuple(written))
    return sorted(found.values(), key=lambda f: (f.path, f.line, f.symbol))


def _owner_classes(
    rewritten: Iterable[tuple[str, str, FunctionNode]],
) -> set[tuple[str, str]]:
    return {(path, symbol.rpartition(".")[0]) for path, symbol, _ in rewritten}


def _declared(
    patch: Patch, files: Sequence[str], reader: SourceReader
) -> Iterable[tuple[str, str, FunctionNode]]:
    for symbol in patch.also_watch:
        last = symbol.rpartition(".")[2].encode()
        for path in files:
            raw = reader.raw(path)
            if raw is None or last not in raw:
                continue
            function = reader.function(path, symbol)
            if function is not None:
                yield path, symbol, function


def _family(
    owners: set[tuple[str, str]], files: Sequence[str], reader: SourceReader
) -> list[_Class]:
    """The owner classes, their subclasses and their bases, in ``files``.

    Classes are matched by simple name (as ``class B(a.A)`` names ``A``): a
    name two files define brings both in, which may watch too much, never
    too little. A subclass spells its base's name and a base is spelled
    ``class <name>``, so only the files holding those bytes are parsed.
    """
    classes: dict[tuple[str, str], _Class] = {}
    scanned: set[str] = set()
    searched = {symbol.rpartition(".")[2].encode() for _, symbol in owners}
    while True:
        new_files = [
            path
            for path in files
            if path not in scanned
            and (raw := reader.raw(path)) is not None
            and any(name in raw for name in searched)
        ]
        for path in new_files:
            scanned.add(path)
            module = reader.parsed(path)
            for symbol, node in iter_classes(module) if module else ():
                classes[(path, symbol)] = _Class(path, symbol, node)
        below, above = _related(classes, owners)
        # Only a subclass of an owner's subclass is related, not one of a
        # base (every model subclasses nn.Module): search names of below.
        searched |= {classes[key].name.encode() for key in below}
        searched |= {
            b"class " + base.encode() for key in above for base in classes[key].bases
        }
        if not new_files:
            return [classes[key] for key in sorted(below | above)]


def _related(
    classes: dict[tuple[str, str], _Class], owners: set[tuple[str, str]]
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The owners with every class below them, and with every class above them.

    Siblings (another subclass of a base) are not related: they share the
    base's code, not the owner's state.
    """
    start = {key for key in owners if key in classes}
    below, above = set(start), set(start)
    while True:  # down: a class naming a member as its base
        names = {classes[key].name for key in below}
        new = {k for k, c in classes.items() if k not in below and c.bases & names}
        if not new:
            break
        below |= new
    while True:  # up: a class a member names as its base
        bases = set().union(*(classes[key].bases for key in above))
        new = {k for k, c in classes.items() if k not in above and c.name in bases}
        if not new:
            break
        above |= new
    return below, above


@dataclass
class PatchFootprint:
    """One patch's footprint in one tree."""

    patch_id: str
    functions: list[FootprintFunction] = field(default_factory=list)


def footprints(
    tree: VllmTree,
    reports: Sequence[PatchReport],
    reader: SourceReader | None = None,
) -> list[PatchFootprint]:
    """Every patch's footprint in ``tree``, from a plan's reports."""
    reader = reader or SourceReader(tree)
    return [
        PatchFootprint(report.patch.id, footprint(report, tree, reader))
        for report in reports
    ]


def series_footprints(tree: VllmTree, series: Sequence[Patch]) -> list[PatchFootprint]:
    """Every patch's footprint in ``tree`` (recognised, nothing rewritten)."""
    from deepstack_patch.engine.plan import plan_tree

    plan = plan_tree(tree, series, rewrite=False)
    return footprints(tree, plan.reports)

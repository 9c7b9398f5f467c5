"""Derived patches: a fix made from an upstream diff, kept as data.

For every unit the diff changes (a function, a method, a class's or the
module's statements, the module's imports) the data file holds the code
before and after, and the edits between them: which statements a fix
removes, which it inserts, in which block, between which neighbours (the
anchors). The engine reads it with the same four states as a hand-written
patch (see :meth:`DerivedPatch.recognise`): statements are compared by their
``ast.dump`` without positions and docstrings (:mod:`.derived_shapes`), so
formatting and comments never matter, and nothing is guessed: a unit is
looked up by its qualified name in the file the diff names, each block by
its header, each edit by its anchors, and every one must be found exactly
once.

The data file is TOML (schema 1), one per patch; docs/derive.md describes it.
"""

from __future__ import annotations

import ast
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine import derived_shapes as shapes
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import (
    Finding,
    Patch,
    PatchState,
    RecordedTest,
)

if TYPE_CHECKING:
    import libcst

SCHEMA = 1

#: The kinds of unit, as the data file names them.
UNIT_KINDS = (
    "function",
    "method",
    "class",
    "class-attribute",
    "module-statement",
    "import",
)
EDIT_KINDS = ("body", "header", "imports")


@dataclass(frozen=True)
class Step:
    """One step from a unit's block into a nested one: the compound statement
    (by its header code) and which of its blocks (``body``, ``orelse``,
    ``finalbody``; ``header`` for the definition a header edit changes)."""

    header: str
    field: str = "body"


@dataclass(frozen=True)
class Anchor:
    """A neighbour of an edit in its block. ``match`` is ``statement`` (the
    whole statement must be the same) or ``header`` (a definition by its
    kind and name, another compound statement by its header)."""

    code: str
    match: str = "statement"


@dataclass(frozen=True)
class Edit:
    """One change in one block.

    ``body``: in the block ``block`` leads to, the statements ``removed``,
    right after ``before_anchor`` (None: at the block's start) and right
    before ``after_anchor`` (None: at its end), become ``inserted``.
    ``header``: the definition ``block`` leads to has ``header_before`` as
    its header (decorators, signature, bases) and gets ``header_after``.
    ``imports``: the module's imports ``inserted`` are added where missing
    and those of ``removed`` that nothing else uses are dropped.
    """

    kind: str
    block: tuple[Step, ...] = ()
    before_anchor: Anchor | None = None
    after_anchor: Anchor | None = None
    removed: str = ""
    inserted: str = ""
    header_before: str = ""
    header_after: str = ""


@dataclass(frozen=True)
class Unit:
    """A function, method, class or module statement the diff changes."""

    path: str
    kind: str
    name: str
    before: str
    after: str
    edits: tuple[Edit, ...]

    @property
    def part(self) -> str:
        return f"{self.path}::{self.name}"

    @property
    def description(self) -> str:
        what = {"class-attribute": "statement of class", "import": "imports"}
        if self.kind == "import":
            return f"imports of {self.path}"
        return f"{what.get(self.kind, self.kind)} {self.name} in {self.path}"


class DerivedPatch(Patch):
    """A patch made from data (see the module's docstring)."""

    def __init__(
        self,
        *,
        id: str,  # noqa: A002 - the Patch protocol's name
        title: str,
        symptom: str,
        base: str,
        paths: Sequence[str],
        units: Sequence[Unit],
        tests: Sequence[RecordedTest] = (),
        requires: Sequence[str] = (),
        origin: str = "",
        base_tree: str = "",
        upstream_url: str = "",
    ) -> None:
        self.id = id
        self.title = title
        self.symptom = symptom
        self.base = base
        self.base_tree = base_tree
        self.upstream_url = upstream_url or _upstream_url(id)
        self.fixed_in = ""
        self.paths = tuple(paths)
        self.units = tuple(units)
        self.recorded_tests = tuple(tests)
        self.requires = tuple(requires)
        self.origin = origin or "derived"
        # Paths are exact files: every one is read.
        self.markers = (b"",)
        self.parts = {unit.part: unit.description for unit in self.units}
        self.also_changes = (
            "Nothing beyond the statements of the upstream diff (the data file "
            "shows each unit before and after)."
        )
        self._compiled: dict[Edit, _CompiledEdit] = {}

    # -- recognition ---------------------------------------------------

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        units = [unit for unit in self.units if unit.path == path]
        if not units:
            return []
        shapes_of = _ShapeCache()
        found: list[tuple[Unit, _UnitState | None]] = [
            (unit, self._recognise_unit(unit, tree, shapes_of)) for unit in units
        ]
        absent = [unit for unit, state in found if state is None]
        findings = []
        for unit, state in found:
            if state is None:
                continue  # the report says: target absent, no <unit> in this tree
            if absent:
                # Whole or not at all: half a fix is not the fix.
                state = _UnitState(
                    PatchState.DRIFTED,
                    state.span,
                    f"{absent[0].description} is absent while {unit.name} is "
                    "there: a derived patch applies whole or not at all",
                )
            findings.append(
                Finding(
                    state=state.state,
                    symbol=unit.name,
                    line=state.span[0],
                    span=state.span,
                    reason=state.reason,
                    part=unit.part,
                    details=state.details,
                )
            )
        return findings

    def _recognise_unit(
        self, unit: Unit, tree: ast.Module, shapes_of: _ShapeCache
    ) -> _UnitState | None:
        states: list[tuple[PatchState, str]] = []
        spans: list[tuple[int, int]] = []
        details: dict[str, Any] = {}
        for index, edit in enumerate(unit.edits):
            compiled = self._compile(edit)
            if edit.kind == "imports":
                state, reason, span, edit_details = _recognise_imports(
                    compiled, tree, shapes_of
                )
                details[str(index)] = edit_details
            else:
                located = _locate(compiled, tree, shapes_of)
                if located is None:
                    return None
                if isinstance(located, str):
                    states.append((PatchState.DRIFTED, located))
                    continue
                state, reason, span = _recognise_edit(
                    compiled, located, shapes_of, unit.name
                )
            states.append((state, reason))
            spans.append(span)
        first = min((s for s, _ in spans), default=1)
        last = max((e for _, e in spans), default=first)
        if len(spans) < len(states):  # a drifted step: point at the unit
            return _UnitState(
                PatchState.DRIFTED,
                (first, last),
                "; ".join(r for s, r in states if s is PatchState.DRIFTED),
            )
        kinds = {state for state, _ in states}
        if kinds == {PatchState.NEEDED}:
            return _UnitState(PatchState.NEEDED, (first, last), "", details)
        if kinds == {PatchState.APPLIED}:
            return _UnitState(PatchState.APPLIED, (first, last), "")
        drifted = [r for s, r in states if s is PatchState.DRIFTED]
        reason = "; ".join(drifted) or (
            "part of the fix is there and part is not: "
            + ", ".join(f"edit {i + 1} {s}" for i, (s, _) in enumerate(states))
        )
        return _UnitState(PatchState.DRIFTED, (first, last), reason)

    def _compile(self, edit: Edit) -> _CompiledEdit:
        if edit not in self._compiled:
            self._compiled[edit] = _CompiledEdit.of(edit)
        return self._compiled[edit]

    # -- rewrite ---------------------------------------------------------

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        from deepstack_patch.engine import derived_rewrite

        by_part = {unit.part: unit for unit in self.units}
        for finding in needed:
            unit = by_part[finding.part]
            for index, edit in enumerate(unit.edits):
                module = derived_rewrite.apply_edit(
                    module,
                    self._compile(edit),
                    finding.details.get(str(index), {}),
                )
        return module

    def prove(self, tree: Path) -> None:
        raise NotImplementedError(
            "a derived patch is proved by its recorded tests (verify runs them)"
        )


def _upstream_url(patch_id: str) -> str:
    project, _, number = patch_id.partition("#")
    if project == "vllm" and number.isdigit():
        return f"https://github.com/vllm-project/vllm/pull/{number}"
    return ""


@dataclass
class _UnitState:
    state: PatchState
    span: tuple[int, int]
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class _ShapeCache:
    """Each node's shape and identity, made once per recognition."""

    def __init__(self) -> None:
        self._shape: dict[int, str] = {}
        self._identity: dict[int, str] = {}
        self._keep: list[ast.AST] = []  # ids stay unique while cached

    def shape(self, node: ast.stmt) -> str:
        key = id(node)
        if key not in self._shape:
            self._keep.append(node)
            self._shape[key] = shapes.shape(node)
        return self._shape[key]

    def identity(self, node: ast.stmt) -> str:
        key = id(node)
        if key not in self._identity:
            self._keep.append(node)
            self._identity[key] = shapes.identity(node)
        return self._identity[key]


@dataclass(frozen=True)
class _Key:
    """One statement of a pattern: its key, and by which key it matches."""

    key: str
    by: str  # "shape" | "identity"
    code: str  # for messages

    def matches(self, node: ast.stmt, shapes_of: _ShapeCache) -> bool:
        if self.by == "identity":
            return shapes_of.identity(node) == self.key
        return shapes_of.shape(node) == self.key


@dataclass(frozen=True)
class _CompiledEdit:
    """An edit with every key it is matched by computed once."""

    edit: Edit
    steps: tuple[tuple[str, str, str], ...]  # (identity, field, code)
    before_anchor: _Key | None
    after_anchor: _Key | None
    removed: tuple[_Key, ...]
    inserted: tuple[_Key, ...]
    header_before: str
    header_after: str

    @classmethod
    def of(cls, edit: Edit) -> _CompiledEdit:
        def key_of(anchor: Anchor | None) -> _Key | None:
            if anchor is None:
                return None
            node = _one_statement(anchor.code)
            if anchor.match == "header":
                return _Key(shapes.identity(node), "identity", anchor.code)
            return _Key(shapes.shape(node), "shape", anchor.code)

        def keys_of(code: str) -> tuple[_Key, ...]:
            return tuple(
                _Key(shapes.shape(node), "shape", ast.unparse(node))
                for node in shapes.parse_statements(code)
            )

        steps = tuple(
            (shapes.identity(_one_statement(_with_block(s.header))), s.field, s.header)
            for s in edit.block
        )
        headers = [
            shapes.header(_one_statement(_with_block(code))) if code else ""
            for code in (edit.header_before, edit.header_after)
        ]
        return cls(
            edit,
            steps,
            key_of(edit.before_anchor),
            key_of(edit.after_anchor),
            keys_of(edit.removed),
            keys_of(edit.inserted),
            headers[0],
            headers[1],
        )

    @property
    def before_pattern(self) -> list[_Key]:
        return [
            *([self.before_anchor] if self.before_anchor else []),
            *self.removed,
            *([self.after_anchor] if self.after_anchor else []),
        ]

    @property
    def after_pattern(self) -> list[_Key]:
        return [
            *([self.before_anchor] if self.before_anchor else []),
            *self.inserted,
            *([self.after_anchor] if self.after_anchor else []),
        ]


def _with_block(header_code: str) -> str:
    """A header's code made a whole statement (``...`` as its block)."""
    text = header_code.rstrip()
    if text.endswith(":"):
        return text + "\n    ...\n"
    return text + "\n"


def _one_statement(code: str) -> ast.stmt:
    body = ast.parse(code).body
    if len(body) != 1:
        raise ValueError(f"expected one statement, got {len(body)}: {code!r}")
    return body[0]


@dataclass
class _Located:
    """Where an edit's block is in a tree: the block and what owns it."""

    block: list[ast.stmt]
    owner: ast.AST  # the module or the compound statement holding the block
    unit_node: ast.AST  # the innermost definition on the way (or the module)
    target: ast.stmt | None = None  # a header edit's definition
    #: The first line after the statement before the unit's definition: the
    #: blank lines above a definition belong to its span (a rewrite that
    #: adds a decorator may be diffed as adding lines there).
    unit_first: int = 1


def _locate(
    compiled: _CompiledEdit, tree: ast.Module, shapes_of: _ShapeCache
) -> _Located | str | None:
    """The edit's block in ``tree``; None where a definition on the way is
    absent (the unit is not in this tree); a reason where it drifted."""
    block: list[ast.stmt] = tree.body
    owner: ast.AST = tree
    unit_node: ast.AST = tree
    unit_first = 1
    for identity, field_name, code in compiled.steps:
        found = [node for node in block if shapes_of.identity(node) == identity]
        is_definition = identity.startswith(("def ", "class "))
        if not found and is_definition:
            return None
        where = _where(owner)
        if len(found) != 1:
            first_line = code.strip().splitlines()[0]
            count = "not found" if not found else f"found {len(found)} times"
            return f"`{first_line}` {count} in {where}"
        node = found[0]
        if is_definition:
            unit_node = node
            index = block.index(node)
            if index:
                unit_first = _lines(block[index - 1])[1] + 1
            else:
                unit_first = _lines(owner)[0] + (0 if owner is tree else 1)
        if field_name == "header":
            return _Located(block, owner, unit_node, node, unit_first)
        inner = getattr(node, field_name, None)
        if not isinstance(inner, list) or not inner:
            return f"`{code.strip().splitlines()[0]}` in {where} has no {field_name}"
        block, owner = inner, node
    return _Located(block, owner, unit_node, None, unit_first)


def _where(owner: ast.AST) -> str:
    match owner:
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
            return f"def {name}"
        case ast.ClassDef(name=name):
            return f"class {name}"
        case ast.Module():
            return "the module"
        case ast.stmt(lineno=line):
            return f"the block at line {line}"
    return "the block"


def _lines(node: ast.AST) -> tuple[int, int]:
    if isinstance(node, ast.Module):
        return 1, max((n.end_lineno or 1 for n in node.body), default=1)
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])  # type: ignore[attr-defined]
    return first, node.end_lineno or first  # type: ignore[attr-defined]


def occurrences(
    block: Sequence[ast.stmt],
    pattern: Sequence[_Key],
    at_start: bool,
    at_end: bool,
    shapes_of: _ShapeCache,
) -> list[int]:
    """The indices of ``block`` (after its docstring) where ``pattern`` starts."""
    statements = shapes.without_docstring(block)
    size = len(pattern)
    last_start = len(statements) - size
    if last_start < 0:
        return []
    starts = [0] if at_start else list(range(last_start + 1))
    if at_end:
        starts = [start for start in starts if start == last_start]
    return [
        start
        for start in starts
        if all(
            key.matches(statements[start + offset], shapes_of)
            for offset, key in enumerate(pattern)
        )
    ]


def _recognise_edit(
    compiled: _CompiledEdit,
    located: _Located,
    shapes_of: _ShapeCache,
    unit_name: str,
) -> tuple[PatchState, str, tuple[int, int]]:
    span = _span(compiled, located)
    if compiled.edit.kind == "header":
        assert located.target is not None
        now = shapes.header(located.target)
        if now == compiled.header_before:
            return PatchState.NEEDED, "", span
        if now == compiled.header_after:
            return PatchState.APPLIED, "", span
        first = compiled.edit.header_before.strip().splitlines()[-1]
        return (
            PatchState.DRIFTED,
            f"the header of {unit_name} is neither the one the fix expects "
            f"(`{first}`) nor the fixed one",
            span,
        )
    at_start = compiled.before_anchor is None
    at_end = compiled.after_anchor is None
    before = occurrences(
        located.block, compiled.before_pattern, at_start, at_end, shapes_of
    )
    after = occurrences(
        located.block, compiled.after_pattern, at_start, at_end, shapes_of
    )
    if len(before) == 1 and not after:
        return PatchState.NEEDED, "", span
    if len(after) == 1 and not before:
        return PatchState.APPLIED, "", span
    return PatchState.DRIFTED, _drift_reason(compiled, located, shapes_of), span


def _drift_reason(
    compiled: _CompiledEdit, located: _Located, shapes_of: _ShapeCache
) -> str:
    """Which statement of the code the fix expects is missing or repeated."""
    where = _where(located.owner)
    statements = shapes.without_docstring(located.block)
    for key in compiled.before_pattern:
        count = sum(key.matches(node, shapes_of) for node in statements)
        if count != 1:
            times = "not found" if count == 0 else f"found {count} times"
            return f"`{_first_line(key.code)}` {times} in {where}"
    if compiled.inserted and all(
        any(key.matches(node, shapes_of) for node in statements)
        for key in compiled.inserted
    ):
        return f"both the code the fix replaces and the fixed code are in {where}"
    around = [k for k in (compiled.before_anchor, compiled.after_anchor) if k]
    return (
        f"the statements of the fix in {where} are not where the fix expects "
        "them (" + ", ".join(f"`{_first_line(k.code)}`" for k in around) + ")"
        if around
        else f"the statements of the fix are not the whole block of {where}"
    )


def _first_line(code: str) -> str:
    line = code.strip().splitlines()[0] if code.strip() else code
    return line if len(line) <= 70 else line[:67] + "..."


def _span(compiled: _CompiledEdit, located: _Located) -> tuple[int, int]:
    """The lines a rewrite of this edit may touch: the unit's definition, or
    for a change in a class or the module, the block around the edit."""
    if not isinstance(located.unit_node, ast.Module | ast.ClassDef) or (
        located.target is not None
    ):
        node = located.target or located.unit_node
        return min(located.unit_first, _lines(node)[0]), _lines(node)[1]
    # In a class's or the module's block: from the owner's header (or the
    # first statement) to the block's end. Wide, but only whole statements
    # matched by the pattern are ever replaced.
    block = located.block
    first = _lines(block[0])[0]
    if isinstance(located.owner, ast.stmt):
        first = _lines(located.owner)[0]
    return first, _lines(block[-1])[1]


# -- imports ----------------------------------------------------------------


def import_aliases(
    statements: Sequence[ast.stmt],
) -> list[tuple[str, str, int, str, str]]:
    """(kind, module, level, name, asname) of each name the statements import."""
    found = []
    for node in statements:
        match node:
            case ast.Import(names=names):
                found += [("import", "", 0, a.name, a.asname or "") for a in names]
            case ast.ImportFrom(module=module, level=level, names=names):
                found += [
                    ("from", module or "", level or 0, a.name, a.asname or "")
                    for a in names
                ]
    return found


def bound_name(alias: tuple[str, str, int, str, str]) -> str:
    kind, _, _, name, asname = alias
    if asname:
        return asname
    return name.split(".")[0] if kind == "import" else name


def _recognise_imports(
    compiled: _CompiledEdit, tree: ast.Module, shapes_of: _ShapeCache
) -> tuple[PatchState, str, tuple[int, int], dict[str, Any]]:
    """Imports are added where missing and dropped where the fix dropped them
    and nothing else uses them; they never drift."""
    edit = compiled.edit
    wanted = import_aliases(shapes.parse_statements(edit.inserted))
    dropped = [
        alias
        for alias in import_aliases(shapes.parse_statements(edit.removed))
        if alias not in wanted
    ]
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    present = set(import_aliases(imports))
    missing = [alias for alias in wanted if alias not in present]
    used = _used_names(tree) if dropped else set()
    unused = [a for a in dropped if a in present and bound_name(a) not in used]
    leading = _leading_imports(tree)
    if leading:
        span = (_lines(leading[0])[0], _lines(leading[-1])[1])
    else:
        span = (1, _lines(tree.body[0])[1] if tree.body else 1)
    if not missing and not unused:
        return PatchState.APPLIED, "", span, {}
    anchor = compiled.before_anchor
    after_statement = ""
    if anchor is not None:
        matches = [n for n in leading if anchor.matches(n, shapes_of)]
        if len(matches) == 1:
            after_statement = ast.unparse(matches[0])
    if not after_statement and leading:
        after_statement = ast.unparse(leading[-1])
    details = {
        "add": [list(a) for a in missing],
        "drop": [list(a) for a in unused],
        "after": after_statement,
    }
    return PatchState.NEEDED, "", span, details


def _leading_imports(tree: ast.Module) -> list[ast.stmt]:
    """The module's top-level imports before its first definition."""
    found: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, shapes.DEFINITIONS):
            break
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
    return found


def _used_names(tree: ast.Module) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Global | ast.Nonlocal)
        for name in node.names
    }


# -- the data file ------------------------------------------------------------


def data_file_name(patch_id: str) -> str:
    """``vllm#49397`` -> ``vllm-49397.toml``."""
    return patch_id.replace("#", "-").replace("/", "-") + ".toml"


def load_derived(path: Path) -> DerivedPatch:
    """Read one data file; a broken one is a DeepstackError naming it."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    hint = (
        "restore the file, or derive it again with 'deepstack-patch derive' "
        "(docs/derive.md describes the format)"
    )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeepstackError(f"cannot read: {exc}", hint, path=str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        if line is None:
            import re

            found = re.search(r"line (\d+)", str(exc))
            line = int(found.group(1)) if found else None
        raise DeepstackError(
            f"not a valid TOML file: {exc}", hint, path=str(path), line=line
        ) from None
    try:
        return _from_data(data, str(path))
    except (KeyError, TypeError, ValueError, SyntaxError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise DeepstackError(
            f"not a derived patch: {what}", hint, path=str(path)
        ) from None


def _from_data(data: dict[str, Any], origin: str) -> DerivedPatch:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema is {data.get('schema')!r}, expected {SCHEMA}")

    def text(table: dict[str, Any], name: str, default: str | None = None) -> str:
        value = table.get(name, default)
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string")
        return value

    def anchor(value: Any) -> Anchor | None:
        if value is None:
            return None
        match value:
            case {"code": str(code), "match": "statement" | "header" as match}:
                return Anchor(code, match)
        raise ValueError(f"an anchor must be {{code, match}}, got {value!r}")

    units = []
    for table in data["units"]:
        kind = text(table, "kind")
        if kind not in UNIT_KINDS:
            raise ValueError(f"unknown unit kind {kind!r}")
        edits = []
        for edit in table["edits"]:
            edit_kind = text(edit, "kind")
            if edit_kind not in EDIT_KINDS:
                raise ValueError(f"unknown edit kind {edit_kind!r}")
            edits.append(
                Edit(
                    kind=edit_kind,
                    block=tuple(
                        Step(text(s, "header"), text(s, "field", "body"))
                        for s in edit.get("block", [])
                    ),
                    before_anchor=anchor(edit.get("before_anchor")),
                    after_anchor=anchor(edit.get("after_anchor")),
                    removed=text(edit, "removed", ""),
                    inserted=text(edit, "inserted", ""),
                    header_before=text(edit, "header_before", ""),
                    header_after=text(edit, "header_after", ""),
                )
            )
        units.append(
            Unit(
                path=text(table, "path"),
                kind=kind,
                name=text(table, "name"),
                before=text(table, "before", ""),
                after=text(table, "after", ""),
                edits=tuple(edits),
            )
        )
    if not units:
        raise ValueError("it has no units")
    patch = DerivedPatch(
        id=text(data, "id"),
        title=text(data, "title", ""),
        symptom=text(data, "symptom", ""),
        base=text(data, "base", ""),
        base_tree=text(data, "base_tree", ""),
        paths=[str(p) for p in data["paths"]],
        units=units,
        tests=[
            RecordedTest(text(t, "path"), text(t, "content"))
            for t in data.get("tests", [])
        ],
        requires=[str(r) for r in data.get("requires", [])],
        origin=origin,
        upstream_url=text(data, "upstream_url", ""),
    )
    for unit in patch.units:  # every recorded piece of code must parse
        for edit in unit.edits:
            patch._compile(edit)
    return patch


def dump_derived(patch: DerivedPatch) -> str:
    """The data file's text (TOML, schema 1)."""
    out = [
        f"# A derived patch: {patch.id}. Made by 'deepstack-patch derive' from the",
        "# upstream diff; docs/derive.md describes this file.",
        f"schema = {SCHEMA}",
        f"id = {_string(patch.id)}",
        f"title = {_string(patch.title)}",
        f"symptom = {_string(patch.symptom)}",
        f"upstream_url = {_string(patch.upstream_url)}",
        f"base = {_string(patch.base)}",
        f"base_tree = {_string(patch.base_tree)}",
        "paths = [" + ", ".join(_string(p) for p in patch.paths) + "]",
        "requires = [" + ", ".join(_string(r) for r in patch.requires) + "]",
    ]
    for test in patch.recorded_tests:
        out += ["", "[[tests]]", f"path = {_string(test.path)}"]
        out.append(f"content = {_text(test.content)}")
    for unit in patch.units:
        out += [
            "",
            "[[units]]",
            f"path = {_string(unit.path)}",
            f"kind = {_string(unit.kind)}",
            f"name = {_string(unit.name)}",
            f"before = {_text(unit.before)}",
            f"after = {_text(unit.after)}",
        ]
        for edit in unit.edits:
            out += ["", "[[units.edits]]", f"kind = {_string(edit.kind)}"]
            steps = ", ".join(
                f"{{header = {_string(s.header)}, field = {_string(s.field)}}}"
                for s in edit.block
            )
            out.append(f"block = [{steps}]")
            for name in ("before_anchor", "after_anchor"):
                value = getattr(edit, name)
                if value is not None:
                    out.append(
                        f"{name} = {{code = {_string(value.code)}, "
                        f"match = {_string(value.match)}}}"
                    )
            for name in ("removed", "inserted", "header_before", "header_after"):
                value = getattr(edit, name)
                if value:
                    out.append(f"{name} = {_text(value)}")
    return "\n".join(out) + "\n"


def write_derived(patch: DerivedPatch, out_dir: Path) -> Path:
    """Write the data file into ``out_dir`` atomically; its path."""
    target = out_dir / data_file_name(patch.id)
    handle, staging = tempfile.mkstemp(prefix=".derive-", dir=out_dir)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(dump_derived(patch))
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return target


def _string(value: str) -> str:
    """A TOML basic string (one line)."""
    escaped = []
    for char in value:
        if char in '"\\':
            escaped.append("\\" + char)
        elif char == "\n":
            escaped.append("\\n")
        elif char == "\t":
            escaped.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def _text(value: str) -> str:
    """Code as a multi-line literal string where it can be one (a reviewer
    reads it as the PR shows it), else as a basic string."""
    readable = (
        "'''" not in value
        and not value.endswith("'")
        and all(c in "\n\t" or (ord(c) >= 0x20 and ord(c) != 0x7F) for c in value)
    )
    if readable and value:
        return "'''\n" + value + "'''"
    return _string(value)


__all__ = [
    "Anchor",
    "DerivedPatch",
    "Edit",
    "Step",
    "Unit",
    "data_file_name",
    "dump_derived",
    "load_derived",
    "write_derived",
]

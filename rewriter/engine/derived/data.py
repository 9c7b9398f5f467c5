"""A derived patch's data: its units and edits, and the data file (TOML,
schema 1, one per patch; docs/derive.md describes it)."""

from __future__ import annotations

import ast
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import RecordedTest

SCHEMA = 1

#: How a part whose code this release never had begins its reason.
NOT_IN_RELEASE = "not in this release: "

#: The kinds of unit, as the data file names them.
UNIT_KINDS = (
    "function",
    "method",
    "class",
    "class-attribute",
    "module-statement",
    "import",
    "new-file",
    "deleted-file",
    # An entry of a large literal or a keyword of a long call of the module
    # or a class (engine/derived/entries.py).
    "entry",
)
EDIT_KINDS = ("body", "header", "imports", "docstring", "entry", "comments")
#: The edit kinds that change documentation alone, never code.
DOCUMENTATION = frozenset({"docstring", "comments"})

#: The units that add or delete a whole file: ``after`` (``before``) is the
#: file's whole text, the other side is "", and the data file records no
#: edits for them (the text is the change).
FILE_KINDS = ("new-file", "deleted-file")

#: The one edit a whole-file unit holds in memory (never written): the whole
#: text as ``inserted`` (a new file) or ``removed`` (a deleted one), so that
#: the checks of the fix's new code read a new module as they read any
#: other inserted code (engine/derived/names.py, runtime.py, reads.py).
WHOLE_FILE_EDIT = "file"


@dataclass(frozen=True)
class Step:
    """One step from a unit's block into a nested one: the compound statement
    (by its header code) and which of its blocks (``body``, ``orelse``,
    ``finalbody``; ``header`` for the definition a header edit changes)."""

    header: str
    field: str = "body"
    #: The statements right before and after the compound statement in its
    #: block, recorded where its header is there more than once (None: not
    #: recorded, or the block's edge); they tell the occurrences apart.
    before: Anchor | None = None
    after: Anchor | None = None


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
    ``entry``: in the statement of the block ``block`` leads to whose large
    literal or call holds them, the entries ``removed`` (written inside
    their statement) become ``inserted``; the anchors are the entries
    around them, by key (engine/derived/entries.py).
    ``comments``: in the block ``block`` leads to, the blank and comment
    lines ``removed`` between ``before_anchor`` (None: the block's start)
    and ``after_anchor`` become ``inserted`` (engine/derived/comments.py).
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
        if self.kind in FILE_KINDS:
            return f"{self.kind.replace('-', ' ')} {self.path}"
        return f"{what.get(self.kind, self.kind)} {self.label} in {self.path}"

    @property
    def label(self) -> str:
        """The unit as people read it: its name, or for statements that bind
        no name, whose name is only their kind (``try``, ``expr``), the head
        of their code (``try: import pynvml …``)."""
        prefix, _, last = self.name.rpartition(".")
        kind = last.partition(" (")[0]  # "try (2)": the second such unit
        if self.kind not in ("module-statement", "class-attribute") or (
            kind not in _STATEMENT_KINDS
        ):
            return self.name
        head = code_head(self.before or self.after)
        if not head:
            return self.name
        return f"{prefix}.`{head}`" if prefix else f"`{head}`"

    @property
    def whole_file(self) -> bool:
        return self.kind in FILE_KINDS

    @property
    def documentation_only(self) -> bool:
        """Whether the fix changes only documentation here (docstrings,
        comment lines): such
        a unit is carried where the old text is found exactly, and never
        holds the fix's code back (docs/derive.md)."""
        return bool(self.edits) and all(e.kind in DOCUMENTATION for e in self.edits)


#: What ``units.statement_name`` calls statements that bind no name.
_STATEMENT_KINDS = frozenset(
    cls.__name__.lower() for cls in ast.stmt.__subclasses__()
) | {"statement"}


def code_head(code: str, width: int = 60) -> str:
    """The first line of ``code``, with the first line of its block where
    the first is a bare keyword (``try:``), and ``…`` where more follows."""
    lines = [line.strip() for line in code.splitlines() if line.strip()]
    if not lines:
        return ""
    head, rest = lines[0], lines[1:]
    if head.endswith(":") and head[:-1].isidentifier() and rest:
        head, rest = f"{head} {rest[0]}", rest[1:]
    if len(head) > width:
        return head[: width - 1].rstrip() + "…"
    return head + (" …" if rest else "")


def module_name(path: str) -> str:
    """``vllm/a/b.py`` -> ``vllm.a.b`` (``vllm/a/__init__.py`` -> ``vllm.a``):
    the name of a whole-file unit."""
    dotted = path.removesuffix(".py").replace("/", ".")
    return dotted.removesuffix(".__init__")


def new_modules(units: Sequence[Unit], inside: str = "") -> set[str]:
    """The dotted names of the modules the units add as new files; with
    ``inside``, the names of those that are submodules of that package."""
    added = {unit.name for unit in units if unit.kind == "new-file"}
    if not inside:
        return added
    return {
        name[len(inside) + 1 :] for name in added if name.rpartition(".")[0] == inside
    }


def whole_file_unit(path: str, kind: str, text: str) -> Unit:
    """A unit that adds (``new-file``) or deletes (``deleted-file``) the file
    ``path`` whose text is ``text``, with its one in-memory edit (see
    :data:`WHOLE_FILE_EDIT`)."""
    before, after = ("", text) if kind == "new-file" else (text, "")
    edit = Edit(kind=WHOLE_FILE_EDIT, removed=before, inserted=after)
    return Unit(path, kind, module_name(path), before, after, (edit,))


@dataclass(frozen=True)
class SkippedTest:
    """A test file of the diff left out of the patch's proof, and why (its
    hunks do not apply to the base, or the base lacks the file)."""

    path: str
    reason: str


# -- the data file ------------------------------------------------------------


def pull_request_url(patch_id: str) -> str:
    """``vllm#49397`` -> its pull request's address; "" for another project."""
    project, _, number = patch_id.partition("#")
    if project == "vllm" and number.isdigit():
        return f"https://github.com/vllm-project/vllm/pull/{number}"
    return ""


def data_file_name(patch_id: str) -> str:
    """``vllm#49397`` -> ``vllm-49397.toml``."""
    return patch_id.replace("#", "-").replace("/", "-") + ".toml"


#: What to do about a broken data file.
BROKEN_HINT = (
    "restore the file, or derive it again with 'deepstack-patch derive' "
    "(docs/derive.md describes the format)"
)


def file_holding_id(folder: Path, patch_id: str) -> Path | None:
    """The data file in ``folder`` whose id is ``patch_id``, whatever its
    name (``--patches`` reads every ``*.toml`` of a folder). Only the id is
    read: a file that is no data file is the loader's to refuse."""
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.toml")):
        try:
            data = _toml().loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # TOMLDecodeError is a ValueError
        if data.get("id") == patch_id:
            return path
    return None


def _toml() -> Any:
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib


def read_fields(path: Path, raw: bytes | None = None) -> dict[str, Any]:
    """A data file's fields, as :class:`DerivedPatch` takes them (from
    ``raw``, its bytes, where given); a broken file is a DeepstackError
    naming it (and the line, where TOML says)."""
    tomllib = _toml()
    hint = BROKEN_HINT
    try:
        text = (path.read_bytes() if raw is None else raw).decode("utf-8")
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
        return _fields(data, str(path))
    except (KeyError, TypeError, ValueError, SyntaxError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise DeepstackError(
            f"not a derived patch: {what}", hint, path=str(path)
        ) from None


def url_problem(url: str) -> str:
    """Why ``url`` cannot be a fix's upstream URL (commits, DEP-3 headers and
    the SBOM carry it as it is); ``""`` where it can, or is empty."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if url and (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or any(c.isspace() for c in url)
    ):
        return "not an http(s) URL"
    return ""


def commit_problem(commit: str) -> str:
    """Why ``commit`` cannot be the upstream commit a fix was derived from
    (commits, DEP-3 headers and the SBOM carry it); ``""`` where it can."""
    import re

    if commit and not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        return "not a full commit sha (40 or 64 hex digits)"
    return ""


def version_problem(version: str) -> str:
    """Why ``version`` cannot be a first fixed release; ``""`` where it can."""
    from packaging.version import InvalidVersion, Version

    if version:
        try:
            Version(version)
        except InvalidVersion:
            return "not a version"
    return ""


def _field(table: dict[str, Any], name: str, default: str | None = None) -> str:
    value = table.get(name, default)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string")
    return value


def _anchor(value: Any) -> Anchor | None:
    if value is None:
        return None
    match value:
        case {"code": str(code), "match": "statement" | "header" as match}:
            return Anchor(code, match)
    raise ValueError(f"an anchor must be {{code, match}}, got {value!r}")


def _edit(edit: dict[str, Any]) -> Edit:
    edit_kind = _field(edit, "kind")
    if edit_kind not in EDIT_KINDS:
        raise ValueError(f"unknown edit kind {edit_kind!r}")
    if edit_kind == "comments" and edit.get("after_anchor") is None:
        raise ValueError(
            "a comments edit needs an after_anchor: the statement its lines are above"
        )
    return Edit(
        kind=edit_kind,
        block=tuple(
            Step(
                _field(s, "header"),
                _field(s, "field", "body"),
                _anchor(s.get("before")),
                _anchor(s.get("after")),
            )
            for s in edit.get("block", [])
        ),
        before_anchor=_anchor(edit.get("before_anchor")),
        after_anchor=_anchor(edit.get("after_anchor")),
        removed=_field(edit, "removed", ""),
        inserted=_field(edit, "inserted", ""),
        header_before=_field(edit, "header_before", ""),
        header_after=_field(edit, "header_after", ""),
    )


def _test_names(table: dict[str, Any]) -> tuple[str, ...]:
    """A recorded test's ``names``: pytest node ids below its file."""
    match table.get("names", []):
        case list(names) if all(isinstance(n, str) and n for n in names):
            return tuple(names)
    raise ValueError(f"{table.get('path')}: names must be a list of test names")


def _unit(table: dict[str, Any]) -> Unit:
    kind = _field(table, "kind")
    if kind not in UNIT_KINDS:
        raise ValueError(f"unknown unit kind {kind!r}")
    if kind in FILE_KINDS:
        return _file_unit(table, kind)
    return Unit(
        path=_field(table, "path"),
        kind=kind,
        name=_field(table, "name"),
        before=_field(table, "before", ""),
        after=_field(table, "after", ""),
        edits=tuple(_edit(edit) for edit in table["edits"]),
    )


def _file_unit(table: dict[str, Any], kind: str) -> Unit:
    """A whole-file unit: its text on one side, "" on the other, no edits
    (the text is the change, read once by a reviewer)."""
    path = _field(table, "path")
    before, after = _field(table, "before", ""), _field(table, "after", "")
    if table.get("edits"):
        raise ValueError(f"unit {kind} {path}: a whole file has no edits")
    if (before if kind == "new-file" else after) != "":
        side = "before" if kind == "new-file" else "after"
        raise ValueError(f"unit {kind} {path}: `{side}` must be empty")
    unit = whole_file_unit(path, kind, before or after)
    name = _field(table, "name", unit.name)
    if name != unit.name:
        raise ValueError(f"unit {kind} {path}: its name is {unit.name!r}, not {name!r}")
    return unit


def _fields(data: dict[str, Any], origin: str) -> dict[str, Any]:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema is {data.get('schema')!r}, expected {SCHEMA}")
    units = [_unit(table) for table in data["units"]]
    if not units:
        raise ValueError("it has no units")
    patch_id = _field(data, "id")
    if not patch_id or any(c.isspace() for c in patch_id):
        raise ValueError(f"id {patch_id!r}: an id is short text without spaces")
    paths = [str(p) for p in data["paths"]]
    for path in paths:
        # A path names a file of the tree, never one beside or above it.
        if path.startswith("/") or ".." in path.split("/") or not path.endswith(".py"):
            raise ValueError(f"path {path!r} is not a .py file inside the tree")
    for unit in units:
        if unit.path not in paths:
            raise ValueError(f"unit {unit.name} is in {unit.path}, not one of paths")
    upstream_url = _field(data, "upstream_url", "")
    fixed_in = _field(data, "fixed_in", "")
    # As derive checks --upstream-url and --fixed-in: a hand edit is no way
    # around what commits, DEP-3 headers and the SBOM can carry.
    commit = _field(data, "commit", "")
    for name, value, problem in (
        ("upstream_url", upstream_url, url_problem(upstream_url)),
        ("fixed_in", fixed_in, version_problem(fixed_in)),
        ("commit", commit, commit_problem(commit)),
    ):
        if problem:
            raise ValueError(f"{name} {value!r}: {problem}")
    return {
        "id": patch_id,
        "title": _field(data, "title", ""),
        "symptom": _field(data, "symptom", ""),
        "base": _field(data, "base", ""),
        "base_tree": _field(data, "base_tree", ""),
        "commit": _field(data, "commit", ""),
        "paths": paths,
        "units": units,
        "tests": [
            RecordedTest(
                _field(t, "path"),
                _field(t, "content"),
                _test_names(t),
            )
            for t in data.get("tests", [])
        ],
        "skipped_tests": [
            SkippedTest(_field(t, "path"), _field(t, "reason"))
            for t in data.get("skipped_tests", [])
        ],
        "requires": [str(r) for r in data.get("requires", [])],
        "not_carried": _not_carried(data.get("not_carried", [])),
        "origin": origin,
        "upstream_url": upstream_url,
        "fixed_in": fixed_in,
    }


def _not_carried(value: Any) -> list[str]:
    match value:
        case list(items) if all(isinstance(item, str) and item for item in items):
            return items
    raise ValueError("not_carried must be a list of text (what derive left out)")


def dump_derived(patch: Any) -> str:
    """A :class:`~.derived.DerivedPatch`'s data file text (TOML, schema 1)."""
    out = [
        f"# A derived patch: {patch.id}. Made by 'deepstack-patch derive' from the",
        "# upstream diff; docs/derive.md describes this file.",
        f"schema = {SCHEMA}",
        f"id = {_string(patch.id)}",
        f"title = {_string(patch.title)}",
        f"symptom = {_string(patch.symptom)}",
        f"upstream_url = {_string(patch.upstream_url)}",
        f"fixed_in = {_string(patch.fixed_in)}",
        f"base = {_string(patch.base)}",
        f"base_tree = {_string(patch.base_tree)}",
        *([f"commit = {_string(patch.commit)}"] if patch.commit else []),
        "paths = [" + ", ".join(_string(p) for p in patch.paths) + "]",
        "requires = [" + ", ".join(_string(r) for r in patch.requires) + "]",
    ]
    if patch.not_carried:
        # What of the upstream fix the patch leaves out: status shows it.
        out.append("not_carried = [")
        out += [f"    {_string(item)}," for item in patch.not_carried]
        out.append("]")
    for test in patch.recorded_tests:
        out += ["", "[[tests]]", f"path = {_string(test.path)}"]
        if test.names:
            out.append("names = [" + ", ".join(_string(n) for n in test.names) + "]")
        out.append(f"content = {_text(test.content)}")
    for skipped in patch.skipped_tests:
        out += ["", "[[skipped_tests]]", f"path = {_string(skipped.path)}"]
        out.append(f"reason = {_string(skipped.reason)}")
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
        for edit in () if unit.whole_file else unit.edits:
            out += ["", "[[units.edits]]", f"kind = {_string(edit.kind)}"]
            steps = ", ".join(_step(s) for s in edit.block)
            out.append(f"block = [{steps}]")
            for name in ("before_anchor", "after_anchor"):
                value = getattr(edit, name)
                if value is not None:
                    out.append(f"{name} = {_inline_anchor(value)}")
            for name in ("removed", "inserted", "header_before", "header_after"):
                value = getattr(edit, name)
                if value:
                    out.append(f"{name} = {_text(value)}")
    return "\n".join(out) + "\n"


def _step(step: Step) -> str:
    fields = [f"header = {_string(step.header)}", f"field = {_string(step.field)}"]
    for name in ("before", "after"):
        value = getattr(step, name)
        if value is not None:
            fields.append(f"{name} = {_inline_anchor(value)}")
    return "{" + ", ".join(fields) + "}"


def _inline_anchor(anchor: Anchor) -> str:
    return f"{{code = {_string(anchor.code)}, match = {_string(anchor.match)}}}"


def write_derived(patch: Any, out_dir: Path) -> Path:
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

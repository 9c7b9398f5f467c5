"""An entry of a large literal, or a keyword of a long call, as an edit of
its own (docs/derive.md, "entries of a large literal").

vLLM keeps registries as one statement: ``environment_variables`` in
``vllm/envs.py`` is a dict of hundreds of entries, ``SchedulerOutput(...)``
a call of a dozen keywords. A fix that changes one entry changes the whole
statement, and no release holds that statement as the fix saw it: the
others differ. Where the rest of the statement is the same, the fix is
recorded as an ``entry`` edit: the entries it removes and inserts, found in
the target by their keys (a dict's key, a keyword's name; a list's, a
set's or a tuple's element by itself), whatever the other entries hold.

A statement's *container* is its largest literal or call (the most entries;
a call's entries are its keywords, its positional arguments are part of
the statement), reached without entering another container's entries; it
counts where it has :data:`LARGE` entries or more (or is a dict of a few
literals that span as many lines: :func:`_literals_by_key`). The *skeleton* is the
statement with its container's entries left out: two statements with one
skeleton are the same statement, whatever their entries.

The data file records an entry edit's code wrapped in its statement, so
that it reads (and parses) as code::

    environment_variables: dict[str, Callable[[], Any]] = {
        "VLLM_X": lambda: int(os.getenv("VLLM_X", "0")),
    }

its first and last lines the skeleton around the entries (``ast.unparse``),
the lines between them the entries' region as the file writes them (the
entries and the blank and comment lines above them, as :mod:`.regions`
records a block's statements), indented by four spaces. Its neighbours are
recorded by their key (``"VLLM_Y": ...``, ``name=...``), an element by
itself.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from deepstack_patch.engine.derived import regions, shapes

#: A literal or call counts as a container of entries from this many on:
#: with fewer, a diff's context (three lines on each side) holds the whole
#: of it, and the statement is the unit, as ``git apply`` treats it.
LARGE = 6

#: How deep the wrapped code indents the entries.
WRAP_INDENT = "    "

CONTAINERS = (ast.Dict, ast.Call, ast.List, ast.Set, ast.Tuple)


@dataclass(frozen=True)
class Entry:
    """One entry of a container: what names it (a key, a keyword's name;
    an element by itself), the whole of it, its lines (1-based, its
    ``**`` or ``*`` included) and how a reason quotes it."""

    identity: str
    shape: str
    first: int
    last: int
    label: str
    nodes: tuple[ast.AST, ...]


def entries_of(container: ast.AST) -> list[Entry]:
    """The entries of a dict, a call (its keywords), a list, set or tuple."""
    found = []
    match container:
        case ast.Dict(keys=keys, values=values):
            for key, value in zip(keys, values, strict=True):
                if key is None:  # `**other`
                    dumped = "spread " + shapes.shape(value)
                    found.append(_entry(dumped, dumped, value, value, "**"))
                else:
                    identity = "key " + shapes.shape(key)
                    whole = identity + " " + shapes.shape(value)
                    found.append(_entry(identity, whole, key, value, ""))
        case ast.Call(keywords=keywords):
            for keyword in keywords:
                value = shapes.shape(keyword.value)
                if keyword.arg is None:  # `**kwargs`
                    found.append(
                        _entry("spread " + value, "spread " + value, keyword, keyword)
                    )
                else:
                    identity = "keyword " + keyword.arg
                    found.append(
                        _entry(identity, identity + " " + value, keyword, keyword)
                    )
        case (
            ast.List(elts=elements) | ast.Set(elts=elements) | ast.Tuple(elts=elements)
        ):
            for element in elements:
                dumped = "element " + shapes.shape(element)
                found.append(_entry(dumped, dumped, element, element))
    return found


def _entry(
    identity: str, whole: str, first: ast.AST, last: ast.AST, prefix: str = ""
) -> Entry:
    label = prefix + ast.unparse(first) if first is last else ast.unparse(first)
    return Entry(
        identity,
        whole,
        first.lineno,  # type: ignore[attr-defined]
        last.end_lineno or last.lineno,  # type: ignore[attr-defined]
        label,
        (first, last) if first is not last else (first,),
    )


def _children(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes below ``node`` that are not a container's entries."""
    for name, value in ast.iter_fields(node):
        if isinstance(node, ast.Dict) and name in ("keys", "values"):
            continue
        if isinstance(node, ast.Call) and name == "keywords":
            continue
        if isinstance(node, ast.List | ast.Set | ast.Tuple) and name == "elts":
            continue
        if isinstance(value, ast.AST):
            yield value
        elif isinstance(value, list):
            yield from (item for item in value if isinstance(item, ast.AST))


#: The fields of a compound statement's header that may hold a container
#: (an ``if``'s or ``elif``'s test: ``model_type in ("a", "b", ...)``).
HEADER_FIELDS = {ast.If: ("test",), ast.While: ("test",), ast.For: ("target", "iter")}


def container_of(statement: ast.stmt) -> ast.AST | None:
    """The statement's container (see the module's docstring), where it has
    :data:`LARGE` entries or more; in an ``if``, ``elif``, ``while`` or
    ``for``, in its header; None for another compound statement."""
    if shapes.is_docstring(statement):
        return None
    pending: list[ast.AST] = [statement]
    if shapes.is_compound(statement):
        fields = HEADER_FIELDS.get(type(statement), ())  # type: ignore[call-overload]
        pending = [getattr(statement, name) for name in fields]
        if not pending:
            return None
    best: ast.AST | None = None
    size = 0
    while pending:
        node = pending.pop(0)
        if isinstance(node, CONTAINERS):
            count = len(entries_of(node))
            if count > size:
                best, size = node, count
        pending.extend(_children(node))
    if size >= LARGE or _literals_by_key(best):
        return best
    return None


def _literals_by_key(container: ast.AST | None) -> bool:
    """Whether ``container`` is a dict of fewer than :data:`LARGE` entries
    that counts all the same: two keys or more, each holding a list, set,
    tuple or dict, on :data:`LARGE` lines or more together. Such a registry
    (``_POSSIBLE_KERNELS``: a platform's kernels, a list of lines each) is
    small by its keys and large by its lines: a diff's context holds one
    entry, not the statement, so a release whose other entries differ
    (another platform's kernels) has the entry as the fix expects it."""
    match container:
        case ast.Dict(keys=keys, values=values) if None not in keys:
            literals = all(
                isinstance(value, ast.List | ast.Set | ast.Tuple | ast.Dict)
                for value in values
            )
            lines = sum(
                (value.end_lineno or value.lineno) - key.lineno + 1  # type: ignore[union-attr]
                for key, value in zip(keys, values, strict=True)
            )
            return len(values) >= 2 and literals and lines >= LARGE
    return False


def skeleton(statement: ast.stmt, container: ast.AST, whole: bool = False) -> str:
    """The statement's shape with ``container``'s entries left out (a
    compound statement's header: its blocks are not the edit's; with
    ``whole``, its blocks too)."""
    saved = _empty(container)
    try:
        if shapes.is_compound(statement) and not whole:
            return "skeleton " + shapes.header(statement, {})
        return "skeleton " + shapes.shape(statement, {})
    finally:
        _restore(container, saved)


_Saved = tuple[list[ast.AST | None], list[ast.AST]]


def _empty(container: ast.AST) -> _Saved:
    match container:
        case ast.Dict():
            saved: _Saved = (container.keys, container.values)
            container.keys, container.values = [], []
        case ast.Call():
            saved = ([], container.keywords)  # type: ignore[assignment]
            container.keywords = []
        case ast.List() | ast.Set() | ast.Tuple():
            saved = ([], container.elts)
            container.elts = []
        case _:
            raise TypeError(f"not a container: {type(container).__name__}")
    return saved


def _restore(container: ast.AST, saved: _Saved) -> None:
    match container:
        case ast.Dict():
            container.keys, container.values = saved  # type: ignore[assignment]
        case ast.Call():
            container.keywords = saved[1]  # type: ignore[assignment]
        case ast.List() | ast.Set() | ast.Tuple():
            container.elts = saved[1]  # type: ignore[assignment]


def path_of(root: ast.AST, target: ast.AST) -> tuple[tuple[str, int], ...] | None:
    """The fields (and list indices, -1 for none) from ``root`` down to
    ``target``, never through a container's entries."""
    if root is target:
        return ()
    for name, value in ast.iter_fields(root):
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if not isinstance(item, ast.AST) or item not in list(_children(root)):
                continue
            below = path_of(item, target)
            if below is not None:
                at = index if isinstance(value, list) else -1
                return ((name, at), *below)
    return None


def at_path(root: ast.AST, path: Sequence[tuple[str, int]]) -> ast.AST | None:
    node: object = root
    for name, index in path:
        node = getattr(node, name, None)
        if index >= 0:
            node = node[index] if isinstance(node, list) and index < len(node) else None
        if not isinstance(node, ast.AST):
            return None
    return node  # type: ignore[return-value]


# -- the recorded code ---------------------------------------------------------

_MARKER = "__entries__"


def wrapper(statement: ast.stmt, container: ast.AST) -> tuple[str, str]:
    """The skeleton's code before and after the entries: its first and last
    line in the recorded code."""
    saved = _empty(container)
    marker = ast.Name(_MARKER, ast.Load())
    match container:
        case ast.Dict():
            container.keys, container.values = [None], [marker]
            written = "**" + _MARKER
        case ast.Call():
            container.keywords = [ast.keyword(None, marker)]
            written = "**" + _MARKER
        case _:
            container.elts = [ast.Starred(marker, ast.Load())]  # type: ignore[attr-defined]
            written = "*" + _MARKER
    try:
        code = (
            shapes.header_code(statement)
            if shapes.is_compound(statement)
            else ast.unparse(statement)
        )
    finally:
        _restore(container, saved)
    before, _, after = code.partition(written)
    return before.rstrip(), after.lstrip(",").lstrip()


def wrapped(prefix: str, lines: Sequence[str], suffix: str, raw: set[int]) -> str:
    """The recorded code: ``lines`` (an entries' region, dedented; ``raw``:
    the indices of those inside a string) between the skeleton's lines (a
    header's ``suffix`` goes on with its block, ``...``)."""
    inner = [
        line if index in raw or not line.strip() else WRAP_INDENT + line
        for index, line in enumerate(lines)
    ]
    return "".join(f"{line}\n" for line in [prefix, *inner, suffix])


@dataclass(frozen=True)
class Recorded:
    """Recorded code read back: the statement, its container, and the
    entries' region lines (dedented)."""

    statement: ast.stmt
    container: ast.AST
    lines: tuple[str, ...]
    raw: frozenset[int]  # indices in ``lines`` inside a string

    @property
    def text(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


def read(code: str) -> Recorded:
    """Recorded code (see :func:`wrapped`) read back; a ValueError where it
    is not a statement whose container holds the lines between its first
    and last."""
    statement = ast.parse(code).body
    if len(statement) != 1:
        raise ValueError(f"an entry edit's code is one statement, got {code!r}")
    node = statement[0]
    lines = code.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    # The container opens on the first line and closes last of those that
    # do (a header's block comes after it).
    opened = [n for n in ast.walk(node) if isinstance(n, CONTAINERS) and n.lineno == 1]
    last = max((n.end_lineno or 1 for n in opened), default=1)
    holders = [n for n in opened if n.end_lineno == last]
    if not holders or last < 2:
        raise ValueError(f"no literal or call holds the entries of {code!r}")
    container = holders[-1]  # the innermost: ast.walk goes breadth first
    raw_in_file = regions.string_lines([node])  # 0-based indices of `code`
    inner = []
    raw = set()
    for index in range(1, last - 1):
        line = lines[index]
        if index in raw_in_file:
            raw.add(index - 1)
        elif line.startswith(WRAP_INDENT):
            line = line[len(WRAP_INDENT) :]
        inner.append(line)
    return Recorded(node, container, tuple(inner), frozenset(raw))


def read_pair(removed: str, inserted: str) -> tuple[Recorded, Recorded]:
    """An entry edit's code before and after read back. A set written
    without entries reads as a dict (``{}``): it is read as the set the
    other side holds."""
    old, new = read(removed), read(inserted)
    return _as_set(old, new.container), _as_set(new, old.container)


def _as_set(recorded: Recorded, other: ast.AST) -> Recorded:
    container = recorded.container
    if not isinstance(other, ast.Set) or not isinstance(container, ast.Dict):
        return recorded
    if container.keys:
        return recorded
    path = path_of(recorded.statement, container)
    if not path:
        return recorded
    parent = at_path(recorded.statement, path[:-1])
    name, index = path[-1]
    empty = ast.copy_location(ast.Set(elts=[]), container)
    empty.end_lineno, empty.end_col_offset = (
        container.end_lineno,
        container.end_col_offset,
    )
    if index >= 0:
        getattr(parent, name)[index] = empty
    else:
        setattr(parent, name, empty)
    return Recorded(recorded.statement, empty, recorded.lines, recorded.raw)


def anchor_code(entry: Entry, container: ast.AST, lines: Sequence[str]) -> str:
    """How a neighbour is recorded: a key as ``"K": ...``, a keyword as
    ``name=...``; a spread or an element by its code."""
    match container, entry.nodes:
        case ast.Dict(), (key, _):
            return f"{_source(lines, key)}: ..."
        case ast.Dict(), (value,):  # `**other`
            return "**" + _source(lines, value)
        case ast.Call(), (ast.keyword(arg=str(name)),):
            return f"{name}=..."
        case ast.Call(), (ast.keyword(value=value),):  # `**kwargs`
            return "**" + _source(lines, value)
    return _source(lines, entry.nodes[0])


def anchor_entry(code: str, container: ast.AST) -> Entry:
    """A recorded neighbour read as an entry of a ``container`` like the
    one it was recorded in."""
    match container:
        case ast.Dict():
            parsed = ast.parse("{" + code + "}", mode="eval").body
        case ast.Call():
            parsed = ast.parse("f(" + code + ")", mode="eval").body
        case _:
            parsed = ast.parse("[" + code + "]", mode="eval").body
    found = entries_of(parsed)
    if len(found) != 1:
        raise ValueError(f"a neighbour is one entry, got {code!r}")
    return dataclasses.replace(found[0], label=code)


def _source(lines: Sequence[str], node: ast.AST) -> str:
    """A node's code as the file writes it, where it holds one line."""
    text = ast.get_source_segment("".join(lines), node)
    return text if text is not None and "\n" not in text else ast.unparse(node)


def label(entry: Entry, source: str = "") -> str:
    """An entry as a unit's name shows it (``"VLLM_X"``, ``name=``), as
    ``source`` writes it where given."""
    match entry.nodes:
        case (ast.keyword(arg=str(name)),):
            return f"{name}="
    written = ast.get_source_segment(source, entry.nodes[0]) if source else None
    if written is None or "\n" in written or entry.identity.startswith("spread"):
        written = entry.label
    return shapes.quoted(written, 40)


# -- the lines of entries --------------------------------------------------------


def starts_its_line(lines: Sequence[str], entry: Entry) -> bool:
    """Whether nothing but its ``**``/``*`` is before the entry on its line."""
    node = entry.nodes[0]
    before = lines[entry.first - 1][: node.col_offset]  # type: ignore[attr-defined]
    return not before.strip() or before.strip() in ("*", "**")


def ends_its_line(lines: Sequence[str], entry: Entry) -> bool:
    """Whether only its comma (and a comment) follows the entry on its line."""
    node = entry.nodes[-1]
    end = node.end_col_offset or 0  # type: ignore[attr-defined]
    after = lines[entry.last - 1][end:]
    return re.fullmatch(r"\s*,?\s*(#.*)?\s*", after.rstrip("\r\n")) is not None


def has_comma(lines: Sequence[str], entry: Entry) -> bool:
    node = entry.nodes[-1]
    end = node.end_col_offset or 0  # type: ignore[attr-defined]
    return lines[entry.last - 1][end:].lstrip().startswith(",")


def region(
    lines: Sequence[str],
    container: ast.AST,
    entries: Sequence[Entry],
    start: int,
    end: int,
) -> regions.Region | str:
    """The lines of ``entries[start:end]`` (``start == end``: where an
    insertion goes) and the blank and comment lines between them and their
    neighbours; why not, where the entries do not each hold whole lines."""
    around = entries[max(start - 1, 0) : end + 1]
    for entry in around:
        if not starts_its_line(lines, entry) or not ends_its_line(lines, entry):
            return "an entry shares a line with another"
    if start > 0:
        first = entries[start - 1].last
    elif entries:
        first = entries[0].first - 1
        opening = container.lineno  # type: ignore[attr-defined]
        while first > opening and regions.is_gap(lines[first - 1]):
            first -= 1
        if first < opening:
            return "the entries start on the line of their bracket"
    else:
        return "the literal is empty"
    if end < len(entries):
        stop = entries[end].first - 1
    elif end > start:
        stop = entries[end - 1].last
    else:
        stop = first
    indent = regions.indentation(lines[entries[0].first - 1])
    raw = frozenset(
        regions.string_lines(n for e in entries[start:end] for n in e.nodes)
    )
    return regions.Region(first, stop, indent, raw=raw)


# -- recognition and the rewrite: one locator ------------------------------------


@dataclass(frozen=True)
class Pattern:
    """An entry edit read once: where its container is in its statement,
    the statement's skeleton, and the entries it removes and inserts."""

    path: tuple[tuple[str, int], ...]
    kind: type
    skeleton: str
    #: The name the statement binds (``environment_variables``), "" none.
    name: str
    #: The skeleton's first line, as a reason quotes the statement.
    prefix: str
    removed: tuple[Entry, ...]
    inserted: tuple[Entry, ...]
    before: Entry | None
    after: Entry | None
    old: Recorded
    new: Recorded

    @classmethod
    def of(cls, removed: str, inserted: str, before: str, after: str) -> Pattern:
        old, new = read_pair(removed, inserted)
        path = path_of(old.statement, old.container)
        if path is None or type(old.container) is not type(new.container):
            raise ValueError("an entry edit's code before and after differ in kind")
        if skeleton(old.statement, old.container) != skeleton(
            new.statement, new.container
        ):
            raise ValueError("an entry edit changes its statement around the entries")
        return cls(
            path,
            type(old.container),
            skeleton(old.statement, old.container),
            bound_name(old.statement),
            removed.split("\n", 1)[0],
            _labelled(entries_of(old.container), removed),
            _labelled(entries_of(new.container), inserted),
            anchor_entry(before, old.container) if before else None,
            anchor_entry(after, old.container) if after else None,
            old,
            new,
        )

    @property
    def keyed(self) -> bool:
        """Whether entries are named by a key (a dict's, a keyword's)."""
        return self.kind in (ast.Dict, ast.Call)

    def what(self) -> str:
        """The literal, as a reason names it."""
        return f"`{self.name}`" if self.name else f"`{shapes.quoted(self.prefix)}`"


def _labelled(found: Sequence[Entry], source: str) -> tuple[Entry, ...]:
    """Entries quoted as ``source`` writes their first line (a key's
    quotes), not as ``ast.unparse`` would."""
    out = []
    for entry in found:
        written = ast.get_source_segment(source, entry.nodes[0])
        if written is not None and "\n" not in written:
            prefix = "**" if entry.label.startswith("**") else ""
            entry = dataclasses.replace(entry, label=prefix + written)
        out.append(entry)
    return tuple(out)


def bound_name(statement: ast.stmt) -> str:
    match statement:
        case (
            ast.Assign(targets=[ast.Name(id=name)])
            | ast.AnnAssign(target=ast.Name(id=name))
        ):
            return name
    return ""


@dataclass(frozen=True)
class Found:
    """Where an entry edit's entries are in a target: the statement, its
    container and entries, and the run the edit replaces (``start ==
    end``: where it inserts)."""

    statement: ast.stmt
    container: ast.AST
    entries: tuple[Entry, ...]
    start: int
    end: int


def holders(
    pattern: Pattern, block: Sequence[ast.stmt]
) -> list[tuple[ast.stmt, ast.AST]]:
    """The statements of ``block`` with the pattern's skeleton, and their
    container."""
    found = []
    for node in shapes.without_docstring(block):
        if type(node) is not type(pattern.old.statement):
            continue
        container = at_path(node, pattern.path)
        if type(container) is pattern.kind and skeleton(node, container) == (  # type: ignore[arg-type]
            pattern.skeleton
        ):
            found.append((node, container))
    return found  # type: ignore[return-value]


def runs(entries: Sequence[Entry], wanted: Sequence[Entry]) -> list[int]:
    """Where the entries ``wanted`` occur together, in order."""
    size = len(wanted)
    return [
        start
        for start in range(len(entries) - size + 1)
        if all(entries[start + k].shape == wanted[k].shape for k in range(size))
    ]


def where_in(pattern: Pattern, entries: Sequence[Entry]) -> tuple[str, int, int, str]:
    """The edit's state among a container's ``entries`` (``needed``,
    ``applied``, ``drifted``), the run it replaces and, where it drifted,
    why."""
    what = pattern.what()
    fixed = runs(entries, pattern.inserted) if pattern.inserted else []
    if pattern.removed:
        before = runs(entries, pattern.removed)
        if len(before) == 1 and not fixed:
            start = before[0]
            return "needed", start, start + len(pattern.removed), ""
        if len(fixed) == 1 and not before:
            return "applied", fixed[0], fixed[0] + len(pattern.inserted), ""
        if not pattern.inserted and not before and _none_there(pattern, entries):
            return "applied", 0, 0, ""
        return "drifted", 0, 0, _why(pattern, entries, pattern.removed, before)
    if len(fixed) == 1:
        return "applied", fixed[0], fixed[0] + len(pattern.inserted), ""
    identities = {e.identity for e in entries}
    there = [e for e in pattern.inserted if e.identity in identities]
    if there:
        return (
            "drifted",
            0,
            0,
            f"entry `{shapes.quoted(there[0].label)}` the fix adds is in {what} "
            "already, with another value",
        )
    # An insertion goes right after the entry the fix puts it after; where
    # that one is not there (or at the literal's start), right before the
    # one it puts it before. Entries may have come between them since.
    wanted = [a for a in (pattern.before, pattern.after) if a is not None]
    if not wanted:
        return "drifted", 0, 0, f"the fix adds the only entries of {what}"
    missing = []
    for anchor in wanted:
        at = [i for i, e in enumerate(entries) if e.identity == anchor.identity]
        if len(at) == 1:
            start = at[0] + 1 if anchor is pattern.before else at[0]
            return "needed", start, start, ""
        times = "not found" if not at else f"found {len(at)} times"
        missing.append(f"`{shapes.quoted(anchor.label)}` {times}")
    return (
        "drifted",
        0,
        0,
        f"the entries around the fix's new ones in {what}: " + ", ".join(missing),
    )


def _none_there(pattern: Pattern, entries: Sequence[Entry]) -> bool:
    identities = {e.identity for e in entries}
    return not any(e.identity in identities for e in pattern.removed)


def _why(
    pattern: Pattern,
    entries: Sequence[Entry],
    wanted: Sequence[Entry],
    found: Sequence[int],
) -> str:
    what = pattern.what()
    if len(found) > 1:
        first = shapes.quoted(wanted[0].label)
        return f"entry `{first}` found {len(found)} times in {what}"
    by_identity = {e.identity: e for e in entries}
    for entry in wanted:
        there = by_identity.get(entry.identity)
        if there is None:
            return f"entry `{shapes.quoted(entry.label)}` not found in {what}"
        if there.shape != entry.shape:
            return (
                f"entry `{shapes.quoted(entry.label)}` of {what} is neither the "
                "one the fix expects nor the fixed one"
            )
    return (
        f"the entries the fix replaces in {what} are not together or not in its order"
    )


def locate(pattern: Pattern, block: Sequence[ast.stmt]) -> Found | str:
    """Where the edit goes in ``block``: its statement found once by its
    skeleton, and its entries there as the fix expects them; why not."""
    found = holders(pattern, block)
    if len(found) != 1:
        return f"{pattern.what()} found {len(found)} times, not once"
    statement, container = found[0]
    entries = tuple(entries_of(container))
    state, start, end, why = where_in(pattern, entries)
    if state != "needed":
        return why or f"the entries of {pattern.what()} are already the fixed ones"
    return Found(statement, container, entries, start, end)


def unit_name(removed: str, inserted: str) -> str:
    """An entry unit's name: its statement's name and its first entry
    (``environment_variables["VLLM_X"]``, ``SchedulerOutput(name=)``)."""
    old, new = read_pair(removed, inserted)
    source = removed if entries_of(old.container) else inserted
    changed = entries_of(old.container) or entries_of(new.container)
    first = label(changed[0], source) if changed else "..."
    name = bound_name(old.statement)
    if not name:
        name = shapes.quoted(ast.unparse(old.container).partition("(")[0], 40)
    if isinstance(old.container, ast.Call):
        return f"{name}({first})"
    return f"{name}[{first}]"


def with_comma(lines: Sequence[str], entry: Entry) -> str:
    """The last line of ``entry`` with a comma right after it."""
    line = lines[entry.last - 1]
    end = entry.nodes[-1].end_col_offset or 0  # type: ignore[attr-defined]
    return line[:end] + "," + line[end:]


def replaced_entries(
    lines: Sequence[str],
    region: regions.Region,
    found: Found,
    pattern: Pattern,
    newline: str,
) -> list[str]:
    """The region's lines with the target's own lines of the entries the fix
    replaces (none, for an insertion: right after the entry before) made
    the fix's entries, with the comment lines right above the first that
    the target does not have above it: the way where the blank and comment
    lines around them are not the recorded ones."""
    if found.start < found.end:
        own = (found.entries[found.start].first - 1, found.entries[found.end - 1].last)
    else:
        own = (region.first, region.first)
    new = pattern.new.lines
    inserted = entries_of(pattern.new.container)
    chosen: list[int] = []
    if inserted:
        first, last = inserted[0].first - 2, inserted[-1].last - 2
        kept_above = {lines[i].strip() for i in range(region.first, own[0])}
        while (
            first > 0
            and new[first - 1].strip().startswith("#")
            and new[first - 1].strip() not in kept_above
        ):
            first -= 1
        chosen = list(range(first, last + 1))
    written = [
        new[i] + newline
        if i in pattern.new.raw or not new[i].strip()
        else region.indent + new[i] + newline
        for i in chosen
    ]
    return [*lines[region.first : own[0]], *written, *lines[own[1] : region.stop]]

"""Statements compared as a derived patch compares them: by their ``ast.dump``
without positions, docstrings left out.

A statement has two keys. Its *shape* is the whole statement. Its *identity*
is what names it in its block: a function or class by its kind and name, any
other compound statement (``if``, ``for``, ``with``, ``try``) by its header
(the statement with its blocks emptied), a simple statement by its shape.
Recognition matches anchors by one or the other (see ``Anchor.match``), and
the statements a fix removes or inserts always by their shape.
"""

from __future__ import annotations

import ast
import collections
import copy
import io
import tokenize
from collections.abc import Iterable, Iterator, Sequence

from deepstack_patch.engine.derived import regions

#: The fields of a compound statement that hold a block a diff may change
#: inside (an ``except`` clause's block is part of the ``try``'s header).
BLOCK_FIELDS = ("body", "orelse", "finalbody")

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

#: The compound statements whose header alone a fix may change (the test of
#: an ``if``, ``elif`` or ``while``, the target and iterable of a ``for``,
#: the items of a ``with``), their blocks kept as the target has them.
HEADED = (ast.If, ast.While, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)


def is_docstring(node: ast.stmt) -> bool:
    match node:
        case ast.Expr(value=ast.Constant(value=str())):
            return True
        case _:
            return False


def without_docstring(block: Sequence[ast.stmt]) -> list[ast.stmt]:
    """A block's statements after its docstring (a leading string)."""
    if block and is_docstring(block[0]):
        return list(block[1:])
    return list(block)


def statements_in(nodes: Iterable[ast.AST]) -> Iterator[ast.stmt]:
    """Every statement among ``nodes`` and inside them, nested blocks and
    definitions included. Statements hold statements only in their blocks
    (an expression holds none), so this passes over the expressions that
    ``ast.walk`` visits one by one: a tenth of the nodes of a model file.
    In ``ast.walk``'s order (breadth first, fields in order)."""
    todo = collections.deque(nodes)
    while todo:
        node = todo.popleft()
        if isinstance(node, ast.stmt):
            yield node
        for name in _blocks(type(node)):
            value = getattr(node, name, None)
            if type(value) is list and value and isinstance(value[0], _IN_BLOCKS):
                todo.extend(value)


#: What a block holds: statements, a ``try``'s handlers, a ``match``'s cases.
_IN_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)

#: The fields of a kind of node that may hold a block, in the order of its
#: fields, by kind (read once: ``ast.iter_fields`` over every field of every
#: statement was most of a walk).
_BLOCKS_OF: dict[type, tuple[str, ...]] = {}


def _blocks(kind: type) -> tuple[str, ...]:
    found = _BLOCKS_OF.get(kind)
    if found is None:
        names = (*BLOCK_FIELDS, "handlers", "cases")
        found = _BLOCKS_OF[kind] = tuple(
            name for name in getattr(kind, "_fields", ()) if name in names
        )
    return found


def is_compound(node: ast.stmt) -> bool:
    return any(
        isinstance(getattr(node, name, None), list)
        and getattr(node, name)
        and isinstance(getattr(node, name)[0], ast.stmt)
        for name in BLOCK_FIELDS
    ) or isinstance(node, DEFINITIONS)


#: Shapes already made, by node id, with the node (so its id stays its own).
Memo = dict[int, tuple[ast.AST, str]]


def shape(node: ast.AST, memo: Memo | None = None) -> str:
    """The whole statement, positions and docstrings left out.

    With a ``memo`` each node is dumped once however often an enclosing
    one is (a class, then each of its methods).
    """
    return _dump(node, memo if memo is not None else {})


def _dump(node: object, memo: Memo, emptied: bool = False) -> str:
    # Names and constants are most of a statement's nodes (half a million
    # dumps in a first status of 40 derived fixes): written at once.
    kind = type(node)
    if kind is ast.Name and _FIELDS_AS_WRITTEN:
        context = _CONTEXTS.get(type(getattr(node, "ctx", None)))
        if context is not None:
            return f"Name(id={getattr(node, 'id', None)!r}, ctx={context})"
    elif kind is ast.Constant and _FIELDS_AS_WRITTEN:
        value, constant_kind = getattr(node, "value", None), getattr(node, "kind", None)
        return f"Constant(value={value!r}, kind={constant_kind!r})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(item, memo) for item in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    if not emptied:
        cached = memo.get(id(node))
        if cached is not None and cached[0] is node:
            return cached[1]
    fields = []
    for name in node._fields:
        value = getattr(node, name, None)
        if emptied and name in BLOCK_FIELDS and isinstance(value, list):
            value = []
        elif (
            name == "body"
            and isinstance(node, (*DEFINITIONS, ast.Module))
            and value
            and is_docstring(value[0])
        ):
            value = value[1:]
        fields.append(f"{name}={_dump(value, memo)}")
    text = f"{type(node).__name__}({', '.join(fields)})"
    if not emptied:
        memo[id(node)] = (node, text)
    return text


#: What the general dump writes for a name's context.
_CONTEXTS = {ast.Load: "Load()", ast.Store: "Store()", ast.Del: "Del()"}
#: The fields the shortcuts for names and constants write (this Python's).
_FIELDS_AS_WRITTEN = ast.Name._fields == ("id", "ctx") and (
    ast.Constant._fields == ("value", "kind")
)


def header(node: ast.stmt, memo: Memo | None = None) -> str:
    """The statement with its blocks emptied (a def's decorators, name,
    signature and return annotation; a class's bases; an ``if``'s test)."""
    return _dump(node, memo if memo is not None else {}, emptied=True)


def identity(node: ast.stmt, memo: Memo | None = None) -> str:
    """What names a statement in its block (see the module's docstring)."""
    match node:
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
            return f"def {name}"
        case ast.ClassDef(name=name):
            return f"class {name}"
    if is_compound(node):
        return header(node, memo)
    return shape(node, memo)


def try_head(node: ast.stmt) -> str:
    """A ``try`` by its clauses alone: each ``except``'s type and name, and
    whether it has ``else`` and ``finally`` blocks, the code in them left
    out (an ``except`` body another fix rewrote is still the same ``try``
    to a step into its body); ``""`` for any other statement."""
    # ``try``/``except*`` (ast.TryStar, Python 3.11 on) alike, by their fields.
    handlers = getattr(node, "handlers", None)
    if not isinstance(handlers, list) or not type(node).__name__.startswith("Try"):
        return ""
    clauses = [(_dump(h.type, {}) if h.type else "", h.name or "") for h in handlers]
    blocks = f"else={bool(node.orelse)} finally={bool(node.finalbody)}"  # type: ignore[attr-defined]
    return f"{type(node).__name__}{clauses!r} {blocks}"


def header_code(node: ast.stmt) -> str:
    """The header as readable code: the statement with ``...`` as each of
    its blocks (a ``try`` keeps its ``finally:``, an ``if`` its ``else:``)."""
    emptied = copy.copy(node)
    for name in BLOCK_FIELDS:
        if getattr(emptied, name, None):
            setattr(emptied, name, [ast.Expr(ast.Constant(...))])
    return ast.unparse(emptied)


def header_source(source_lines: Sequence[str], node: ast.stmt) -> str:
    """A compound statement's header as the file writes it (a definition's
    decorators to the colon; an ``elif`` as an ``if``), dedented (see
    :mod:`.regions`); ``header_code`` where it cannot be cut out on whole
    lines."""
    region = regions.header(source_lines, node)
    if isinstance(region, str):
        return header_code(node) + "\n"
    text = regions.recorded(source_lines, region)
    try:  # a header whose last line holds its block is a whole statement
        parsed = ast.parse(text if region.holds_block else text + "    ...\n")
    except SyntaxError:
        parsed = None
    if (
        parsed is not None
        and len(parsed.body) == 1
        and header(parsed.body[0]) == header(node)
    ):
        return text
    return header_code(node) + "\n"


def statements_code(
    source_lines: Sequence[str],
    nodes: Sequence[ast.stmt],
    comments_above: bool = False,
) -> str:
    """The source of consecutive statements, dedented (as the file writes
    them, comments between them included, and with ``comments_above`` the
    comment lines right above the first; see :mod:`.regions`);
    ``ast.unparse`` where the source cannot be cut out on whole lines."""
    if not nodes:
        return ""
    first = regions.first_line(nodes[0])
    while (
        comments_above
        and first > 1
        and source_lines[first - 2].lstrip().startswith("#")
    ):
        first -= 1
    last = nodes[-1].end_lineno or nodes[-1].lineno
    region = regions.Region(
        first - 1,
        last,
        regions.indentation(source_lines[regions.first_line(nodes[0]) - 1]),
        nodes[0].lineno - 1 if regions.is_elif(source_lines, nodes[0]) else -1,
        frozenset(regions.string_lines(nodes)),
    )
    text = regions.recorded(source_lines, region)
    if same_statements(text, nodes):
        return text
    return "\n".join(ast.unparse(n) for n in nodes) + "\n"


def same_statements(text: str, nodes: Sequence[ast.stmt]) -> bool:
    """Whether ``text`` is the code of ``nodes`` (their shapes, in order)."""
    try:
        parsed = ast.parse(text)
    except SyntaxError:
        return False
    return [shape(n) for n in parsed.body] == [shape(n) for n in nodes]


def parse_statements(code: str) -> list[ast.stmt]:
    """The statements of a piece of recorded code."""
    return ast.parse(code).body if code.strip() else []


def blocks_of(node: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every statement block inside ``node``, its own included."""
    for name in BLOCK_FIELDS:
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
            for statement in block:
                yield from blocks_of(statement)
    for handler in getattr(node, "handlers", []):
        yield from blocks_of(handler)


#: How wide a statement a reason quotes may be.
QUOTE_WIDTH = 80


def quoted(code: str, width: int = QUOTE_WIDTH) -> str:
    """What a reason quotes of a piece of code: its first logical line after
    its decorators, whole (a multi-line ``if (`` with its test, physical
    lines joined, comments left out), cut at ``width`` columns."""
    try:
        tokens = tokenize.generate_tokens(io.StringIO(code.strip("\n")).readline)
        line = _first_logical_line(tokens)
    except (tokenize.TokenError, SyntaxError):
        line = code.strip().splitlines()[0] if code.strip() else code
    return _cut(line, width)


def _first_logical_line(tokens: Iterator[tokenize.TokenInfo]) -> str:
    text = ""
    end = (0, 0)
    for token in tokens:
        match token.type:
            case tokenize.COMMENT | tokenize.NL | tokenize.INDENT | tokenize.DEDENT:
                continue
            case tokenize.NEWLINE | tokenize.ENDMARKER:
                if text and not text.startswith("@"):
                    break
                text = ""  # a decorator's line: the next one
                continue
        if text and token.start[0] == end[0]:  # the spacing of its line
            text += " " * (token.start[1] - end[1])
        elif text and not text.endswith(_OPENING) and token.string not in _CLOSING:
            text += " "  # the next physical line of a bracketed one
        text += token.string.replace("\n", " ")
        end = token.end
    return text


_OPENING = ("(", "[", "{")
_CLOSING = (")", "]", "}")


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def class_named(
    body: Iterable[ast.stmt], qualname: Sequence[str]
) -> ast.ClassDef | None:
    """The class ``qualname`` (``["Outer", "Inner"]``) among ``body``'s
    statements, nested classes followed; None where there is none."""
    for node in body:
        if isinstance(node, ast.ClassDef) and node.name == qualname[0]:
            return node if len(qualname) == 1 else class_named(node.body, qualname[1:])
    return None


def class_defines(node: ast.ClassDef) -> set[str]:
    """The names a class defines: in its body (a method, a nested class, a
    field), and ``self.name`` set anywhere in its methods."""
    found = self_attributes(node, ast.Store)
    for statement in node.body:
        match statement:
            case (
                ast.FunctionDef(name=name)
                | ast.AsyncFunctionDef(name=name)
                | ast.ClassDef(name=name)
                | ast.AnnAssign(target=ast.Name(id=name))
            ):
                found.add(name)
            case ast.Assign(targets=targets):
                found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return found


def self_attributes(node: ast.AST, *contexts: type[ast.expr_context]) -> set[str]:
    """The attributes of ``self`` that ``node``'s code uses in one of
    ``contexts`` (``ast.Store``: those it sets)."""
    return {
        inner.attr
        for inner in ast.walk(node)
        if isinstance(inner, ast.Attribute)
        and isinstance(inner.value, ast.Name)
        and inner.value.id == "self"
        and isinstance(inner.ctx, contexts)
    }

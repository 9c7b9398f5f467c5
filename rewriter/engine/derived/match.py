"""How a derived patch's edits are matched: each statement's keys made once
(:class:`ShapeCache`), each edit's patterns made once (:class:`CompiledEdit`),
and where a pattern occurs in a block. Recognition (:mod:`.derived`) and the
rewrite (:mod:`.rewrite`) match with the same code."""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from deepstack_patch.engine.derived import entries, shapes
from deepstack_patch.engine.derived.data import Anchor, Edit
from deepstack_patch.engine.protocol import PatchState


class ShapeCache:
    """Each node's shape and identity, made once per recognition."""

    def __init__(self) -> None:
        self.memo: shapes.Memo = {}

    def shape(self, node: ast.stmt) -> str:
        return shapes.shape(node, self.memo)

    def identity(self, node: ast.stmt) -> str:
        return shapes.identity(node, self.memo)


@dataclass(frozen=True)
class _Key:
    """One statement of a pattern: its key, and by which key it matches."""

    key: str
    by: str  # "shape" | "identity"
    code: str  # for messages
    #: A shape key's statement's type and the types of its fields' values
    #: (:func:`_head`): what every statement of that shape has.
    head: tuple[type, ...] | None = field(default=None, repr=False, compare=False)
    #: The kinds of statement that may have the key: a shape, a header and
    #: an identity name the statement's type first (``Assign(...``), but a
    #: function's or a class's identity (``def name``, ``class name``).
    kinds: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.by == "identity" and self.key.startswith("def "):
            kinds = frozenset({"FunctionDef", "AsyncFunctionDef"})
        elif self.by == "identity" and self.key.startswith("class "):
            kinds = frozenset({"ClassDef"})
        else:
            kinds = frozenset({self.key.split("(", 1)[0]})
        object.__setattr__(self, "kinds", kinds)

    def matches(self, node: ast.stmt, shapes_of: ShapeCache) -> bool:
        # A statement of another kind is told by its type, before its key
        # is made (a dump of its every node: most statements a pattern is
        # tried on in a block of vLLM's model runner are not its kind).
        if type(node).__name__ not in self.kinds:
            return False
        if self.by == "identity":
            return shapes_of.identity(node) == self.key
        # Nor is one whose fields hold other kinds of value (a call where
        # the key's has a name): a shape writes each value's kind first.
        if self.head is not None and _head(node) != self.head:
            return False
        return shapes_of.shape(node) == self.key


def _head(node: ast.AST) -> tuple[type, ...]:
    """A statement's type and the types of its fields' values: the same for
    two statements of one shape (:func:`.shapes.shape` writes each value's
    type, or its ``repr`` for a value that is no node, before all else)."""
    return (type(node), *(type(getattr(node, name, None)) for name in node._fields))


@dataclass(frozen=True)
class CompiledEdit:
    """An edit with every key it is matched by computed once."""

    edit: Edit
    steps: tuple[tuple[str, str, str], ...]  # (identity, field, code)
    before_anchor: _Key | None
    after_anchor: _Key | None
    removed: tuple[_Key, ...]
    inserted: tuple[_Key, ...]
    header_before: str
    header_after: str
    #: Each step's recorded neighbours (see ``Step``), as keys.
    step_neighbours: tuple[tuple[_Key | None, _Key | None], ...] = ()
    #: A header edit's compound statement, by its identity after the fix
    #: (an ``if`` is named by its header, which the fix changes).
    header_identity_after: str = ""
    #: An entry edit's entries and the statement that holds them.
    entries: entries.Pattern | None = None
    #: Each step's ``try`` by its clauses (:func:`.shapes.try_head`), where
    #: the step enters a ``try``'s own block; ``""`` for any other step.
    step_try_heads: tuple[str, ...] = ()

    @classmethod
    def of(cls, edit: Edit) -> CompiledEdit:
        def key_of(anchor: Anchor | None) -> _Key | None:
            if anchor is None:
                return None
            node = one_statement(anchor.code)
            if anchor.match == "header":
                return _Key(shapes.identity(node), "identity", anchor.code)
            return _Key(shapes.shape(node), "shape", anchor.code, _head(node))

        def keys_of(code: str) -> tuple[_Key, ...]:
            return tuple(
                _Key(shapes.shape(node), "shape", ast.unparse(node), _head(node))
                for node in shapes.parse_statements(code)
            )

        step_nodes = [one_statement(with_block(s.header)) for s in edit.block]
        steps = tuple(
            (shapes.identity(node), s.field, s.header)
            for node, s in zip(step_nodes, edit.block, strict=True)
        )
        pattern = None
        anchors = (edit.before_anchor, edit.after_anchor)
        if edit.kind == "entry":  # its anchors are entries, not statements
            pattern = entries.Pattern.of(
                edit.removed,
                edit.inserted,
                edit.before_anchor.code if edit.before_anchor else "",
                edit.after_anchor.code if edit.after_anchor else "",
            )
            anchors = (None, None)
        headers = [
            shapes.header(one_statement(with_block(code))) if code else ""
            for code in (edit.header_before, edit.header_after)
        ]
        return cls(
            edit,
            steps,
            key_of(anchors[0]),
            key_of(anchors[1]),
            keys_of(edit.removed),
            keys_of(edit.inserted),
            headers[0],
            headers[1],
            tuple((key_of(s.before), key_of(s.after)) for s in edit.block),
            shapes.identity(one_statement(with_block(edit.header_after)))
            if edit.header_after
            else "",
            pattern,
            tuple(
                shapes.try_head(node) if s.field in shapes.BLOCK_FIELDS else ""
                for node, s in zip(step_nodes, edit.block, strict=True)
            ),
        )

    def step_identities(self, index: int) -> tuple[str, ...]:
        """What names the compound statement of step ``index``: a header
        edit's last one by its header before or after the fix."""
        identity = self.steps[index][0]
        last = index == len(self.steps) - 1
        if last and self.edit.kind == "header" and self.header_identity_after:
            return identity, self.header_identity_after
        return (identity,)

    @property
    def anchored(self) -> bool:
        """Whether the anchors take part in matching: for an insertion only.

        The statements a fix removes or replaces place it by themselves
        (found exactly once); an insertion has only its neighbours to say
        where it goes.
        """
        return not self.removed

    @property
    def at_start(self) -> bool:
        return self.anchored and self.before_anchor is None

    @property
    def at_end(self) -> bool:
        return self.anchored and self.after_anchor is None

    @property
    def before_pattern(self) -> list[_Key]:
        return self._around(self.removed)

    @property
    def after_pattern(self) -> list[_Key]:
        return self._around(self.inserted)

    def _around(self, statements: tuple[_Key, ...]) -> list[_Key]:
        if not self.anchored:
            return list(statements)
        return [
            *([self.before_anchor] if self.before_anchor else []),
            *statements,
            *([self.after_anchor] if self.after_anchor else []),
        ]


@functools.lru_cache(maxsize=4096)
def with_block(header_code: str) -> str:
    """A header's code made a whole statement (``...`` as its block); kept
    per header (a data file's headers are read again for every state of a
    series, and its colon is found by a tokenizer)."""
    text = header_code.rstrip()
    if _ends_with_colon(text):
        return text + "\n    ...\n"
    return text + "\n"


def _ends_with_colon(text: str) -> bool:
    """Whether the code's last token is a colon: a comment may follow it
    (``def f(x):  # noqa``), or a comment line below it."""
    last = ""
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type not in _NOT_CODE:
                last = token.string
    except (tokenize.TokenError, SyntaxError):
        return text.endswith(":")
    return last == ":"


_NOT_CODE = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
)


def one_statement(code: str) -> ast.stmt:
    body = ast.parse(code).body
    if len(body) != 1:
        raise ValueError(f"expected one statement, got {len(body)}: {code!r}")
    return body[0]


def occurrences(
    block: Sequence[ast.stmt],
    pattern: Sequence[_Key],
    at_start: bool,
    at_end: bool,
    shapes_of: ShapeCache,
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


def neighbours_match(
    statements: Sequence[ast.stmt],
    start: int,
    size: int,
    neighbours: tuple[_Key | None, _Key | None],
    shapes_of: ShapeCache,
    edges: bool = False,
) -> bool:
    """Whether ``statements[start:start + size]`` sits between the recorded
    neighbours; with ``edges`` an absent neighbour means the block's edge,
    else it is not asked for."""
    before, after = neighbours
    before_at, after_at = start - 1, start + size
    if before is not None:
        if before_at < 0 or not before.matches(statements[before_at], shapes_of):
            return False
    elif edges and before_at >= 0:
        return False
    if after is not None:
        if after_at >= len(statements) or not after.matches(
            statements[after_at], shapes_of
        ):
            return False
    elif edges and after_at < len(statements):
        return False
    return True


def single_out(
    statements: Sequence[ast.stmt],
    starts: list[int],
    size: int,
    neighbours: tuple[_Key | None, _Key | None],
    shapes_of: ShapeCache,
    edges: bool = False,
) -> list[int]:
    """``starts`` (indices into ``statements``) as they are where there is at
    most one; else those between the recorded neighbours, where a neighbour
    was recorded (a statement found more than once is told apart by them)."""
    if len(starts) < 2 or (neighbours == (None, None) and not edges):
        return starts
    return [
        start
        for start in starts
        if neighbours_match(statements, start, size, neighbours, shapes_of, edges)
    ]


def body_state(
    compiled: CompiledEdit, block: Sequence[ast.stmt], shapes_of: ShapeCache
) -> tuple[PatchState | None, bool]:
    """A body edit's state in its block (None: neither needed nor applied),
    and whether neither the code it changes nor the fixed code is there."""
    statements = shapes.without_docstring(block)
    anchors = (compiled.before_anchor, compiled.after_anchor)
    before = occurrences(
        block, compiled.before_pattern, compiled.at_start, compiled.at_end, shapes_of
    )
    # Applied asks for the fix's own statements, not its anchors: the code
    # around them may have changed since the fix went in.
    fixed = (
        occurrences(block, compiled.inserted, False, False, shapes_of)
        if compiled.inserted
        else []
    )
    size_before, size_fixed = len(compiled.before_pattern), len(compiled.inserted)
    # A statement found more than once is told apart by its neighbours.
    if not compiled.anchored:
        before = single_out(statements, before, size_before, anchors, shapes_of, True)
    fixed = single_out(statements, fixed, size_fixed, anchors, shapes_of, True)
    if len(before) == 1 and not _apart(fixed, size_fixed, before, size_before):
        return PatchState.NEEDED, False
    leftover = _apart(before, size_before, fixed, size_fixed)
    if (
        leftover
        and compiled.removed
        and len(fixed) == 1
        and neighbours_match(statements, fixed[0], size_fixed, anchors, shapes_of, True)
    ):
        # The fixed code between the recorded neighbours: the code it
        # replaced, there elsewhere too, is other code where it sits
        # between other neighbours (the base had it more than once).
        leftover = [
            start
            for start in leftover
            if neighbours_match(statements, start, size_before, anchors, shapes_of)
        ]
    # A removal is applied where the removed statements are gone.
    applied = (len(fixed) == 1 and not leftover) if compiled.inserted else not before
    return (PatchState.APPLIED if applied else None), not before and not fixed


def _apart(
    starts: list[int], size: int, others: list[int], other_size: int
) -> list[int]:
    """The runs of ``starts`` that overlap none of ``others``."""
    return [
        s
        for s in starts
        if not any(s < o + other_size and o < s + size for o in others)
    ]


def find_step(
    block: Sequence[ast.stmt],
    compiled: CompiledEdit,
    index: int,
    shapes_of: ShapeCache,
) -> ast.stmt | str:
    """The compound statement of step ``index`` in ``block``, found once
    (by its neighbours where its header is there more than once); else why
    not (``not found``, ``found 2 times``). A ``try`` whose ``except``
    bodies are not the fix's (another fix rewrote one, vllm#45287 on 0.20.2)
    is still found, by its clauses (:func:`.shapes.try_head`), where the
    step enters its body, ``else`` or ``finally``: the fix's own statements
    there are still found by their own shapes."""
    identities = compiled.step_identities(index)
    starts = [i for i, n in enumerate(block) if shapes_of.identity(n) in identities]
    if not starts and compiled.step_try_heads[index]:
        head = compiled.step_try_heads[index]
        starts = [i for i, n in enumerate(block) if shapes.try_head(n) == head]
    if not starts:
        return "not found"
    neighbours = compiled.step_neighbours[index]
    kept = single_out(block, starts, 1, neighbours, shapes_of)
    if len(kept) == 1:
        return block[kept[0]]
    if len(starts) == len(kept):
        return f"found {len(starts)} times"
    return f"found {len(starts)} times, {len(kept)} of them between its neighbours"


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


def name_uses(nodes: Sequence[ast.AST]) -> Counter[str]:
    """How often each name is read, and each word of every string
    (``__all__`` and string annotations name what they export or use)."""
    found: Counter[str] = Counter()
    for root in nodes:
        for node in ast.walk(root):
            match node:
                case ast.Name(id=name):
                    found[name] += 1
                case ast.Global(names=names) | ast.Nonlocal(names=names):
                    found.update(names)
                case ast.Constant(value=str() as text):
                    found.update(text.replace(".", " ").replace("[", " ").split())
    return found


def code_nodes(code: str, header: str) -> list[ast.stmt]:
    """An edit's recorded statements, and its header (a header edit's) as a
    statement of its own."""
    nodes = list(shapes.parse_statements(code))
    if header:
        nodes.append(one_statement(with_block(header)))
    return nodes


def code_uses(code: str, header: str) -> Counter[str]:
    """The name uses of an edit's recorded statements and header."""
    return name_uses(code_nodes(code, header))


def statement_line(
    compiled: CompiledEdit, block: Sequence[ast.stmt], shapes_of: ShapeCache
) -> list[int]:
    """The line of the statements a module-level edit is about, where they
    are found once: the first one it changes (or the one its insertion goes
    before, else the end of the statement it goes after), or the first of
    the fixed code; [] where that is not one place."""
    statements = shapes.without_docstring(block)
    before = occurrences(
        block, compiled.before_pattern, compiled.at_start, compiled.at_end, shapes_of
    )
    if len(before) == 1:
        position = before[0] + (
            1 if compiled.anchored and compiled.before_anchor else 0
        )
        if position < len(statements):
            return [statements[position].lineno]
        return [statements[position - 1].end_lineno or statements[position - 1].lineno]
    fixed = occurrences(block, compiled.inserted, False, False, shapes_of)
    if compiled.inserted and len(fixed) == 1:
        return [statements[fixed[0]].lineno]
    return []

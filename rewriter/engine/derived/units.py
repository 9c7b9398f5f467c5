"""The units one file's change consists of, as a derived patch records them.

The two versions of the file are compared block by block: statements are
aligned by their identity (a definition by its name, a compound statement by
its header, a simple statement by its whole shape; see
:mod:`.shapes`). Aligned statements that differ inside are compared
inside (a header that changed is a header edit); everything else is an edit
of its block between the nearest neighbours, which become its anchors.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from deepstack_patch.engine.derived import comments, entries, regions, shapes
from deepstack_patch.engine.derived.data import Anchor, Edit, Step, Unit
from deepstack_patch.engine.derived.match import one_statement, with_block
from deepstack_patch.engine.source import code_lines

#: The unit of the module's docstring (its name in Python).
MODULE_DOCSTRING = "__doc__"
#: How the unit of comments above a module's or class's statement is named.
COMMENTS_ABOVE = "comments above "


@dataclass
class _Found:
    """An edit, with the definitions on its way in both versions."""

    edit: Edit
    chain: tuple[tuple[ast.stmt, ast.stmt], ...]  # (before, after) definitions
    #: A header edit's whole statement before and after the fix.
    statement: tuple[str, str] = ("", "")
    #: A body edit's statements before and after the fix, without the lines
    #: around them its region has: what its unit shows a reviewer.
    code: tuple[str, str] = ("", "")
    #: A comments edit's unit name outside a function (the statement the
    #: comments are above, :func:`statement_name`).
    above: str = ""


class _Differ:
    def __init__(
        self,
        before: str,
        after: str,
        by_entries: bool = True,
        with_comments: bool = True,
    ) -> None:
        self.before_lines = code_lines(before)
        self.after_lines = code_lines(after)
        self.found: list[_Found] = []
        self.memo: shapes.Memo = {}
        #: Whether a large literal's entries are edits of their own (a data
        #: file derived before they were holds the whole statement).
        self.by_entries = by_entries
        #: Whether comment lines the fix edits between statements it keeps
        #: are edits of their own (:mod:`.comments`; a data file derived
        #: before they were has none).
        self.with_comments = with_comments

    def module(self, before: ast.Module, after: ast.Module) -> None:
        """The whole change: the module's docstring, then its statements."""
        self.docstring(before.body, after.body, (), ())
        self.block(before.body, after.body, (), ())

    def shape(self, node: ast.stmt) -> str:
        return shapes.shape(node, self.memo)

    def aligned_by(self, node: ast.stmt) -> str:
        """What aligns a statement with its other version: its identity; a
        statement holding a large literal or call by its skeleton, so that
        one whose entries alone changed is the same statement (see
        :mod:`.entries`)."""
        if not self.by_entries or shapes.is_compound(node):
            return shapes.identity(node, self.memo)
        container = entries.container_of(node)
        if container is None:
            return shapes.identity(node, self.memo)
        return entries.skeleton(node, container)

    def block(
        self,
        old_block: Sequence[ast.stmt],
        new_block: Sequence[ast.stmt],
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
    ) -> None:
        old = shapes.without_docstring(old_block)
        new = shapes.without_docstring(new_block)
        matcher = difflib.SequenceMatcher(
            a=[self.aligned_by(n) for n in old],
            b=[self.aligned_by(n) for n in new],
            autojunk=False,
        )
        opcodes = matcher.get_opcodes()
        # The statements the fix leaves where they are (changed inside at
        # most): only those can tell a repeated header apart, before the fix
        # and after it.
        stable = {
            i1 + offset
            for tag, i1, i2, j1, _ in opcodes
            if tag == "equal"
            for offset in range(i2 - i1)
            if self.shape(old[i1 + offset]) == self.shape(new[j1 + offset])
            or _inside_only(old[i1 + offset], new[j1 + offset], self.memo)
        }
        for tag, i1, i2, j1, j2 in opcodes:
            pairs = list(zip(old[i1:i2], new[j1:j2], strict=False))
            if (
                tag == "replace"
                and i2 - i1 == j2 - j1
                and all(_header_only(was, now, self.memo) for was, now in pairs)
            ):
                for offset, (was, now) in enumerate(pairs):
                    at = i1 + offset
                    if not self.entries(was, now, steps, chain):
                        self.header_edit(old, at, now, steps, chain, stable)
                continue
            if tag != "equal":
                self.edit(old_block, new_block, (i1, i2), (j1, j2), steps, chain)
                continue
            for offset in range(i2 - i1):
                was, now = old[i1 + offset], new[j1 + offset]
                # The comments above it, where the one before it is kept too
                # (else they are the lines of the edit before it).
                if offset or (i1 == 0 and j1 == 0):
                    self.comments(
                        old_block, new_block, steps, chain, i1 + offset, j1 + offset
                    )
                if self.shape(was) == self.shape(now):
                    # The same code; its docstrings and comments may still
                    # differ (shapes leave them out): edits of their own.
                    if self.documented_otherwise(was, now):
                        around = self.neighbours(old, i1 + offset, stable)
                        self.documentation(was, now, steps, chain, around)
                    continue
                if _inside_only(was, now, self.memo):
                    around = self.neighbours(old, i1 + offset, stable)
                    self.inside(was, now, steps, chain, around)
                elif not self.entries(was, now, steps, chain):
                    at = i1 + offset
                    self.edit(
                        old_block,
                        new_block,
                        (at, at + 1),
                        (j1 + offset, j1 + offset + 1),
                        steps,
                        chain,
                    )

    def inside(
        self,
        was: ast.stmt,
        now: ast.stmt,
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
        neighbours: tuple[Anchor | None, Anchor | None] = (None, None),
    ) -> None:
        """Two aligned compound statements that differ inside."""
        definition, code, chain = self.opened(was, now, chain)
        if definition and shapes.header(was, self.memo) != shapes.header(
            now, self.memo
        ):
            self.found.append(
                _Found(
                    Edit(
                        kind="header",
                        block=(*steps, Step(code, "header", *neighbours)),
                        header_before=code,
                        header_after=shapes.header_source(self.after_lines, now),
                    ),
                    chain,
                )
            )
        for name in shapes.BLOCK_FIELDS:
            old_inner = getattr(was, name, None)
            new_inner = getattr(now, name, None)
            if not isinstance(old_inner, list) or not old_inner:
                continue
            step = Step(code, name, *neighbours)
            if [self.shape(n) for n in old_inner] == [
                self.shape(n) for n in new_inner or []
            ]:  # the same code: its comments and docstrings may differ
                if self.with_comments and new_inner:
                    self.same_code(old_inner, new_inner, (*steps, step), chain)
                continue
            if definition and name == "body":
                self.docstring(old_inner, new_inner or [], (*steps, step), chain)
            self.block(old_inner, new_inner, (*steps, step), chain)

    def opened(
        self,
        was: ast.stmt,
        now: ast.stmt,
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
    ) -> tuple[bool, str, tuple[tuple[ast.stmt, ast.stmt], ...]]:
        """Entering a compound statement: whether it is a definition, the
        header code its steps are known by (a definition's as written), and
        the chain of definitions with it added."""
        if isinstance(was, shapes.DEFINITIONS):
            code = shapes.header_source(self.before_lines, was)
            return True, code, (*chain, (was, now))
        return False, shapes.header_code(was), chain

    def documentation(
        self,
        was: ast.stmt,
        now: ast.stmt,
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
        neighbours: tuple[Anchor | None, Anchor | None] = (None, None),
    ) -> None:
        """Two aligned statements of the same code (docstrings aside): the
        docstring of each definition in them that the fix edits is an edit of
        its own, found on the way :meth:`inside` finds code."""
        if not shapes.is_compound(was):
            return
        definition, code, chain = self.opened(was, now, chain)
        for name in shapes.BLOCK_FIELDS:
            old_inner = getattr(was, name, None)
            new_inner = getattr(now, name, None)
            if not isinstance(old_inner, list) or not isinstance(new_inner, list):
                continue
            if not old_inner or not new_inner:
                continue
            step = Step(code, name, *neighbours)
            if definition and name == "body":
                self.docstring(old_inner, new_inner, (*steps, step), chain)
            self.same_code(old_inner, new_inner, (*steps, step), chain)

    def same_code(
        self,
        old_block: Sequence[ast.stmt],
        new_block: Sequence[ast.stmt],
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
    ) -> None:
        """Two blocks of the same code: the comments above each statement
        that the fix edits, and the documentation inside each statement."""
        old = shapes.without_docstring(old_block)
        new = shapes.without_docstring(new_block)
        if len(old) != len(new):
            return  # not the same code after all: block() said the rest
        every = set(range(len(old)))
        for at, (inner_was, inner_now) in enumerate(zip(old, new, strict=True)):
            self.comments(old_block, new_block, steps, chain, at, at)
            if self.documented_otherwise(inner_was, inner_now):
                around = self.neighbours(old, at, every)
                self.documentation(inner_was, inner_now, steps, chain, around)

    def documented_otherwise(self, was: ast.stmt, now: ast.stmt) -> bool:
        """Whether two statements of the same code differ in a docstring or
        (where comments are edits) a comment line inside them."""
        if _documentation(was) != _documentation(now):
            return True
        return self.with_comments and comments.inside_differ(
            self.before_lines, self.after_lines, was, now
        )

    def comments(
        self,
        old_block: Sequence[ast.stmt],
        new_block: Sequence[ast.stmt],
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
        at: int,
        at_new: int,
    ) -> None:
        """The comment lines above ``old[at]`` and ``new[at_new]`` (indices
        after the docstring; two statements the fix keeps, as the one before
        them), where the fix edits them: a ``comments`` edit (:mod:`.comments`)."""
        if not self.with_comments:
            return
        old = shapes.without_docstring(old_block)
        new = shapes.without_docstring(new_block)
        pairs = [(old[at], new[at_new])]
        if at:
            pairs.append((old[at - 1], new[at_new - 1]))
        # Its neighbours must be found after the fix as before it.
        if not all(self.kept(was, now) for was, now in pairs):
            return
        offsets = (len(old_block) - len(old), len(new_block) - len(new))
        texts = comments.differ(
            self.before_lines,
            self.after_lines,
            old_block,
            new_block,
            (at + offsets[0], at_new + offsets[1]),
        )
        if texts is None:
            return
        edit = Edit(
            "comments",
            steps,
            self.anchor(old[at - 1]) if at else None,
            self.anchor(old[at]),
            texts[0],
            texts[1],
        )
        self.found.append(
            _Found(edit, chain, code=texts, above=statement_name([old[at]]))
        )

    def kept(self, was: ast.stmt, now: ast.stmt) -> bool:
        """Whether ``was`` is found as its anchor records it after the fix
        too: the same statement, or a compound one by its header."""
        if shapes.is_compound(was):
            return shapes.identity(was, self.memo) == shapes.identity(now, self.memo)
        return self.shape(was) == self.shape(now)

    def entries(
        self,
        was: ast.stmt,
        now: ast.stmt,
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
    ) -> bool:
        """A statement whose large literal or call changed in its entries
        alone: an ``entry`` edit for each run of entries the fix changes
        (:mod:`.entries`); False where the entries do not each hold whole
        lines with a comma after them (the statement is then one edit)."""
        old_container = entries.container_of(was)
        new_container = entries.container_of(now)
        if old_container is None or new_container is None:
            return False
        if type(old_container) is not type(new_container) or entries.skeleton(
            was, old_container, whole=True
        ) != entries.skeleton(now, new_container, whole=True):
            return False  # more than the entries changed (a block, too)
        old = entries.entries_of(old_container)
        new = entries.entries_of(new_container)
        matcher = difflib.SequenceMatcher(
            a=[e.identity for e in old], b=[e.identity for e in new], autojunk=False
        )
        runs: list[tuple[int, int, int, int]] = []
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            changed = (
                [(i1, i2, j1, j2)]
                if tag != "equal"
                else [
                    (i1 + k, i1 + k + 1, j1 + k, j1 + k + 1)
                    for k in range(i2 - i1)
                    if old[i1 + k].shape != new[j1 + k].shape
                ]
            )
            for run in changed:
                if runs and runs[-1][1] == run[0] and runs[-1][3] == run[2]:
                    runs[-1] = (runs[-1][0], run[1], runs[-1][2], run[3])
                else:
                    runs.append(run)
        prefix, suffix = entries.wrapper(was, old_container)
        made = []
        for i1, i2, j1, j2 in runs:
            texts = []
            for lines, container, found, start, end in (
                (self.before_lines, old_container, old, i1, i2),
                (self.after_lines, new_container, new, j1, j2),
            ):
                region = entries.region(lines, container, found, start, end)
                around = found[max(start - 1, 0) : end + 1]
                if isinstance(region, str) or not all(
                    entries.has_comma(lines, e) for e in around
                ):
                    return False
                raw = {i - region.first for i in region.raw}
                texts.append(entries.wrapped(prefix, region.text(lines), suffix, raw))
            anchors = [
                self.entry_anchor(old[at], old_container)
                if 0 <= at < len(old)
                else None
                for at in (i1 - 1, i2)
            ]
            edit = Edit("entry", steps, anchors[0], anchors[1], texts[0], texts[1])
            try:  # read back as the engine reads it, or the statement whole
                entries.Pattern.of(*texts, *(a.code if a else "" for a in anchors))
            except (SyntaxError, ValueError):
                return False
            made.append(_Found(edit, chain, code=(texts[0], texts[1])))
        self.found += made
        return True

    def entry_anchor(self, entry: entries.Entry, container: ast.AST) -> Anchor:
        """A neighbour entry, by its key (``"K": ...``, ``name=...``), an
        element or a spread by its code."""
        code = entries.anchor_code(entry, container, self.before_lines)
        keyed = entry.identity.startswith(("key ", "keyword "))
        return Anchor(code, "header" if keyed else "statement")

    def docstring(
        self,
        old_block: Sequence[ast.stmt],
        new_block: Sequence[ast.stmt],
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
    ) -> None:
        """A docstring the fix edits in a definition of a function or
        method it changes: an edit of its own, carried as text (it never
        counts for recognition)."""
        old, new = _docstring(old_block), _docstring(new_block)
        texts = (
            shapes.statements_code(self.before_lines, old),
            shapes.statements_code(self.after_lines, new),
        )
        if texts[0] != texts[1]:
            edit = Edit("docstring", steps, removed=texts[0], inserted=texts[1])
            self.found.append(_Found(edit, chain))

    def header_edit(
        self,
        old: Sequence[ast.stmt],
        at: int,
        now: ast.stmt,
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
        stable: set[int],
    ) -> None:
        """A compound statement whose header alone changed (see
        ``shapes.HEADED``): the header is carried, not its blocks."""
        code = shapes.header_source(self.before_lines, old[at])
        step = Step(code, "header", *self.neighbours(old, at, stable, also=now))
        edit = Edit(
            kind="header",
            block=(*steps, step),
            header_before=code,
            header_after=shapes.header_source(self.after_lines, now),
        )
        whole = (
            shapes.statements_code(self.before_lines, [old[at]]),
            shapes.statements_code(self.after_lines, [now]),
        )
        self.found.append(_Found(edit, chain, whole))

    def neighbours(
        self,
        block: Sequence[ast.stmt],
        at: int,
        stable: set[int],
        also: ast.stmt | None = None,
    ) -> tuple[Anchor | None, Anchor | None]:
        """The statements around ``block[at]``, where its identity (or that
        of ``also``, what a header edit makes of it) is there more than once
        (they tell the occurrences apart); else none. Only a neighbour the
        fix keeps (in ``stable``) is recorded: the one it changes is not
        there after it, nor once an edit before this one is made."""
        names = {shapes.identity(n, self.memo) for n in (block[at], also) if n}
        if sum(shapes.identity(n, self.memo) in names for n in block) < 2:
            return None, None
        return (
            self.anchor(block[at - 1]) if at - 1 in stable else None,
            self.anchor(block[at + 1]) if at + 1 in stable else None,
        )

    def edit(
        self,
        old_block: Sequence[ast.stmt],
        new_block: Sequence[ast.stmt],
        removed: tuple[int, int],
        inserted: tuple[int, int],
        steps: tuple[Step, ...],
        chain: tuple[tuple[ast.stmt, ast.stmt], ...],
    ) -> None:
        """An edit of the block: ``removed`` and ``inserted`` index its
        statements after the docstring."""
        old = shapes.without_docstring(old_block)
        new = shapes.without_docstring(new_block)
        (i1, i2), (j1, j2) = removed, inserted
        removed_nodes, inserted_nodes = old[i1:i2], new[j1:j2]
        kind = "body"
        statements = [*removed_nodes, *inserted_nodes]
        if not steps and all(
            isinstance(n, ast.Import | ast.ImportFrom) for n in statements
        ):
            kind = "imports"
        # The lines the fix changes there, as the files write them: the
        # rewrite writes them (engine/derived/regions.py).
        old_at, new_at = len(old_block) - len(old), len(new_block) - len(new)
        code = (
            shapes.statements_code(self.before_lines, removed_nodes),
            shapes.statements_code(
                self.after_lines, inserted_nodes, comments_above=True
            ),
        )
        self.found.append(
            _Found(
                Edit(
                    kind=kind,
                    block=steps,
                    before_anchor=self.anchor(old[i1 - 1]) if i1 > 0 else None,
                    after_anchor=self.anchor(old[i2]) if i2 < len(old) else None,
                    removed=_region_code(
                        self.before_lines,
                        old_block,
                        (i1 + old_at, i2 + old_at),
                        kind,
                        code[0],
                        i1 == i2,
                    ),
                    inserted=_region_code(
                        self.after_lines,
                        new_block,
                        (j1 + new_at, j2 + new_at),
                        kind,
                        code[1],
                        i1 == i2,
                    ),
                ),
                chain,
                code=code,
            )
        )

    def anchor(self, node: ast.stmt) -> Anchor:
        if shapes.is_compound(node):
            return Anchor(shapes.header_code(node), "header")
        code = shapes.statements_code(self.before_lines, [node])
        return Anchor(code.rstrip("\n"), "statement")


def _docstring(block: Sequence[ast.stmt]) -> list[ast.stmt]:
    return list(block[:1]) if block and shapes.is_docstring(block[0]) else []


def _documentation(node: ast.AST) -> list[str | None]:
    """The docstrings of the definitions in ``node``, exactly as written
    (what two statements of the same code may still differ in). A
    definition is a statement: only statements are walked, in
    ``ast.walk``'s order."""
    return [
        ast.get_docstring(inner, clean=False)
        for inner in shapes.statements_in([node])
        if isinstance(inner, shapes.DEFINITIONS)
    ]


def _region_code(
    lines: Sequence[str],
    block: Sequence[ast.stmt],
    at: tuple[int, int],
    kind: str,
    statements_only: str,
    insertion: bool = False,
) -> str:
    """The lines of ``block[at[0]:at[1]]``'s region (its statements, and the
    blank and comment lines between its neighbours; for the imports, see
    :func:`.regions.statements`), dedented; ``statements_only`` where the
    region cannot be cut out on whole lines or is not their code."""
    start, end = at
    if kind == "imports":
        region = regions.statements(lines, block, start, end, insertion)
    else:
        region = regions.between(lines, block, start, end)
    if isinstance(region, str):
        return statements_only
    text = regions.recorded(lines, region)
    return text if shapes.same_statements(text, block[start:end]) else statements_only


def _header_only(was: ast.stmt, now: ast.stmt, memo: shapes.Memo) -> bool:
    """Whether two statements are one ``if``/``while``/``for``/``with`` whose
    header alone changed: the same kind, every block the same."""
    if type(was) is not type(now) or not isinstance(was, shapes.HEADED):
        return False
    return all(
        shapes.shape(getattr(was, name, []), memo)  # type: ignore[arg-type]
        == shapes.shape(getattr(now, name, []), memo)  # type: ignore[arg-type]
        for name in shapes.BLOCK_FIELDS
    ) and shapes.header(was, memo) != shapes.header(now, memo)


def _inside_only(was: ast.stmt, now: ast.stmt, memo: shapes.Memo) -> bool:
    """Whether two aligned statements can be compared block by block: the
    same kind of compound statement, each changed block there on both sides."""
    if type(was) is not type(now) or not shapes.is_compound(was):
        return False
    if not isinstance(was, shapes.DEFINITIONS) and shapes.header(
        was, memo
    ) != shapes.header(now, memo):
        return False
    for name in shapes.BLOCK_FIELDS:
        old_inner = getattr(was, name, None)
        new_inner = getattr(now, name, None)
        if isinstance(old_inner, list) and bool(old_inner) != bool(new_inner):
            return False
    return True


def units_of_change(
    path: str, before: str, after: str, by_entries: bool = True
) -> list[Unit]:
    """The units of one file's change (empty if nothing but formatting
    changed); ``by_entries=False``: a large literal's statement whole (see
    :mod:`.entries`)."""
    differ = _Differ(before, after, by_entries)
    differ.module(ast.parse(before), ast.parse(after))
    units: dict[tuple[str, str], list[Edit]] = {}
    texts: dict[tuple[str, str], tuple[str, str]] = {}
    for found in differ.found:
        kind, name, unit_texts = _unit_of(found, differ)
        key = (kind, name)
        if key in units and kind not in ("function", "method", "import", "class"):
            number = 2
            while (kind, f"{name} ({number})") in units:
                number += 1
            key = (kind, f"{name} ({number})")
        units.setdefault(key, []).append(found.edit)
        texts.setdefault(key, ("", ""))
        old_before, old_after = texts[key]
        if kind in ("function", "method") and found.chain and _first_def(found.chain):
            texts[key] = unit_texts
        else:
            texts[key] = (old_before + unit_texts[0], old_after + unit_texts[1])
    return [
        Unit(
            path,
            kind,
            name,
            texts[(kind, name)][0],
            texts[(kind, name)][1],
            tuple(edits),
        )
        for (kind, name), edits in units.items()
    ]


def _first_def(
    chain: tuple[tuple[ast.stmt, ast.stmt], ...],
) -> tuple[int, tuple[ast.stmt, ast.stmt]] | None:
    for index, pair in enumerate(chain):
        if isinstance(pair[0], ast.FunctionDef | ast.AsyncFunctionDef):
            return index, pair
    return None


def _unit_of(found: _Found, differ: _Differ) -> tuple[str, str, tuple[str, str]]:
    """The unit an edit belongs to: (kind, qualified name, (before, after))."""
    chain = found.chain
    first = _first_def(chain)
    if first is not None:
        index, (was, now) = first
        names = [pair[0].name for pair in chain[: index + 1]]  # type: ignore[attr-defined]
        kind = (
            "method"
            if index > 0 and isinstance(chain[index - 1][0], ast.ClassDef)
            else "function"
        )
        return (
            kind,
            ".".join(names),
            (
                shapes.statements_code(differ.before_lines, [was]),
                shapes.statements_code(differ.after_lines, [now]),
            ),
        )
    edit = found.edit
    prefix = ".".join(pair[0].name for pair in chain)  # type: ignore[attr-defined]
    texts = found.code if found.code != ("", "") else (edit.removed, edit.inserted)
    if edit.kind == "docstring":  # of a class (no function on the way) or module
        if prefix:
            return "class", prefix, texts
        return "module-statement", MODULE_DOCSTRING, texts
    if edit.kind == "comments":  # of a class or the module, above a statement
        name = f"{COMMENTS_ABOVE}{found.above}"
        if prefix:
            return "class-attribute", f"{prefix}.{name}", texts
        return "module-statement", name, texts
    if edit.kind == "imports":
        return "import", "imports", texts
    if edit.kind == "entry":
        name = entries.unit_name(edit.removed, edit.inserted)
        return "entry", f"{prefix}.{name}" if prefix else name, texts
    statements = [
        *shapes.parse_statements(edit.removed),
        *shapes.parse_statements(edit.inserted),
    ]
    if edit.kind == "header":
        header = one_statement(with_block(edit.header_before))
        if isinstance(header, ast.ClassDef):  # a class's bases or decorators
            return "class", prefix, (edit.header_before, edit.header_after)
        statements, texts = [header], found.statement
    in_class = bool(chain) and isinstance(chain[-1][0], ast.ClassDef)
    if statements and all(isinstance(n, shapes.DEFINITIONS) for n in statements):
        name = statements[0].name  # type: ignore[attr-defined]
        if isinstance(statements[0], ast.ClassDef):
            kind = "class"
        else:
            kind = "method" if in_class else "function"
        return kind, f"{prefix}.{name}" if prefix else name, texts
    name = statement_name(statements)
    if in_class:
        return "class-attribute", f"{prefix}.{name}", texts
    return "module-statement", f"{prefix}.{name}" if prefix else name, texts


def statement_name(statements: Sequence[ast.stmt]) -> str:
    """The name a unit of module or class statements goes by: the first
    name they bind (``x = …``, ``x: int``, a definition), else their kind
    (``expr``); ``engine/footprint.py`` finds a unit again by it."""
    for node in statements:
        match node:
            case ast.Assign(targets=[ast.Name(id=name), *_]):
                return name
            case (
                ast.AnnAssign(target=ast.Name(id=name))
                | ast.AugAssign(target=ast.Name(id=name))
            ):
                return name
            case (
                ast.FunctionDef(name=name)
                | ast.AsyncFunctionDef(name=name)
                | ast.ClassDef(name=name)
            ):
                return name
    return type(statements[0]).__name__.lower() if statements else "statement"


def edits_of_change(
    before: str, after: str, by_entries: bool = True, with_comments: bool = True
) -> list[Edit]:
    """The edits between two versions of a piece of code, as
    :func:`units_of_change` finds them (in order), without grouping them
    into units: what the loader compares a unit's recorded edits with
    (``by_entries=False``: as derive found them before a literal's entries
    were edits of their own, :mod:`.entries`; ``with_comments=False``:
    before comment lines were, :mod:`.comments`)."""
    differ = _Differ(before, after, by_entries, with_comments)
    differ.module(ast.parse(before), ast.parse(after))
    return [found.edit for found in differ.found]

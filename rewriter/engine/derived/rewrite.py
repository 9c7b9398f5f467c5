"""The rewrite of a derived patch, as text (docs/derive.md, "every
untouched byte kept").

Each edit changes only the lines the fix changes: its region's lines
(:mod:`.regions`), found in the target by the statements recognition found
(:func:`~.match.find_step` for each block on the way,
:func:`~.match.occurrences` and :func:`~.match.single_out` for the edit's
statements, the one locator they share), get the change from the recorded
lines before the fix to the ones after it; every other line stays the
target's, comments, quotes and blank lines included. Where the target's
lines are not the recorded ones (a vendor's comment, another layout), only
its statements' own lines are replaced, by upstream's statements. The
engine may hand over a skeleton of the file, whose line numbers and
top-level indices differ from the ones recognition saw, but whose names and
statements do not.

Imports are edited by name (``details``, from recognition): where the
change of names is upstream's whole change, upstream's lines are written as
above; else the target's import statements are edited in LibCST.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.derived import (
    comments,
    docstrings,
    entries,
    regions,
    rename,
    shapes,
    signature,
)
from deepstack_patch.engine.derived.match import (
    ShapeCache,
    bound_name,
    find_step,
    import_aliases,
    occurrences,
    single_out,
    with_block,
)
from deepstack_patch.engine.errors import RewriteRefused
from deepstack_patch.engine.source import code_lines

if TYPE_CHECKING:
    # LibCST is imported where a module is rewritten: the edits on text
    # (status's check of a fix's code, most rewrites) never load it.
    import libcst as cst
    from deepstack_patch.engine.derived.data import Unit
    from deepstack_patch.engine.derived.match import CompiledEdit

Statements = list["cst.BaseStatement"]

#: A unit's edits to make: the unit, each edit with recognition's details
#: of it, and the renaming of its function's locals.
UnitToMake = tuple[
    "Unit", Sequence[tuple["CompiledEdit", Mapping[str, Any]]], Mapping[str, str]
]


def apply_edits(module: cst.Module, units: Sequence[UnitToMake]) -> cst.Module:
    """``module`` with each unit's edits made, in order (see
    :class:`~.derived.Edit`); with a renaming (the fix's local -> the
    target's, see :mod:`.rename`) the function's statements are matched
    under it and the fix's lines written under it.

    A function or method whose definition is, line for line, the one the
    fix was made on (its ``before``) becomes the fixed one (its ``after``)
    whole: what upstream changed there besides its statements (a comment, a
    docstring, a blank line) comes with it, as ``git apply`` brings it."""
    import libcst as cst

    code = edited_code(module.code, module.default_newline, units)
    if code == module.code:
        return module
    return cst.parse_module(code.encode(module.encoding))


def edited_code(code: str, newline: str, units: Sequence[UnitToMake]) -> str:
    """``code`` with each unit's edits made (:func:`apply_edits` on text:
    the edits are made on text, so a caller holding text needs no module)."""
    text = _Text(code, newline)
    for unit, edits, renaming in units:
        if not renaming and text.whole_definition(unit, [c for c, _ in edits]):
            continue
        for compiled, details in edits:
            text.apply(compiled, details, renaming, unit.after)
    return text.code


def edited_docstrings(code: str, newline: str, compiled: Sequence[CompiledEdit]) -> str:
    """``code`` with each docstring edit made on text, as
    :func:`.docstrings.rewrite` makes it on a module; :class:`NeedsModule`
    where the text cannot take one so."""
    text = _Text(code, newline)
    for edit in compiled:
        text.apply(edit, {}, {})
    return text.code


def apply_edit(
    module: cst.Module,
    compiled: CompiledEdit,
    details: Mapping[str, Any],
    renaming: Mapping[str, str] | None = None,
) -> cst.Module:
    """``module`` with one edit made (see :func:`apply_edits`)."""
    import libcst as cst

    text = _Text(module.code, module.default_newline)
    text.apply(compiled, details, renaming or {})
    if text.code == module.code:
        return module
    return cst.parse_module(text.code.encode(module.encoding))


class NeedsModule(Exception):
    """An edit the text cannot take as a LibCST module would: the caller
    rewrites the module instead (:meth:`.DerivedPatch.rewrite_text`)."""


class _Text:
    """The file's text, edited one edit after the other."""

    def __init__(self, code: str, newline: str) -> None:
        self.code = code
        self.newline = newline
        self._parsed: tuple[str, ast.Module] | None = None

    def tree(self) -> ast.Module:
        """The text's module, parsed once for each text it holds: a unit is
        tried whole, then edit by edit on the same text (no reader changes
        the tree)."""
        if self._parsed is None or self._parsed[0] is not self.code:
            self._parsed = self.code, ast.parse(self.code)
        return self._parsed[1]

    def apply(
        self,
        compiled: CompiledEdit,
        details: Mapping[str, Any],
        renaming: Mapping[str, str],
        fixed: str = "",
    ) -> None:
        """Make one edit; ``fixed``: the unit's code as upstream fixed it
        (how upstream wrote what the edit inserts: an ``elif``)."""
        if compiled.edit.kind == "imports":
            if not self.imports_as_text(compiled, details):
                import libcst as cst

                module = cst.parse_module(self.code)
                self.code = _Imports(module).edited(compiled, details).code
            return
        lines = code_lines(self.code)
        tree = self.tree()
        walk = _Walk(compiled, renaming)
        if compiled.edit.kind == "header":
            self.header(lines, walk.statement(tree.body), walk)
        elif compiled.edit.kind == "entry":
            self.entries(lines, walk.block(tree.body), walk)
        elif compiled.edit.kind == "comments":
            self.comments(lines, walk.block(tree.body), walk)
        elif compiled.edit.kind == "docstring":
            self.docstring(lines, walk.block(tree.body), walk)
        else:
            self.statements(lines, walk.block(tree.body), walk, fixed)

    def whole_definition(self, unit: Unit, edits: Sequence[CompiledEdit]) -> bool:
        """The unit's definition made its ``after`` whole, where it is its
        ``before`` line for line (see :func:`apply_edits`); False where it
        is not, or the unit is not a definition its edits lie in."""
        name = unit.name.rsplit(".", 1)[-1]
        if unit.kind not in ("function", "method") or not edits:
            return False
        way = [identity for identity, _, _ in edits[0].steps]
        if f"def {name}" not in way:
            return False
        at = way.index(f"def {name}")
        if any([i for i, _, _ in c.steps[: at + 1]] != way[: at + 1] for c in edits):
            return False
        # Recognition claims the innermost definition on an edit's way (its
        # span): no other may lie between this one and an edit.
        if any(
            i.startswith(("def ", "class "))
            for c in edits
            for i, _, _ in c.steps[at + 1 :]
        ):
            return False
        lines = code_lines(self.code)
        walk = _Walk(edits[0], {})
        try:
            node = walk.step(walk.block(self.tree().body, at), at)
        except RewriteRefused:
            return False
        first = regions.first_line(node) - 1
        region = regions.Region(
            first,
            node.end_lineno or node.lineno,
            regions.indentation(lines[first]),
            raw=frozenset(regions.string_lines([node])),
        )
        if region.text(lines) != unit.before.splitlines():
            return False
        self.replace(
            lines, region, regions.rewritten(lines, region, unit.after, self.newline)
        )
        return True

    def replace(
        self,
        lines: list[str],
        region: regions.Region,
        new_lines: list[str],
    ) -> None:
        self.code = "".join([*lines[: region.first], *new_lines, *lines[region.stop :]])

    def header(self, lines: list[str], node: ast.stmt, walk: _Walk) -> None:
        compiled = walk.compiled
        if shapes.header(node) != compiled.header_before:
            self.header_in_parts(lines, node, walk)
            return
        fixed = shapes.parse_statements(with_block(compiled.edit.header_after))
        if [type(n) for n in fixed] != [type(node)]:
            raise RewriteRefused("the fixed header is another kind of statement")
        region = regions.header(lines, node)
        if isinstance(region, str):
            raise RewriteRefused(region)
        before = walk.renamed_header(compiled.edit.header_before)
        after = walk.renamed_header(compiled.edit.header_after)
        out = regions.replaced(lines, region, before, after, self.newline)
        if out is None and region.holds_block:  # it would write upstream's block
            raise RewriteRefused(
                "the header shares its last line with its block, and its lines "
                "are not the ones the fix changes"
            )
        if out is None:  # not the recorded lines: the fixed header whole
            out = regions.rewritten(lines, region, after, self.newline)
        self.replace(lines, region, out)

    def header_in_parts(self, lines: list[str], node: ast.stmt, walk: _Walk) -> None:
        """A def's header that differs from the fix's in parts the fix does
        not change (:mod:`.signature`): the fix's line diff made in its
        lines, and the header written checked to be the target's with
        exactly the fix's change; never the fix's header whole."""
        edit = walk.compiled.edit
        before = signature.recorded(edit.header_before)
        after = signature.recorded(edit.header_after)
        now = signature.of(node)
        if before is None or after is None or now is None:
            raise RewriteRefused("the header is not the one the fix expects")
        expected = signature.fixed(before, after, now)
        region = regions.header(lines, node)
        if expected is None or isinstance(region, str):
            raise RewriteRefused("the header is not the one the fix expects")
        out = regions.replaced(
            lines, region, edit.header_before, edit.header_after, self.newline
        )
        if out is None:
            raise RewriteRefused(
                "the fix's change to the header cannot be placed on its lines"
            )
        original = self.code
        self.replace(lines, region, out)
        try:
            written = signature.of(walk.statement(self.tree().body))
        except (SyntaxError, RewriteRefused):
            written = None
        if written != expected:
            self.code = original
            raise RewriteRefused(
                "the fix's change to the header, made in its lines, is not "
                "the fix's change alone"
            )

    def statements(
        self, lines: list[str], block: list[ast.stmt], walk: _Walk, fixed: str = ""
    ) -> None:
        compiled = walk.compiled
        shapes_of = walk.shapes
        offset = len(block) - len(shapes.without_docstring(block))
        found = occurrences(
            block,
            compiled.before_pattern,
            compiled.at_start,
            compiled.at_end,
            shapes_of,
        )
        if not compiled.anchored:  # told apart by its neighbours, as recognised
            anchors = (compiled.before_anchor, compiled.after_anchor)
            size = len(compiled.removed)
            found = single_out(
                block[offset:], found, size, anchors, shapes_of, edges=True
            )
        if len(found) != 1:
            raise RewriteRefused(
                f"the code the fix changes is found {len(found)} times, not once"
            )
        skip = 1 if compiled.anchored and compiled.before_anchor else 0
        start = found[0] + offset + skip
        end = start + len(compiled.removed)
        if not compiled.inserted and end - start == len(block):
            raise RewriteRefused("the fix would leave the block empty")
        region = regions.between(lines, block, start, end)
        if isinstance(region, str):
            raise RewriteRefused(region)
        before = walk.renamed(compiled.edit.removed)
        after = walk.renamed(compiled.edit.inserted)
        own = [
            (regions.first_line(node) - 1, node.end_lineno or node.lineno)
            for node in block[start:end]
        ]
        out = regions.replaced(lines, region, before, after, self.newline, own)
        if out is None:  # the gaps are not the recorded ones either
            removed = (own[0][0], own[-1][1]) if own else (region.first, region.first)
            out = regions.replaced_statements(
                lines, region, removed, after, self.newline
            )
        whole = start == 0 and end == len(block) and compiled.edit.block
        if whole and compiled.edit.block[-1].field == "orelse":
            region, out = _as_elif(lines, region, out, after, fixed)
        self.replace(lines, region, out)

    def docstring(self, lines: list[str], block: list[ast.stmt], walk: _Walk) -> None:
        """A docstring edit, as :func:`.docstrings.rewrite` makes it on a
        LibCST module: upstream's docstring in place of the one the fix
        edits, its lines alone (the lines above it are kept). Where the
        module would write it otherwise (a docstring that shares a line with
        other code, one added or removed under comment or blank lines),
        :class:`NeedsModule`."""
        todo, other = docstrings.action(walk.compiled, block)
        if other:
            raise RewriteRefused("the docstring is not the one the fix edits")
        if not todo:
            return
        new = (
            []
            if todo == docstrings.REMOVE
            else regions.split(walk.compiled.edit.inserted)
        )
        if not new and len(block) == 1:
            raise RewriteRefused("the fix would leave the block empty")
        anchor = block[0]
        first = regions.first_line(anchor) - 1
        indent = regions.indentation(lines[first])
        if anchor.col_offset != len(indent) or (
            len(block) > 1 and block[1].lineno == anchor.end_lineno
        ):
            raise NeedsModule("a docstring that shares a line with other code")
        # The module keeps the lines above a docstring it replaces, not above
        # one it adds or removes (a module's header comments, the lines that
        # lead the statement): those are written on text only under a header.
        above = lines[first - 1].strip() if first else ""
        if todo != docstrings.REPLACE and (not above or above.startswith("#")):
            raise NeedsModule("a docstring added or removed under other lines")
        stop = first if todo == docstrings.ADD else (anchor.end_lineno or anchor.lineno)
        region = regions.Region(first, stop, indent, -1, frozenset())
        self.replace(lines, region, regions.written_lines(new, region, self.newline))

    def comments(self, lines: list[str], block: list[ast.stmt], walk: _Walk) -> None:
        """A comments edit: upstream's comment lines in place of the old
        ones, which recognition found there exactly (:mod:`.comments`)."""
        made = comments.rewritten(
            lines, block, walk.compiled, walk.shapes, self.newline
        )
        if isinstance(made, str):
            raise RewriteRefused(made)
        region, out = made
        self.replace(lines, region, out)

    def entries(self, lines: list[str], block: list[ast.stmt], walk: _Walk) -> None:
        """An entry edit: the lines of the entries it changes, found by their
        keys in the statement its skeleton names (:mod:`.entries`)."""
        pattern = walk.compiled.entries
        assert pattern is not None
        if walk.inside_function and walk.renaming:
            raise RewriteRefused("the entries of a function whose locals are renamed")
        found = entries.locate(pattern, block)
        if isinstance(found, str):
            raise RewriteRefused(found)
        start, end = found.start, found.end
        region = entries.region(lines, found.container, found.entries, start, end)
        if isinstance(region, str):
            raise RewriteRefused(region)
        if start == end and start > 0:
            previous = found.entries[start - 1]
            if not entries.has_comma(lines, previous):  # the entries go after it
                lines[previous.last - 1] = entries.with_comma(lines, previous)
        out = regions.replaced(
            lines,
            region,
            pattern.old.text,
            pattern.new.text,
            self.newline,
            raw=pattern.new.raw,
        )
        if out is None:  # the lines around them are not the recorded ones
            out = entries.replaced_entries(lines, region, found, pattern, self.newline)
        self.replace(lines, region, out)

    def imports_as_text(
        self, compiled: CompiledEdit, details: Mapping[str, Any]
    ) -> bool:
        """Upstream's lines, where the names recognition adds and drops are
        upstream's whole change and its statements are found among the
        module's leading imports (those the engine always keeps)."""
        edit = compiled.edit
        removed = import_aliases(shapes.parse_statements(edit.removed))
        inserted = import_aliases(shapes.parse_statements(edit.inserted))
        add = {tuple(a) for a in details.get("add", ())}
        drop = {tuple(a) for a in details.get("drop", ())}
        if add != set(inserted) - set(removed) or drop != set(removed) - set(inserted):
            return False
        lines = code_lines(self.code)
        body = self.tree().body
        leading = _leading(body)
        shapes_of = ShapeCache()
        if compiled.removed:
            found = occurrences(leading, compiled.removed, False, False, shapes_of)
            start = found[0] if len(found) == 1 else -1
            end = start + len(compiled.removed)
        else:
            anchor = compiled.before_anchor
            found = [
                i
                for i, node in enumerate(leading)
                if anchor is not None and anchor.matches(node, shapes_of)
            ]
            start = end = found[0] + 1 if len(found) == 1 else -1
        if start < 0:
            return False
        elsewhere = [n for n in body if n not in leading[start:end]]
        if drop & set(import_aliases(elsewhere)):
            return False  # the name-level edit drops them there too
        region = regions.statements(lines, leading, start, end, not compiled.removed)
        if isinstance(region, str):
            return False
        out = regions.replaced(lines, region, edit.removed, edit.inserted, self.newline)
        if out is None:
            return False
        self.replace(lines, region, out)
        return True


class _Walk:
    """The way to an edit's block, found as recognition found it."""

    def __init__(self, compiled: CompiledEdit, renaming: Mapping[str, str]) -> None:
        self.compiled = compiled
        self.renaming = dict(renaming)
        self.shapes = ShapeCache()
        #: Inside the function: its statements are read under the renaming.
        self.inside_function = False

    def block(self, body: list[ast.stmt], stop: int = -1) -> list[ast.stmt]:
        """The block the edit's steps lead to (the first ``stop`` ones)."""
        block = body
        for index in range(len(self.compiled.steps) if stop < 0 else stop):
            node = self.step(block, index)
            field_name = self.compiled.steps[index][1]
            inner = getattr(node, field_name, None)
            if not isinstance(inner, list) or not inner:
                raise RewriteRefused(f"no {field_name} block to change")
            block = inner
        return block

    def statement(self, body: list[ast.stmt]) -> ast.stmt:
        """A header edit's compound statement (its last step; a definition's
        own header is outside the function whose locals are renamed)."""
        last = len(self.compiled.steps) - 1
        return self.step(self.block(body, last), last, enter=False)

    def step(self, block: list[ast.stmt], index: int, enter: bool = True) -> ast.stmt:
        """The compound statement of step ``index``: :func:`~.match.find_step`
        is the one locator recognition and the rewrite use (by its
        neighbours where its header is there more than once)."""
        found = find_step(block, self.compiled, index, self.shapes)
        identity, _, code = self.compiled.steps[index]
        if isinstance(found, str):
            raise RewriteRefused(f"`{code.strip().splitlines()[0]}` {found}")
        entering = enter and identity.startswith("def ")
        if entering and self.renaming and not self.inside_function:
            # The function's statements as the fix names them, where they are.
            self.inside_function = True
            found = copy.deepcopy(found)
            back = {new: old for old, new in self.renaming.items()}
            for statement in found.body:  # type: ignore[attr-defined]
                rename.Rename(back).visit(statement)
        return found

    def renamed(self, code: str) -> str:
        """Recorded code under the renaming (inside the function)."""
        if not self.inside_function:
            return code
        return rename.renamed_code(code, self.renaming)

    def renamed_header(self, code: str) -> str:
        """A recorded header under the renaming: an ``if``'s reads the
        function's locals (a definition's own header is outside it)."""
        if not self.inside_function or not self.renaming:
            return code
        whole = with_block(code)  # a header alone does not parse
        placeholder = whole[len(code.rstrip()) :]
        renamed = rename.renamed_code(whole, self.renaming)
        return renamed[: len(renamed) - len(placeholder)] + "\n"


def _as_elif(
    lines: list[str],
    region: regions.Region,
    out: list[str],
    after: str,
    fixed: str,
) -> tuple[regions.Region, list[str]]:
    """An ``else:`` block the fix turns into one ``if`` written, as upstream
    wrote it, as an ``elif`` (vllm#45287 turns ``else:`` into ``elif
    state.block_type == "tool_use":`` and ``else:``): the ``else:`` line and
    the block's lines, dedented one level, the first ``if`` an ``elif``.
    Where upstream wrote ``else:`` and ``if`` (its fixed code has no such
    ``elif``), where the lines do not dedent cleanly, or where the code it
    gives is not the same, the block is written as it was."""
    body = shapes.parse_statements(after)
    if len(body) != 1 or not isinstance(body[0], ast.If):
        return region, out
    head = after.splitlines()[body[0].lineno - 1]
    header = region.first - 1
    if (
        region.raw
        or regions.string_lines(body)
        or header < 0
        or lines[header].strip() != "else:"
        or f"el{head.strip()}" not in {line.strip() for line in fixed.splitlines()}
    ):
        return region, out
    outer = regions.indentation(lines[header])
    inner = region.indent
    dedented = []
    for line in out:
        if line.strip() and not line.startswith(inner):
            return region, out
        dedented.append(outer + line[len(inner) :] if line.strip() else line)
    first = next(i for i, line in enumerate(dedented) if line.strip())
    dedented[first] = outer + "el" + dedented[first][len(outer) :]
    old = "".join([*lines[: region.first], *out, *lines[region.stop :]])
    new = "".join([*lines[:header], *dedented, *lines[region.stop :]])
    if ast.dump(ast.parse(old)) != ast.dump(ast.parse(new)):
        return region, out
    return dataclasses.replace(region, first=header), dedented


def _leading(body: list[ast.stmt]) -> list[ast.stmt]:
    """The module's statements from its first import to the last import
    before its first definition: the engine keeps them in the skeleton it
    may hand over (their span), so they are the same there."""
    imports = []
    for index, node in enumerate(body):
        if isinstance(node, shapes.DEFINITIONS):
            break
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(index)
    return body[imports[0] : imports[-1] + 1] if imports else []


# -- imports by name, in LibCST -----------------------------------------------


class _Imports:
    """The name-level edit of the module's imports (where upstream's lines
    cannot be written as they are)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module

    def ast_of(self, statement: cst.CSTNode) -> list[ast.stmt]:
        import textwrap

        return ast.parse(textwrap.dedent(self.module.code_for_node(statement))).body

    def edited(self, compiled: CompiledEdit, details: Mapping[str, Any]) -> cst.Module:
        import libcst as cst

        add = [tuple(a) for a in details.get("add", ())]
        drop = [tuple(a) for a in details.get("drop", ())]
        body = list(self.module.body)
        if drop:
            body = [s for s in (self._without(s, drop) for s in body) if s is not None]
        after = details.get("after", "")
        before = details.get("before", "")
        for statement in shapes.parse_statements(compiled.edit.inserted):
            wanted = [a for a in import_aliases([statement]) if a in add]
            if not wanted:
                continue
            if isinstance(statement, ast.ImportFrom):
                index = self._import_from(body, statement)
                if index is not None:
                    body[index] = self._extended(body[index], statement, wanted)
                    continue
            kept = [
                alias
                for alias, key in zip(
                    statement.names, import_aliases([statement]), strict=True
                )
                if key in wanted
            ]
            reduced = ast.unparse(_with_names(statement, kept))
            new = cst.parse_statement(reduced + "\n")
            position = self._position_of(body, before) if before and not after else None
            if position is not None:
                new, body[position] = _ahead_of(new, body[position])
            else:
                position = self._position_after(body, after)
            body.insert(position, new)
            after = reduced
        return self.module.with_changes(body=body)

    def _without(
        self, statement: cst.BaseStatement, drop: list[tuple[Any, ...]]
    ) -> cst.BaseStatement | None:
        import libcst as cst

        match statement:
            case cst.SimpleStatementLine(
                body=[cst.Import() | cst.ImportFrom() as node]
            ):
                pass
            case _:
                return statement
        if isinstance(node.names, cst.ImportStar):
            return statement
        parsed = self.ast_of(statement)[0]
        keys = import_aliases([parsed])
        names = [
            alias
            for alias, key in zip(node.names, keys, strict=True)
            if key not in drop
        ]
        if len(names) == len(node.names):
            return statement
        if not names:
            return None
        if names[-1] is not node.names[-1]:
            # The last name went: the new last one ends as it ended (a
            # trailing comma before the parenthesis stays, `a, b` is `a`).
            names[-1] = names[-1].with_changes(comma=node.names[-1].comma)
        return statement.with_changes(body=[node.with_changes(names=names)])

    def _import_from(self, body: Statements, statement: ast.ImportFrom) -> int | None:
        import libcst as cst

        for index, line in enumerate(body):
            match line:
                case cst.SimpleStatementLine(body=[cst.ImportFrom() as node]):
                    if isinstance(node.names, cst.ImportStar):
                        continue
                    module = (
                        self.module.code_for_node(node.module) if node.module else ""
                    )
                    if module == (statement.module or "") and len(node.relative) == (
                        statement.level or 0
                    ):
                        return index
        return None

    def _extended(
        self,
        line: cst.BaseStatement,
        statement: ast.ImportFrom,
        wanted: list[tuple[Any, ...]],
    ) -> cst.BaseStatement:
        """``from m import a`` with the wanted names, in upstream's order."""
        import libcst as cst

        assert isinstance(line, cst.SimpleStatementLine)
        node = line.body[0]
        assert isinstance(node, cst.ImportFrom) and not isinstance(
            node.names, cst.ImportStar
        )
        names = list(node.names)
        upstream = import_aliases([statement])
        comma = next(
            (a.comma for a in names[:-1] if isinstance(a.comma, cst.Comma)),
            cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
        )
        for key in wanted:
            present = [bound_name(k) for k in _aliases_of(names)]
            earlier = upstream[: upstream.index(key)]
            position = 0
            for previous in reversed(earlier):
                if bound_name(previous) in present:
                    position = present.index(bound_name(previous)) + 1
                    break
            alias = cst.ImportAlias(
                name=cst.parse_expression(key[3]),  # type: ignore[arg-type]
                asname=cst.AsName(name=cst.Name(key[4])) if key[4] else None,
            )
            if position == len(names):
                alias = alias.with_changes(comma=names[-1].comma)
                names[-1] = names[-1].with_changes(comma=comma)
            else:
                alias = alias.with_changes(comma=comma)
            names.insert(position, alias)
        return line.with_changes(body=[node.with_changes(names=names)])

    def _position_of(self, body: Statements, code: str) -> int | None:
        """Where the statement ``code`` is (recognition found it once)."""
        import libcst as cst

        target = shapes.shape(ast.parse(code).body[0])
        for index, statement in enumerate(body):
            if isinstance(statement, cst.SimpleStatementLine) and [
                shapes.shape(n) for n in self.ast_of(statement)
            ] == [target]:
                return index
        return None

    def _position_after(self, body: Statements, after: str) -> int:
        import libcst as cst

        if after:
            target = shapes.shape(ast.parse(after).body[0])
            for index, statement in enumerate(body):
                if isinstance(statement, cst.SimpleStatementLine) and [
                    shapes.shape(n) for n in self.ast_of(statement)
                ] == [target]:
                    return index + 1
        # After the docstring and any `from __future__` import.
        position = 0
        for index, statement in enumerate(body):
            parsed = (
                self.ast_of(statement)
                if isinstance(statement, cst.SimpleStatementLine)
                else []
            )
            match parsed:
                case [ast.Expr(value=ast.Constant(value=str()))] if index == 0:
                    position = 1
                case [ast.ImportFrom(module="__future__")]:
                    position = index + 1
                case _:
                    break
        return position


def _ahead_of(
    new: cst.BaseStatement, following: cst.BaseStatement
) -> tuple[cst.BaseStatement, cst.BaseStatement]:
    """``new`` to go right before ``following``: the blank lines above that
    one go above ``new`` (a comment right above it stays with it), as git
    writes an import added at the head of a group."""
    lines = list(following.leading_lines)
    blank = 0
    while blank < len(lines) and lines[blank].comment is None:
        blank += 1
    return (
        new.with_changes(leading_lines=lines[:blank]),
        following.with_changes(leading_lines=lines[blank:]),
    )


def _aliases_of(
    names: Sequence[cst.ImportAlias],
) -> list[tuple[str, str, int, str, str]]:
    import libcst as cst

    found = []
    for alias in names:
        name = cst.Module([]).code_for_node(alias.name)
        asname = (
            cst.Module([]).code_for_node(alias.asname.name)
            if alias.asname is not None
            else ""
        )
        found.append(("from", "", 0, name, asname))
    return found


def _with_names(
    statement: ast.Import | ast.ImportFrom, names: list[ast.alias]
) -> ast.stmt:
    import copy

    reduced = copy.copy(statement)
    reduced.names = names
    return reduced

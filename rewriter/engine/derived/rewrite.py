"""The rewrite of a derived patch, in LibCST, at the statement level.

Only whole statements are replaced or inserted; every statement the fix does
not touch keeps its text (comments, formatting). The block is found again
here by the locator recognition uses (:func:`~.match.find_step` for each
block on the way, :func:`~.match.occurrences` and
:func:`~.match.single_out` for the edit's statements), run on each LibCST
statement's ``ast``: the engine may hand over a skeleton of the file, whose
line numbers and top-level indices differ from the ones recognition saw, but
whose names and statements do not.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import libcst as cst
from deepstack_patch.engine.derived import rename, shapes
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

if TYPE_CHECKING:
    from deepstack_patch.engine.derived.match import CompiledEdit

Statements = list[cst.BaseStatement]


def apply_edit(
    module: cst.Module,
    compiled: CompiledEdit,
    details: Mapping[str, Any],
    renaming: Mapping[str, str] | None = None,
) -> cst.Module:
    """``module`` with one edit made (see :class:`~.derived.Edit`); with a
    ``renaming`` (the fix's local -> the target's, see :mod:`.rename`)
    the function's statements are matched under it and the inserted ones
    written under it."""
    rewriter = _Rewriter(module, renaming or {})
    edit = compiled.edit
    if edit.kind == "imports":
        return rewriter.imports(compiled, details)
    last = len(compiled.steps)
    if edit.kind == "header":
        action: Callable[[Statements], Statements] = lambda stmts: rewriter.header(  # noqa: E731
            stmts, compiled
        )
        return module.with_changes(
            body=rewriter.walk(list(module.body), compiled, 0, last - 1, action)
        )
    return module.with_changes(
        body=rewriter.walk(
            list(module.body),
            compiled,
            0,
            last,
            lambda stmts: rewriter.statements(stmts, compiled),
        )
    )


class _Rewriter:
    def __init__(self, module: cst.Module, renaming: Mapping[str, str]) -> None:
        self.module = module
        self.renaming = dict(renaming)
        #: Inside the function: its statements are read under the renaming.
        self.inside_function = False
        self.shapes = ShapeCache()
        self._parsed: dict[int, list[ast.stmt]] = {}
        self._keep: list[cst.CSTNode] = []

    def ast_of(self, statement: cst.CSTNode) -> list[ast.stmt]:
        """The statement as CPython parses it (several for ``a; b``)."""
        key = id(statement)
        if key not in self._parsed:
            self._keep.append(statement)
            code = textwrap.dedent(self.module.code_for_node(statement))
            self._parsed[key] = ast.parse(code).body
            if self.inside_function and self.renaming:
                back = {new: old for old, new in self.renaming.items()}
                for node in self._parsed[key]:
                    rename.Rename(back).visit(node)
        return self._parsed[key]

    def walk(
        self,
        statements: Statements,
        compiled: CompiledEdit,
        index: int,
        stop: int,
        action: Callable[[Statements], Statements],
    ) -> Statements:
        """``action`` done on the block that steps ``index`` to ``stop`` of
        the edit's way lead to, from ``statements``."""
        if index == stop:
            return action(statements)
        identity, field_name, _ = compiled.steps[index]
        at = self._one(statements, compiled, index)
        if identity.startswith("def "):
            self.inside_function = True
        changed = _with_inner(
            statements[at],
            field_name,
            lambda inner: self.walk(inner, compiled, index + 1, stop, action),
        )
        return [*statements[:at], changed, *statements[at + 1 :]]

    def _one(self, statements: Statements, compiled: CompiledEdit, index: int) -> int:
        """The statement of step ``index``, found as recognition found it:
        :func:`~.match.find_step` is the one locator both use (by its
        neighbours where its header is there more than once)."""
        entries, nodes = self.flat(statements)
        found = find_step(nodes, compiled, index, self.shapes)
        if isinstance(found, str):
            code = compiled.steps[index][2]
            raise RewriteRefused(f"`{shapes.quoted(code)}` {found}")
        return entries[next(i for i, node in enumerate(nodes) if node is found)][0]

    def flat(
        self, statements: Statements
    ) -> tuple[list[tuple[int, int]], list[ast.stmt]]:
        """One entry per CPython statement: (cst index, position in its
        line), and the statements."""
        entries: list[tuple[int, int]] = []
        nodes: list[ast.stmt] = []
        for index, statement in enumerate(statements):
            for position, node in enumerate(self.ast_of(statement)):
                entries.append((index, position))
                nodes.append(node)
        return entries, nodes

    def header(self, statements: Statements, compiled: CompiledEdit) -> Statements:
        index = self._one(statements, compiled, len(compiled.steps) - 1)
        node = statements[index]
        if shapes.header(self.ast_of(node)[0]) != compiled.header_before:
            raise RewriteRefused("the header is not the one the fix expects")
        code = with_block(compiled.edit.header_after)
        if self.inside_function:  # an `if`'s header reads the function's locals
            code = rename.renamed_code(code, self.renaming)
        new = cst.parse_statement(code)
        if type(new) is not type(node):
            raise RewriteRefused("the fixed header is another kind of statement")
        # The blocks stay the target's: only the header is the fix's.
        kept = {
            name: getattr(node, name)
            for name in ("body", "orelse", "leading_lines")
            if hasattr(node, name)
        }
        replaced = new.with_changes(**kept)
        return [*statements[:index], replaced, *statements[index + 1 :]]

    def statements(self, statements: Statements, compiled: CompiledEdit) -> Statements:
        entries, nodes = self.flat(statements)
        offset = len(nodes) - len(shapes.without_docstring(nodes))
        at_start, at_end = compiled.at_start, compiled.at_end
        found = occurrences(
            nodes, compiled.before_pattern, at_start, at_end, self.shapes
        )
        if not compiled.anchored:  # told apart by its neighbours, as recognised
            anchors = (compiled.before_anchor, compiled.after_anchor)
            size = len(compiled.removed)
            found = single_out(
                nodes[offset:], found, size, anchors, self.shapes, edges=True
            )
        if len(found) != 1:
            raise RewriteRefused(
                f"the code the fix changes is found {len(found)} times, not once"
            )
        skip = 1 if compiled.anchored and compiled.before_anchor else 0
        start = found[0] + offset + skip
        end = start + len(compiled.removed)
        for boundary in (start, end):
            if boundary < len(entries) and entries[boundary][1] != 0:
                raise RewriteRefused(
                    "the fix splits a line that holds several statements"
                )
        first = entries[start][0] if start < len(entries) else len(statements)
        last = entries[end][0] if end < len(entries) else len(statements)
        new = _parsed_statements(
            rename.renamed_code(compiled.edit.inserted, self.renaming)
        )
        if new and first < last:
            # Comments above a replaced statement stay above its replacement,
            # followed by the fix's own (those the target has already once).
            kept = list(statements[first].leading_lines)
            known = {_comment(line) for line in kept}
            new[0] = new[0].with_changes(
                leading_lines=[
                    *kept,
                    *(
                        line
                        for line in new[0].leading_lines
                        if _comment(line) not in known
                    ),
                ]
            )
        elif (
            new
            and first < len(statements)
            and _moves_comment(statements[first], new[0])
        ):
            # Upstream put the insertion between the next statement and the
            # comment above it; the comment stays above the insertion, once.
            following = statements[first]
            new[0] = new[0].with_changes(
                leading_lines=[
                    *following.leading_lines,
                    *new[0].leading_lines[len(_comments(following)) :],
                ]
            )
            statements = [
                *statements[:first],
                following.with_changes(leading_lines=[]),
                *statements[first + 1 :],
            ]
        elif new and not new[0].leading_lines and _is_definition(new[0]):
            neighbour = statements[first] if first < len(statements) else None
            if neighbour is None or not _is_definition(neighbour):
                neighbour = statements[first - 1] if first > 0 else None
            if neighbour is not None:
                blank = [
                    line for line in neighbour.leading_lines if line.comment is None
                ]
                new[0] = new[0].with_changes(leading_lines=blank)
        result = [*statements[:first], *new, *statements[last:]]
        if not result:
            raise RewriteRefused("the fix would leave the block empty")
        return result

    # -- imports ----------------------------------------------------------

    def imports(self, compiled: CompiledEdit, details: Mapping[str, Any]) -> cst.Module:
        add = [tuple(a) for a in details.get("add", ())]
        drop = [tuple(a) for a in details.get("drop", ())]
        body = list(self.module.body)
        if drop:
            body = [s for s in (self._without(s, drop) for s in body) if s is not None]
        after = details.get("after", "")
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
            position = self._position_after(body, after)
            body.insert(position, cst.parse_statement(reduced + "\n"))
            after = reduced
        return self.module.with_changes(body=body)

    def _without(
        self, statement: cst.BaseStatement, drop: list[tuple[Any, ...]]
    ) -> cst.BaseStatement | None:
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
        names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return statement.with_changes(body=[node.with_changes(names=names)])

    def _import_from(self, body: Statements, statement: ast.ImportFrom) -> int | None:
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

    def _position_after(self, body: Statements, after: str) -> int:
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


def _aliases_of(
    names: Sequence[cst.ImportAlias],
) -> list[tuple[str, str, int, str, str]]:
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


def _parsed_statements(code: str) -> Statements:
    """The statements of ``code``, comments above the first one included
    (LibCST gives a module's leading comments to the module, not to it)."""
    if not code.strip():
        return []
    parsed = cst.parse_module("pass\n" + code).visit(_UnindentedBlankLines())
    return list(parsed.body[1:])


class _UnindentedBlankLines(cst.CSTTransformer):
    """Blank lines parsed at the module level are marked indented, which in
    the target's block would write its indentation on them."""

    def leave_EmptyLine(
        self, original_node: cst.EmptyLine, updated_node: cst.EmptyLine
    ) -> cst.EmptyLine:
        if updated_node.comment is None:
            return updated_node.with_changes(indent=False)
        return updated_node


def _comments(statement: cst.BaseStatement) -> list[str]:
    return [
        line.comment.value.strip()
        for line in statement.leading_lines
        if line.comment is not None
    ]


def _moves_comment(following: cst.BaseStatement, inserted: cst.BaseStatement) -> bool:
    """Whether the inserted code starts with the comment lines above the
    statement it goes before (and has more lines of its own after them)."""
    theirs = _comments(following)
    ours = [
        line.comment.value.strip() if line.comment else None
        for line in inserted.leading_lines
    ]
    return bool(theirs) and ours[: len(theirs)] == theirs


def _comment(line: cst.EmptyLine) -> str | None:
    return line.comment.value.strip() if line.comment is not None else None


def _is_definition(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.FunctionDef | cst.ClassDef)


def _with_inner(
    node: cst.BaseStatement,
    field_name: str,
    change: Callable[[Statements], Statements],
) -> cst.BaseStatement:
    """``node`` with the block ``field_name`` (ast's name for it) changed."""

    def indented(block: Any) -> Any:
        if not isinstance(block, cst.IndentedBlock):
            raise RewriteRefused(
                "the block is on the line of its header; the fix needs it indented"
            )
        return block.with_changes(body=change(list(block.body)))

    match field_name:
        case "body":
            return node.with_changes(body=indented(node.body))  # type: ignore[attr-defined]
        case "orelse":
            orelse = getattr(node, "orelse", None)
            match orelse:
                case cst.Else():
                    return node.with_changes(
                        orelse=orelse.with_changes(body=indented(orelse.body))
                    )
                case cst.If():  # an elif: ast's else block holds that one `if`
                    changed = change([orelse])
                    if len(changed) != 1 or not isinstance(changed[0], cst.If):
                        raise RewriteRefused("the fix changes an elif chain's shape")
                    return node.with_changes(orelse=changed[0])
        case "finalbody":
            final = getattr(node, "finalbody", None)
            if isinstance(final, cst.Finally):
                return node.with_changes(
                    finalbody=final.with_changes(body=indented(final.body))
                )
    raise RewriteRefused(f"no {field_name} block to change")

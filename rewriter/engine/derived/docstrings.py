"""A docstring the fix edits, carried as text.

Docstrings never count for recognition (:mod:`.shapes` leaves them out), so
a fix that also rewords the docstring of a function it changes (vllm#52005)
is recognised by its code alone; the docstring edit (``kind = "docstring"``,
its way into the definition, the docstring before and after as the files
write them) rides along. Where the unit is needed and the target's docstring
is the one the fix edits, the rewrite writes upstream's; where it is
another (a vendor's, an older wording), it is left as it is, with a note;
where it is upstream's already, there is nothing to do.

A docstring a fix edits alone (of a definition whose code it leaves as it
is) is a documentation unit of its own (``Unit.documentation_only``),
carried only where the old text is there exactly (:func:`exact_action`).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.derived import shapes
from deepstack_patch.engine.derived.data import Edit, Unit
from deepstack_patch.engine.derived.match import (
    CompiledEdit,
    ShapeCache,
    find_step,
    one_statement,
    with_block,
)
from deepstack_patch.engine.errors import RewriteRefused

if TYPE_CHECKING:  # libcst is imported where a rewrite runs, not by status
    import libcst as cst

#: What the rewrite does with the target's docstring.
REPLACE, ADD, REMOVE = "replace", "add", "remove"


def _text(code: str) -> str | None:
    """A recorded docstring's text, cleaned as ``inspect`` cleans it (the
    indentation inside it is the file's, not the docstring's); None: none."""
    statements = shapes.parse_statements(code)
    match statements:
        case [ast.Expr(value=ast.Constant(value=str(text)))]:
            return inspect.cleandoc(text)
    return None


def action(compiled: CompiledEdit, block: Sequence[ast.stmt]) -> tuple[str, str]:
    """What to do with the docstring of ``block`` (the definition's body in
    the target): one of the actions above, or "" (nothing); and a note
    where the target's docstring is not the one the fix edits."""
    ours = (
        inspect.cleandoc(block[0].value.value)  # type: ignore[attr-defined]
        if block and shapes.is_docstring(block[0])
        else None
    )
    before, after = _text(compiled.edit.removed), _text(compiled.edit.inserted)
    if ours == after:
        return "", ""
    if ours == before:
        return (ADD if ours is None else REMOVE if after is None else REPLACE), ""
    return "", "its docstring is not the one the fix edits: left as it is"


def exact_action(compiled: CompiledEdit, block: Sequence[ast.stmt]) -> str | None:
    """What to do with the docstring of ``block`` where the fix changes only
    documentation there: one of the actions above where the target's is the
    one the fix edits, exactly as written (the string's every character, its
    indentation inside included), "" where it is the fixed one already, None
    where it is neither (left out: a vendor's wording, another release's)."""
    ours = (
        block[0].value.value  # type: ignore[attr-defined]
        if block and shapes.is_docstring(block[0])
        else None
    )
    before = _raw(compiled.edit.removed)
    after = _raw(compiled.edit.inserted)
    if ours == after:
        return ""
    if ours == before:
        return ADD if ours is None else REMOVE if after is None else REPLACE
    return None


def _raw(code: str) -> str | None:
    """A recorded docstring's value as the file writes it; None: none."""
    match shapes.parse_statements(code):
        case [ast.Expr(value=ast.Constant(value=str(text)))]:
            return text
    return None


def rewrite(module: cst.Module, compiled: CompiledEdit) -> cst.Module:
    """``module`` with the docstring of the edit's definition as upstream
    writes it, where it is the one the fix edits (as recognition found it);
    nothing where it is upstream's already (the edits before may have
    brought it, a definition made its ``after`` whole)."""
    import libcst as cst

    before, after = _text(compiled.edit.removed), _text(compiled.edit.inserted)

    def change(block: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        ours = _docstring_of(module, block[0]) if block else None
        if ours == after:
            return block
        if ours != before:
            raise RewriteRefused("the docstring is not the one the fix edits")
        new = (
            [cst.parse_statement(compiled.edit.inserted)]
            if compiled.edit.inserted.strip()
            else []
        )
        rest = block if ours is None else block[1:]
        if new and ours is not None:
            new[0] = new[0].with_changes(leading_lines=block[0].leading_lines)
        if not new and not rest:
            raise RewriteRefused("the fix would leave the block empty")
        return [*new, *rest]

    return module.with_changes(
        body=_walk(module, list(module.body), compiled, 0, ShapeCache(), change)
    )


def _docstring_of(module: cst.Module, statement: cst.BaseStatement) -> str | None:
    """The statement's text, cleaned, where it is a docstring; else None."""
    code = textwrap.dedent(module.code_for_node(statement))
    node = ast.parse(code).body[0]
    if not shapes.is_docstring(node):
        return None
    return inspect.cleandoc(node.value.value)  # type: ignore[attr-defined]


def _walk(
    module: cst.Module,
    statements: list[cst.BaseStatement],
    compiled: CompiledEdit,
    index: int,
    shapes_of: ShapeCache,
    change: Callable[[list[cst.BaseStatement]], list[cst.BaseStatement]],
) -> list[cst.BaseStatement]:
    """``change`` made to the block the edit's steps lead to (found by the
    locator recognition uses, :func:`~.match.find_step`)."""
    if index == len(compiled.steps):
        return change(statements)
    parsed = [ast.parse(textwrap.dedent(module.code_for_node(s))) for s in statements]
    nodes = [tree.body[0] for tree in parsed]
    found = find_step(nodes, compiled, index, shapes_of)
    if isinstance(found, str):
        raise RewriteRefused(f"`{shapes.quoted(compiled.steps[index][2])}` {found}")
    at = next(i for i, node in enumerate(nodes) if node is found)
    node = statements[at]
    field_name = compiled.steps[index][1]
    holder: Any = node if field_name == "body" else getattr(node, field_name, None)
    from libcst import IndentedBlock

    if holder is None or not isinstance(holder.body, IndentedBlock):
        raise RewriteRefused(f"no indented {field_name} block to change")
    inner = list(holder.body.body)
    changed = _walk(module, inner, compiled, index + 1, shapes_of, change)
    holder = holder.with_changes(body=holder.body.with_changes(body=changed))
    if field_name != "body":
        holder = node.with_changes(**{field_name: holder})
    return [*statements[:at], holder, *statements[at + 1 :]]


def details_of(todo: str) -> Mapping[str, str]:
    return {"docstring": todo} if todo else {}


# -- at derive time: the docstring edits no unit carries ---------------------


def left_out(before: str, after: str, units: Sequence[Unit]) -> list[str]:
    """The definitions (qualified names; ``""``: the module) whose docstring
    the change edits and no unit's docstring edit carries: a definition the
    fix does not otherwise change, a class's, the module's. derive leaves
    them out with a note; docstrings never count for a derived patch."""
    old, new = _docstrings(ast.parse(before)), _docstrings(ast.parse(after))
    carried = {_qualified(edit) for unit in units for edit in unit.edits}
    return [
        name
        for name in dict.fromkeys([*old, *new])
        if name in old and name in new and old[name] != new[name]
        if name not in carried
    ]


def without_docstrings(tree: ast.Module, names: Sequence[str]) -> ast.Module:
    """``tree`` with the docstrings of the definitions ``names`` left out
    (what derive's round trip compares where it left them out)."""
    wanted = set(names)
    for name, node in _definitions(tree):
        body = node.body
        if name in wanted and body and shapes.is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _docstrings(tree: ast.Module) -> dict[str, str | None]:
    return {
        name: ast.get_docstring(node, clean=False) for name, node in _definitions(tree)
    }


def _definitions(tree: ast.Module) -> list[tuple[str, Any]]:
    """Each definition of the module with its qualified name (the defs and
    classes it is in), the module itself as ``""``."""
    found: list[tuple[str, Any]] = [("", tree)]
    seen: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, shapes.DEFINITIONS):
                name = f"{prefix}{child.name}"
                seen[name] = seen.get(name, 0) + 1
                key = name if seen[name] == 1 else f"{name} ({seen[name]})"
                found.append((key, child))
                visit(child, f"{name}.")
            elif isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                visit(child, prefix)

    visit(tree, "")
    return found


def _qualified(edit: Edit) -> str | None:
    """The definition a docstring edit's way leads to (None: another edit)."""
    if edit.kind != "docstring":
        return None
    names = []
    for step in edit.block:
        match one_statement(with_block(step.header)):
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                names.append(name)
            case ast.ClassDef(name=name):
                names.append(name)
    return ".".join(names)

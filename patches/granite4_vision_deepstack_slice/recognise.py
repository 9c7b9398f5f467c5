"""vllm#40917's recognition helpers: the form of each ``IntermediateTensors``
build from ``self._ds_buffers`` (whole buffers, sliced to the step's rows, or
something unknown), and whether ``n`` is free where the fix assigns it.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterator
from dataclasses import dataclass

from deepstack_patch.engine.syntax import is_self_attribute, matches_code

#: The step's row count, as vendors write it.
ROW_COUNTS = ("inputs_embeds.size(0)", "inputs_embeds.shape[0]")


class BufferForm(enum.Enum):
    """What the comprehension of a known build hands the model per level."""

    WHOLE = "self._ds_buffers[lvl]"  # the bug
    UPSTREAM = "self._ds_buffers[lvl][:n], n = inputs_embeds.size(0)"  # the fix
    EQUIVALENT = "sliced to the step's rows another way"  # a vendor's fix


@dataclass(frozen=True)
class Unknown:
    """Code around the buffers that is neither the bug nor the fix."""

    node: ast.AST
    found: str
    expected: str


def own_nodes(function: ast.FunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``function``, those of nested functions and classes aside
    (they are recognised as functions of their own)."""
    stack: list[ast.AST] = list(reversed(function.body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def mentions_buffers(node: ast.AST) -> bool:
    """``self._ds_buffers`` anywhere inside ``node``."""
    return any(is_self_attribute(n, "_ds_buffers") for n in ast.walk(node))


def _quoted(node: ast.AST) -> str:
    """A node's code for a message, long code shortened."""
    code = ast.unparse(node)
    return f"`{code}`" if len(code) <= 80 else f"`{code[:77]}...`"


def build_form(function: ast.FunctionDef, build: ast.Call) -> BufferForm | Unknown:
    """Recognise one ``IntermediateTensors`` build from the buffers.

    Only the known shape counts: the build assigned to a name (or sliced to
    the rows first), its one argument a dict comprehension over
    ``enumerate(self._ds_layer_indices)``, and as its value the level's
    buffer, whole or sliced to the step's rows. Anything else is unknown.
    """
    if not _assigned_as_is(function, build):
        return Unknown(
            build,
            "an IntermediateTensors build from self._ds_buffers that is not "
            "assigned to a name",
            "the build assigned to a name, ds = IntermediateTensors({...})",
        )
    match build:
        case ast.Call(
            args=[ast.DictComp(key=key, value=value, generators=[loop])],
            keywords=[],
        ):
            pass
        case _:
            return Unknown(
                build,
                _quoted(build),
                "IntermediateTensors with one dict comprehension, "
                "{...: self._ds_buffers[lvl] for lvl, layer in "
                "enumerate(self._ds_layer_indices)}",
            )
    match loop:
        case ast.comprehension(
            target=ast.Tuple(elts=[ast.Name(level), ast.Name()]),
            iter=levels,
            ifs=[],
            is_async=0,
        ) if matches_code(levels, "enumerate(self._ds_layer_indices)"):
            pass
        case _:
            return Unknown(
                loop.target,
                f"`for {ast.unparse(loop.target)} in {ast.unparse(loop.iter)}`"
                + (" with a condition" if loop.ifs else ""),
                "one level per deepstack layer, "
                "`for lvl, layer in enumerate(self._ds_layer_indices)`",
            )
    if mentions_buffers(key):
        return Unknown(key, _quoted(key), "a key naming the layer, f'ds_{layer}'")
    form = _buffer_form(function, build, value, level)
    if form is None:
        return Unknown(
            value,
            _quoted(value),
            f"self._ds_buffers[{level}] (needed), or sliced to the step's rows: "
            f"self._ds_buffers[{level}][:n], [0:n] or .narrow(0, 0, n), with n "
            "inputs_embeds.size(0) or .shape[0] or a name assigned from them "
            "(applied)",
        )
    return form


def _assigned_as_is(function: ast.FunctionDef, build: ast.Call) -> bool:
    """``ds = <build>`` (or annotated), or ``ds = <build>[:rows]``."""
    for node in own_nodes(function):
        match node:
            case (
                ast.Assign(targets=[ast.Name()], value=value)
                | ast.AnnAssign(target=ast.Name(), value=value)
            ) if value is build:
                return True
            case (
                ast.Assign(
                    targets=[ast.Name()], value=ast.Subscript(value=sliced) as value
                )
                | ast.AnnAssign(
                    target=ast.Name(), value=ast.Subscript(value=sliced) as value
                )
            ) if sliced is build:
                return _row_slice(function, value, build.lineno) is not None
    return False


def _buffer_form(
    function: ast.FunctionDef, build: ast.Call, value: ast.expr, level: str
) -> BufferForm | None:
    """The form of the comprehension's value, None if it is none of them."""

    def is_level_buffer(node: ast.expr) -> bool:
        return matches_code(node, "self._ds_buffers[{level}]", level=level)

    match value:
        case _ if is_level_buffer(value):
            return BufferForm.WHOLE
        case ast.Subscript(value=buffer) if is_level_buffer(buffer):
            rows = _row_slice(function, value, build.lineno)
            if rows is None:
                return None
            match value.slice:
                case ast.Slice(lower=None, upper=ast.Name("n"), step=None):
                    upstream = matches_code(rows, "inputs_embeds.size(0)")
                case _:
                    upstream = False
            return BufferForm.UPSTREAM if upstream else BufferForm.EQUIVALENT
        case ast.Call(
            func=ast.Attribute(value=buffer, attr="narrow"),
            args=[dim, start, length],
            keywords=[],
        ) if (
            is_level_buffer(buffer)
            and matches_code(dim, "0")
            and matches_code(start, "0")
            and _row_count(function, length, build.lineno) is not None
        ):
            return BufferForm.EQUIVALENT
    return None


def _row_slice(
    function: ast.FunctionDef, node: ast.Subscript, line: int
) -> ast.expr | None:
    """The row count ``<x>[:rows]`` or ``<x>[0:rows]`` slices to, read at
    ``line``; None for any other subscript."""
    match node.slice:
        case ast.Slice(lower=lower, upper=ast.expr() as upper, step=None) if (
            lower is None or matches_code(lower, "0")
        ):
            return _row_count(function, upper, line)
    return None


def _row_count(function: ast.FunctionDef, node: ast.expr, line: int) -> ast.expr | None:
    """The step's row count ``node`` stands for at ``line``: a row count
    itself, or a name whose last assignment before ``line`` is one."""
    if any(matches_code(node, count) for count in ROW_COUNTS):
        return node
    if not isinstance(node, ast.Name):
        return None
    stores = [
        n
        for n in own_nodes(function)
        if isinstance(n, ast.Name)
        and n.id == node.id
        and isinstance(n.ctx, ast.Store)
        and n.lineno < line
    ]
    if not stores:
        return None
    last = max(stores, key=lambda store: (store.lineno, store.col_offset))
    for statement in own_nodes(function):
        match statement:
            case (
                ast.Assign(targets=[target], value=value)
                | ast.AnnAssign(target=target, value=ast.expr() as value)
            ) if target is last:
                counts = any(matches_code(value, count) for count in ROW_COUNTS)
                return value if counts else None
    # Bound another way (a loop, a tuple, ``:=``): not known to be the rows.
    return None


def sliced_after_building(function: ast.FunctionDef, builds: list[ast.Call]) -> bool:
    """Every build's result is sliced to the step's rows once built.

    ``IntermediateTensors({...})[:n]``, or ``ds = IntermediateTensors({...})``
    followed by ``ds = ds[:n]``, with ``n`` the row count or a name assigned
    from it (``IntermediateTensors`` slices every tensor it holds).
    """
    built_into: dict[int, str] = {}
    sliced_directly: set[int] = set()
    for node in own_nodes(function):
        match node:
            case (
                ast.Assign(targets=[ast.Name(name)], value=value)
                | ast.AnnAssign(target=ast.Name(name), value=value)
            ):
                built_into[id(value)] = name
                if (
                    isinstance(value, ast.Subscript)
                    and _row_slice(function, value, value.lineno) is not None
                ):
                    sliced_directly.add(id(value.value))
    for build in builds:
        if id(build) in sliced_directly:
            continue
        name = built_into.get(id(build))
        end = build.end_lineno or build.lineno
        later = [
            node
            for node in own_nodes(function)
            if _reslices(function, node, name) and node.lineno > end
        ]
        if name is None or not later:
            return False
    return True


def _reslices(function: ast.FunctionDef, node: ast.AST, name: str | None) -> bool:
    """``<name> = <name>[:rows]``."""
    match node:
        case ast.Assign(
            targets=[ast.Name(target)],
            value=ast.Subscript(value=ast.Name(source)) as sliced,
        ) if target == source == name:
            return _row_slice(function, sliced, node.lineno) is not None
    return False


def name_free_at(function: ast.FunctionDef, name: str, line: int) -> bool:
    """True if assigning ``name`` just before ``line`` cannot change a read.

    That holds when the function does not use the name before ``line`` and
    every later read follows a later assignment (upstream's buffer clearing
    assigns ``n`` again before using it). Conservative: not flow-sensitive.
    """
    uses = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == name]
    if any(use.lineno < line for use in uses):
        return False
    stores = [u.lineno for u in uses if isinstance(u.ctx, ast.Store)]
    reads = [u.lineno for u in uses if isinstance(u.ctx, ast.Load)]
    return all(any(store < read for store in stores) for read in reads)

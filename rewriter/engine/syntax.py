"""Small helpers patches share for finding code by structure.

Recognition works on CPython's ``ast`` (fast, with line numbers); rewriting
on LibCST (lossless). Both address a function by its qualified name
(``Class.method``), so a finding made on one is found again on the other.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.protocol import Finding, PatchState

if TYPE_CHECKING:
    import libcst

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def iter_functions(tree: ast.Module) -> Iterator[tuple[str, FunctionNode]]:
    """Every function and method with its qualified name, outermost first."""

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, FunctionNode]]:
        for node in body:
            if isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, FunctionNode):
                yield f"{prefix}{node.name}", node
                yield from walk(node.body, f"{prefix}{node.name}.<locals>.")
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    block = getattr(node, field, None)
                    if isinstance(block, list):
                        yield from walk(block, prefix)

    yield from walk(tree.body, "")


def iter_classes(tree: ast.Module) -> Iterator[tuple[str, ast.ClassDef]]:
    """Every class with its qualified name (nested classes included)."""

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, ast.ClassDef]]:
        for node in body:
            if isinstance(node, ast.ClassDef):
                yield f"{prefix}{node.name}", node
                yield from walk(node.body, f"{prefix}{node.name}.")

    yield from walk(tree.body, "")


def span(node: ast.AST) -> tuple[int, int]:
    """The lines a node occupies, decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return first, node.end_lineno or node.lineno


@functools.lru_cache(maxsize=512)
def _template_dump(code: str, expression: bool) -> str:
    if expression:
        return ast.dump(ast.parse(code.strip(), mode="eval").body)
    import textwrap  # once per template (cached): not on every command's start

    body = ast.parse(textwrap.dedent(code)).body
    if len(body) != 1:
        raise ValueError(f"a statement template must hold one statement: {code!r}")
    return ast.dump(body[0])


def matches_code(node: ast.AST, template: str, **names: str) -> bool:
    """``node`` is the code ``template`` with ``{name}`` placeholders filled in.

    Layout, comments and line numbers do not count, so a vendor's formatting
    still matches. An expression node is compared with the template parsed as
    an expression, a statement with its one statement (literal braces in the
    template are doubled, as for ``str.format``)::

        matches_code(test.comparators[0], "self.{buffers}[0].size(0)", buffers=name)
    """
    code = template.format(**names) if names else template
    expression = isinstance(node, ast.expr)
    return ast.dump(node) == _template_dump(code, expression)


def finding(
    state: PatchState,
    symbol: str,
    nodes: ast.AST | Sequence[ast.AST],
    reason: str = "",
    *,
    part: str = "",
    rewrites: tuple[str, ...] | None = None,
    details: Mapping[str, Any] | None = None,
) -> Finding:
    """A finding at ``nodes``: the first node's line, and as the editable span
    the union of their spans (e.g. the methods of a class that one rewrite
    changes together).

    ``rewrites`` defaults to the symbol itself; pass ``()`` where the fixed
    code can never equal upstream's. ``details`` is what ``rewrite`` needs
    from recognition (see :class:`Finding`).
    """
    if isinstance(nodes, ast.AST):
        nodes = [nodes]
    spans = [span(node) for node in nodes]
    return Finding(
        state=state,
        symbol=symbol,
        line=nodes[0].lineno,
        span=(min(first for first, _ in spans), max(last for _, last in spans)),
        reason=reason,
        part=part,
        rewrites=(symbol,) if rewrites is None else rewrites,
        details=details or {},
    )


def is_self_attribute(node: ast.AST, name: str) -> bool:
    """``self.<name>``."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def called_name(node: ast.AST) -> str | None:
    """The last name of a call's callee: ``f`` for ``f(...)`` and ``a.b.f(...)``."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def parameter_names(function: FunctionNode) -> list[str]:
    args = function.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


def rewrite_definitions(
    module: libcst.Module, rewriters: dict[str, Callable[[Any], Any]]
) -> libcst.Module:
    """Return ``module`` with each named class or function passed through its
    rewriter (a ``libcst.ClassDef`` or ``libcst.FunctionDef`` in, the same out).

    Raises ``LookupError`` if a named definition is not in the module, so a
    patch never silently does nothing.
    """
    import libcst

    seen: set[str] = set()

    class DefinitionRewriter(libcst.CSTTransformer):
        # Only classes and functions on the way to a target are entered:
        # visiting every body of a large model file costs about a second.
        def __init__(self) -> None:
            self.scope: list[str] = []

        def _enter(self, name: str) -> bool:
            # A target's own body is not entered either, unless another
            # target is inside it: its rewriter gets it whole on the way
            # out (LibCST calls ``leave_*`` for a node whose children it
            # skipped), and visiting a long ``forward`` cost a fifth of a
            # full ``apply``.
            qualname = ".".join([*self.scope, name])
            self.scope.append(name)
            return any(target.startswith(qualname + ".") for target in rewriters)

        def _leave(self, updated: Any) -> Any:
            qualname = ".".join(self.scope)
            self.scope.pop()
            rewriter = rewriters.get(qualname)
            if rewriter is None:
                return updated
            seen.add(qualname)
            return rewriter(updated)

        def visit_ClassDef(self, node: libcst.ClassDef) -> bool:
            return self._enter(node.name.value)

        def leave_ClassDef(
            self, original: libcst.ClassDef, updated: libcst.ClassDef
        ) -> libcst.ClassDef:
            return self._leave(updated)

        def visit_FunctionDef(self, node: libcst.FunctionDef) -> bool:
            return self._enter(node.name.value)

        def leave_FunctionDef(
            self, original: libcst.FunctionDef, updated: libcst.FunctionDef
        ) -> libcst.FunctionDef:
            return self._leave(updated)

    # Nested functions are addressed as ``outer.<locals>.inner`` by the ast
    # side; LibCST's scope here joins them with '.', so map the names.
    rewriters = {name.replace(".<locals>.", "."): fn for name, fn in rewriters.items()}
    result = module.visit(DefinitionRewriter())
    missing = set(rewriters) - seen
    if missing:
        raise LookupError(f"no definition {', '.join(sorted(missing))} in the module")
    return result

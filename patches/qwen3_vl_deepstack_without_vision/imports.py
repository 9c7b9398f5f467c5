"""vllm#49397's one change outside the classes: ``StageMissingLayer`` imported.

The guard ``not isinstance(self.<tower>, StageMissingLayer)`` needs the name.
A file beside the model utilities (every model file upstream fixed) gets it
added to its ``from .utils import ...``, where upstream put it; any other
file gets ``from vllm.model_executor.models.utils import StageMissingLayer``
after its last import. The import is a finding of its own (symbol
``import StageMissingLayer``), so the engine holds the rewrite to its lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.syntax import finding

if TYPE_CHECKING:
    import libcst

GUARD = "StageMissingLayer"
IMPORT_SYMBOL = f"import {GUARD}"
#: Where ``StageMissingLayer`` lives, and the folder whose files name it
#: ``.utils``.
UTILS = "vllm.model_executor.models.utils"
MODELS_DIR = "vllm/model_executor/models/"


def recognise_import(
    tree: ast.Module, path: str, functions: Sequence[ast.FunctionDef]
) -> Finding:
    """Whether ``StageMissingLayer`` is imported, at module level or in the
    ``functions`` that use it, and where the import goes."""
    imports = [
        node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    # Not a walk of the whole module (a model file has ~70,000 nodes): the
    # module's own statements, through `if`/`try`, and the functions' bodies.
    binding = [
        node
        for node in [
            *_module_statements(tree.body),
            *(n for function in functions for n in ast.walk(function)),
        ]
        if isinstance(node, ast.ImportFrom)
        and any(a.name == GUARD and a.asname in (None, GUARD) for a in node.names)
    ]
    if binding:
        return finding(PatchState.APPLIED, IMPORT_SYMBOL, binding[0], rewrites=())
    beside_utils = path.startswith(MODELS_DIR) and "/" not in path[len(MODELS_DIR) :]
    for node in imports:
        if _imports_utils(node, beside_utils):
            return finding(
                PatchState.NEEDED,
                IMPORT_SYMBOL,
                node,
                rewrites=(),
                details={"extend": True, "relative": node.level == 1},
            )
    if not imports:
        return finding(
            PatchState.DRIFTED,
            IMPORT_SYMBOL,
            tree.body[0],
            f"the file imports nothing: where {GUARD} should be imported is unclear",
            rewrites=(),
        )
    return finding(
        PatchState.NEEDED, IMPORT_SYMBOL, imports[-1], rewrites=(), details={}
    )


def _module_statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        yield statement
        match statement:
            case ast.If(body=inner, orelse=other) | ast.Try(body=inner, orelse=other):
                yield from _module_statements(inner)
                yield from _module_statements(other)


def _imports_utils(node: ast.stmt, beside_utils: bool) -> bool:
    """``from .utils import a, b`` (in the models folder) or ``from <UTILS> import``."""
    match node:
        case ast.ImportFrom(module="utils", level=1, names=names) if beside_utils:
            return names[0].name != "*"
        case ast.ImportFrom(module=module, level=0, names=names) if module == UTILS:
            return names[0].name != "*"
    return False


def add_import(module: libcst.Module, fix: Finding) -> libcst.Module:
    """``StageMissingLayer`` added to the utilities import, sorted as isort
    sorts (constants, classes, then the rest), or a new import line after the
    last import."""
    import libcst

    body = list(module.body)
    imports = [
        i
        for i, statement in enumerate(body)
        if isinstance(statement, libcst.SimpleStatementLine)
        and isinstance(statement.body[0], libcst.Import | libcst.ImportFrom)
    ]
    if not fix.details.get("extend"):
        at = imports[-1] + 1
        new = libcst.parse_statement(
            f"from {UTILS} import {GUARD}\n", config=module.config_for_parsing
        )
        return module.with_changes(body=[*body[:at], new, *body[at:]])
    relative = fix.details["relative"]
    for i in imports:
        statement = body[i]
        node = statement.body[0]
        if not isinstance(node, libcst.ImportFrom) or isinstance(
            node.names, libcst.ImportStar
        ):
            continue
        name = module.code_for_node(node.module) if node.module else ""
        if (len(node.relative) == 1, name) != (
            relative,
            "utils" if relative else UTILS,
        ):
            continue
        body[i] = statement.with_changes(body=[_with_name(node, GUARD)])
        return module.with_changes(body=body)
    raise LookupError(f"no import from the model utilities to add {GUARD} to")


def _with_name(node: libcst.ImportFrom, name: str) -> libcst.ImportFrom:
    import libcst

    assert not isinstance(node.names, libcst.ImportStar)
    names = list(node.names)
    key = _isort_key(name)
    at = next(
        (i for i, alias in enumerate(names) if _isort_key(alias.evaluated_name) > key),
        len(names),
    )
    # Between two names the new one takes the separator its neighbours use
    # (a space, or a line break in brackets); last, it takes the old last
    # name's ending (a trailing comma or none).
    separator = next(
        (a.comma for a in names if isinstance(a.comma, libcst.Comma)),
        libcst.Comma(whitespace_after=libcst.SimpleWhitespace(" ")),
    )
    if at < len(names):
        names.insert(at, libcst.ImportAlias(name=libcst.Name(name), comma=separator))
    else:
        ending = names[-1].comma
        names[-1] = names[-1].with_changes(comma=separator)
        names.append(libcst.ImportAlias(name=libcst.Name(name), comma=ending))
    return node.with_changes(names=names)


def _isort_key(name: str) -> tuple[int, str]:
    """isort's ``force_sort_within_sections=false`` order of imported names."""
    if name.isupper() and len(name) > 1:
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name

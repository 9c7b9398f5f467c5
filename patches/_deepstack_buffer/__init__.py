"""What vllm#40932 and vllm#43617 share: the Qwen3-VL deepstack buffer methods.

Qwen3-VL and its copies (the Qwen3-Omni-MoE thinker, and any model file that
repeats the pattern) keep the vision tower's deepstack features in persistent
buffers ``self.deepstack_input_embeds`` and move them through three methods
per model class: ``_set_`` fills the buffers after the encoder ran, ``_get_``
hands the rows of one step to the language model, ``_clear_`` zeroes them
after the step. vllm#40145 (0.20.0) added a token counter,
``self.deepstack_input_embeds_num_tokens``; both fixes are about what that
counter made ``_get_`` and ``_clear_`` do. Releases without the counter never
had either bug.

This package finds those classes by structure and matches the few statements
both patches care about; ``proof.py`` builds the weight-less objects their
proofs call.
"""

from __future__ import annotations

import ast
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.source import parsed_from
from deepstack_patch.engine.syntax import (
    FunctionNode,
    is_self_attribute,
    iter_classes,
    matches_code,
    parameter_names,
)

if TYPE_CHECKING:
    import libcst

GET = "_get_deepstack_input_embeds"
RESIZE = "_resize_deepstack_input_embeds"
SET = "_set_deepstack_input_embeds"
CLEAR = "_clear_deepstack_input_embeds"
BUFFERS = "deepstack_input_embeds"
COUNTER = "deepstack_input_embeds_num_tokens"

#: Where model classes live: the classic model folder, and the per-model
#: packages newer releases add (whose classes so far only inherit the methods).
MODEL_PATHS = ("vllm/model_executor/models/*.py", "vllm/models/**/*.py")
MARKERS = (GET.encode(),)

NOT_PRESENT = "bug not present in this release"


def tree_deepstack_classes(
    tree: Path,
) -> Iterator[tuple[Path, str, dict[str, FunctionNode]]]:
    """``(file, class name, methods)`` of every top-level class in ``tree``'s
    model files that defines the deepstack methods (the proofs and the GPU
    evidence exercise these)."""
    for pattern in MODEL_PATHS:
        for path in sorted(tree.glob(pattern)):
            raw = path.read_bytes()
            if not any(marker in raw for marker in MARKERS):
                continue
            module = ast.parse(raw, filename=str(path))
            for name, _cls, methods in deepstack_classes(module):
                if "." not in name:
                    yield path, name, methods


def deepstack_classes(
    tree: ast.Module,
) -> Iterator[tuple[str, ast.ClassDef, dict[str, FunctionNode]]]:
    """Every class that itself defines ``_get_deepstack_input_embeds``.

    Classes that inherit the method define nothing to fix and are skipped.
    Yields the qualified name, the class, and its methods by name.
    """
    # A file whose bytes never spell the counter's name keeps it in no class
    # (releases before 0.20.0): known without walking each class for it.
    source = parsed_from(tree)
    counter_absent = source is not None and COUNTER.encode() not in source
    for qualname, cls in iter_classes(tree):
        methods = {
            node.name: node
            for node in cls.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        if GET in methods:
            if counter_absent:
                _COUNTER_SEEN[cls] = False
            yield qualname, cls, methods


def token_parameter(function: FunctionNode) -> str | None:
    """The parameter after ``self``: the step's token count in ``_get_``."""
    names = parameter_names(function)
    return names[1] if len(names) > 1 else None


def has_counter(cls: ast.ClassDef) -> bool:
    """Whether the class keeps vllm#40145's token counter at all.

    A name spelled in a file only through escapes or split string literals
    escapes the byte search of :func:`deepstack_classes`: no release or fork
    does that, and the class would read not-applicable, which writes nothing.
    """
    # Both fixes ask this of the same class of one parse, and the answer
    # takes a walk of the whole class (thousands of nodes): walk it once.
    if cls not in _COUNTER_SEEN:
        _COUNTER_SEEN[cls] = any(_names_counter(node) for node in ast.walk(cls))
    return _COUNTER_SEEN[cls]


_COUNTER_SEEN: weakref.WeakKeyDictionary[ast.ClassDef, bool] = (
    weakref.WeakKeyDictionary()
)


def _names_counter(node: ast.AST) -> bool:
    match node:
        case ast.Attribute(attr=name) | ast.Constant(value=name) if name == COUNTER:
            return True
    return False


def _is_counter_read(node: ast.AST) -> bool:
    """``self.<counter>`` or ``getattr(self, "<counter>", ...)``."""
    match node:
        case ast.Attribute():
            return is_self_attribute(node, COUNTER)
        case ast.Call(
            func=ast.Name("getattr"),
            args=[ast.Name("self"), ast.Constant(value=name), *_],
        ):
            return name == COUNTER
    return False


def is_bounds_check(node: ast.AST, parameter: str | None) -> bool:
    """``if <parameter> > self.<counter>: raise ...`` (vllm#40145's check)."""
    match node:
        case ast.If(
            test=ast.Compare(left=ast.Name(name), ops=[ast.Gt()], comparators=[bound]),
            body=[ast.Raise()],
            orelse=[],
        ):
            return (
                parameter is not None and name == parameter and _is_counter_read(bound)
            )
    return False


def is_empty_counter_return(node: ast.AST) -> bool:
    """``if <counter> == 0: return None`` (or ``if not <counter>: ...``)."""
    match node:
        case ast.If(
            test=test,
            body=[ast.Return(value=None | ast.Constant(value=None))],
            orelse=[],
        ):
            return _is_empty_counter_test(test)
    return False


def _is_empty_counter_test(test: ast.AST) -> bool:
    match test:
        case ast.UnaryOp(op=ast.Not(), operand=counter):
            return _is_counter_read(counter)
        case ast.Compare(
            left=counter, ops=[ast.Eq()], comparators=[ast.Constant(value=0) as zero]
        ):
            return type(zero.value) is int and _is_counter_read(counter)
    return False


def is_buffer_size_test(test: ast.AST) -> str | None:
    """``<name> > self.deepstack_input_embeds[0].size(0)``: returns ``<name>``."""
    match test:
        case ast.Compare(left=ast.Name(name), ops=[ast.Gt()], comparators=[size]) if (
            matches_code(size, "self.{buffers}[0].size(0)", buffers=BUFFERS)
        ):
            return name
    return None


def calls_self_method(node: ast.AST, name: str) -> bool:
    """Whether ``self.<name>(...)`` is called anywhere inside ``node``."""
    return any(
        isinstance(call, ast.Call) and is_self_attribute(call.func, name)
        for call in ast.walk(node)
    )


def statement_ast(statement: libcst.CSTNode, module: libcst.Module) -> ast.stmt:
    """The CPython ast of one LibCST statement, so that the rewrite matches a
    statement with the very predicate the recogniser used."""
    import textwrap

    code = textwrap.dedent(module.code_for_node(statement))
    return ast.parse(code).body[0]

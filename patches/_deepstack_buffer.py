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

This module finds those classes by structure, matches the few statements both
patches care about, and builds the weight-less objects their proofs call.
"""

from __future__ import annotations
import __future__

import ast
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.syntax import (
    FunctionNode,
    is_self_attribute,
    iter_classes,
    parameter_names,
)
from deepstack_patch.proof import proving

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


def deepstack_classes(
    tree: ast.Module,
) -> Iterator[tuple[str, ast.ClassDef, dict[str, FunctionNode]]]:
    """Every class that itself defines ``_get_deepstack_input_embeds``.

    Classes that inherit the method define nothing to fix and are skipped.
    Yields the qualified name, the class, and its methods by name.
    """
    for qualname, cls in iter_classes(tree):
        methods = {
            node.name: node
            for node in cls.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        if GET in methods:
            yield qualname, cls, methods


def token_parameter(function: FunctionNode) -> str | None:
    """The parameter after ``self``: the step's token count in ``_get_``."""
    names = parameter_names(function)
    return names[1] if len(names) > 1 else None


def has_counter(cls: ast.ClassDef) -> bool:
    """Whether the class keeps vllm#40145's token counter at all."""
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and node.attr == COUNTER:
            return True
        if isinstance(node, ast.Constant) and node.value == COUNTER:
            return True
    return False


def _is_counter_read(node: ast.AST) -> bool:
    """``self.<counter>`` or ``getattr(self, "<counter>", ...)``."""
    if is_self_attribute(node, COUNTER):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "self"
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value == COUNTER
    )


def is_bounds_check(node: ast.AST, parameter: str | None) -> bool:
    """``if <parameter> > self.<counter>: raise ...`` (vllm#40145's check)."""
    if not isinstance(node, ast.If) or node.orelse or parameter is None:
        return False
    test = node.test
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == parameter
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Gt)
        and _is_counter_read(test.comparators[0])
        and len(node.body) == 1
        and isinstance(node.body[0], ast.Raise)
    )


def is_empty_counter_return(node: ast.AST) -> bool:
    """``if <counter> == 0: return None`` (or ``if not <counter>: ...``)."""
    if not isinstance(node, ast.If) or node.orelse or len(node.body) != 1:
        return False
    body = node.body[0]
    if not (
        isinstance(body, ast.Return)
        and (body.value is None or _is_constant(body.value, None))
    ):
        return False
    test = node.test
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _is_counter_read(test.operand)
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and _is_counter_read(test.left)
        and _is_constant(test.comparators[0], 0)
    )


def _is_constant(node: ast.AST, value: object) -> bool:
    return (
        isinstance(node, ast.Constant)
        and node.value == value
        and type(node.value) is type(value)
    )


def is_buffer_size_test(test: ast.AST) -> str | None:
    """``<name> > self.deepstack_input_embeds[0].size(0)``: returns ``<name>``."""
    if not (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Gt)
    ):
        return None
    size = test.comparators[0]
    expected = ast.dump(ast.parse(f"self.{BUFFERS}[0].size(0)", mode="eval").body)
    return test.left.id if ast.dump(size) == expected else None


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


# -- Proofs ----------------------------------------------------------------


def model_classes(tree: Path) -> list[tuple[str, type]]:
    """The tree's own classes that define the deepstack methods, by structure.

    Each is imported from the tree. A model module that cannot be imported in
    a CPU-only environment (an optional dependency outside the tree such as
    torchvision is missing, or no platform is detected) is not skipped: its
    class's deepstack methods are compiled from the tree's file, with the
    tree's ``IntermediateTensors``, so the code exercised is still the tree's.
    """
    found = []
    for pattern in MODEL_PATHS:
        for path in sorted(tree.glob(pattern)):
            raw = path.read_bytes()
            if not any(marker in raw for marker in MARKERS):
                continue
            module_ast = ast.parse(raw, filename=str(path))
            top_level = [
                (name, cls, methods)
                for name, cls, methods in deepstack_classes(module_ast)
                if "." not in name
            ]
            if not top_level:
                continue
            relpath = path.relative_to(tree).as_posix()
            module_name = proving.module_name(relpath)
            module = proving.import_from_tree(relpath)  # says so when it falls back
            if module is None:
                for name, _cls, methods in top_level:
                    found.append(
                        (f"{module_name}.{name}", _compile_methods(path, name, methods))
                    )
                continue
            for name, _cls, _methods in top_level:
                found.append((f"{module_name}.{name}", getattr(module, name)))
    if not found:
        raise AssertionError(
            f"no model class in {tree} defines {GET}: nothing to prove"
        )
    return found


def _compile_methods(path: Path, name: str, methods: dict[str, FunctionNode]) -> type:
    """A bare class holding only the deepstack methods of ``name`` in ``path``.

    The nodes keep their line numbers, so a traceback points into the file.
    """
    import torch
    from vllm.sequence import IntermediateTensors

    wanted = [methods[n] for n in (GET, RESIZE, SET, CLEAR) if n in methods]
    cls = ast.ClassDef(
        name=name,
        bases=[],
        keywords=[],
        body=wanted,
        decorator_list=[],
        type_params=[],
    )
    cls.lineno = min(m.lineno for m in wanted)
    cls.end_lineno = max(m.end_lineno or m.lineno for m in wanted)
    cls.col_offset = cls.end_col_offset = 0
    module = ast.Module(body=[cls], type_ignores=[])
    ast.fix_missing_locations(module)
    # Annotations stay strings, so names the methods only annotate with need
    # not exist here.
    flags = __future__.annotations.compiler_flag
    code = compile(module, str(path), "exec", flags=flags, dont_inherit=True)
    namespace: dict[str, Any] = {
        "torch": torch,
        "IntermediateTensors": IntermediateTensors,
    }
    exec(code, namespace)
    return namespace[name]


def bare_model(cls: type, *, rows: int, hidden: int, levels: int, dtype: Any) -> Any:
    """A weight-less instance with just the state the deepstack methods use."""
    import torch

    model = object.__new__(cls)
    model.config = types.SimpleNamespace(
        text_config=types.SimpleNamespace(hidden_size=hidden)
    )
    model.deepstack_num_level = levels
    model.deepstack_input_embeds = [
        torch.zeros(rows, hidden, dtype=dtype) for _ in range(levels)
    ]
    model.deepstack_input_embeds_num_tokens = 0
    model.use_deepstack = True
    return model

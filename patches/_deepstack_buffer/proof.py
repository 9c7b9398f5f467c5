"""Proof helpers for vllm#40932 and vllm#43617: the tree's deepstack classes."""

from __future__ import annotations
import __future__

import ast
import types
from pathlib import Path
from typing import Any

from deepstack_patch.engine.syntax import FunctionNode
from deepstack_patch.proof import proving

from . import CLEAR, GET, RESIZE, SET, tree_deepstack_classes


def model_classes(tree: Path) -> list[tuple[str, type]]:
    """The tree's own classes that define the deepstack methods, by structure.

    Each is imported from the tree. A model module that cannot be imported in
    a CPU-only environment (an optional dependency outside the tree such as
    torchvision is missing, or no platform is detected) is not skipped: its
    class's deepstack methods are compiled from the tree's file, with the
    tree's ``IntermediateTensors``, so the code exercised is still the tree's.
    """
    found = []
    modules: dict[Path, Any] = {}
    for path, name, methods in tree_deepstack_classes(tree):
        relpath = path.relative_to(tree).as_posix()
        module_name = proving.module_name(relpath)
        if path not in modules:  # says so when it falls back
            modules[path] = proving.import_from_tree(relpath)
        module = modules[path]
        if module is None:
            found.append(
                (f"{module_name}.{name}", _compile_methods(path, name, methods))
            )
        else:
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

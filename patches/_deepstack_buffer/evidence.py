"""Evidence helpers for vllm#40932 and vllm#43617: the tree's deepstack methods,
compiled from its files, on a weight-less model whose buffers are on a device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepstack_patch.proof.measure import IntermediateTensors, compile_functions

from . import CLEAR, GET, RESIZE, SET, tree_deepstack_classes
from .proof import bare_model

#: The model the bugs were reported on; its class is measured first.
REPORTED_FILE = "qwen3_vl.py"


def deepstack_class(tree: Path) -> tuple[str, type]:
    """The tree's Qwen3-VL class with its deepstack methods, compiled from source.

    Measured on the class the bugs were reported on (Qwen3-VL); its copies
    (the Omni thinker) share the methods' code.
    """
    import torch

    found = [
        (path.name != REPORTED_FILE, path, name, methods)
        for path, name, methods in tree_deepstack_classes(tree)
    ]
    if not found:
        raise LookupError(f"no model class in {tree} defines {GET}")
    _, path, name, methods = min(found, key=lambda f: (f[0], str(f[1]), f[2]))
    namespace: dict[str, Any] = {
        "torch": torch,
        "IntermediateTensors": IntermediateTensors,
    }
    wanted = {n: f"{name}.{n}" for n in (GET, RESIZE, SET, CLEAR) if n in methods}
    compiled = compile_functions(path, wanted, namespace)
    cls = type(name, (), compiled)
    relpath = path.relative_to(tree).as_posix()
    return f"{relpath}:{name}", cls


def model_on(cls: type, device: str, **sizes: Any) -> Any:
    """A weight-less instance (``proof.bare_model``) with buffers on ``device``."""
    model = bare_model(cls, **sizes)
    model.deepstack_input_embeds = [
        buffer.to(device) for buffer in model.deepstack_input_embeds
    ]
    return model

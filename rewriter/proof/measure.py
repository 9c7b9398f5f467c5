"""Helpers for a patch's ``evidence.py``: time the tree's own code on a device.

Evidence runs where vLLM cannot be imported (a GPU machine with CUDA PyTorch
and nothing else, or a folder holding only the files the measurements read),
so everything here needs torch alone, and the tree's functions are compiled
from its source files (:func:`compile_functions`), never imported.

A measurement is a dict (see :func:`measurement`): what was run, whether the
symptom's mechanism showed (``symptom``), the mechanism in words, and the
figures, timings as :func:`timing` summarises them.
"""

from __future__ import annotations
import __future__

import ast
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class IntermediateTensors:
    """vLLM's ``IntermediateTensors`` as the deepstack code uses it: a dict of
    named tensors. The tree's own class imports half of vLLM."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.tensors[key] = value

    def __len__(self) -> int:
        return len(self.tensors)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timing(samples_s: Iterable[float], warmup: int) -> dict[str, Any]:
    """Milliseconds: median, min, max of the samples taken after ``warmup``."""
    ms = [s * 1000 for s in samples_s]
    return {
        "median_ms": round(statistics.median(ms), 3),
        "min_ms": round(min(ms), 3),
        "max_ms": round(max(ms), 3),
        "repetitions": len(ms),
        "warmup": warmup,
    }


def time_calls(
    call: Callable[[], Any], device: str, repetitions: int, warmup: int
) -> dict[str, Any]:
    """Time ``call`` ``repetitions`` times after ``warmup`` untimed calls."""
    for _ in range(warmup):
        call()
    synchronize(device)
    samples = []
    for _ in range(repetitions):
        started = time.perf_counter()
        call()
        synchronize(device)
        samples.append(time.perf_counter() - started)
    return timing(samples, warmup)


def timed(call: Callable[[], Any], device: str) -> tuple[Any, float]:
    """One call's result and wall time in seconds (device work included)."""
    synchronize(device)
    started = time.perf_counter()
    result = call()
    synchronize(device)
    return result, time.perf_counter() - started


def compile_functions(
    path: Path,
    wanted: dict[str, str],
    namespace: dict[str, Any],
    *,
    keep_decorators: bool = False,
) -> dict[str, Any]:
    """Functions and classes of the tree's file ``path``, compiled from source.

    ``wanted`` maps a name to define in ``namespace`` to a qualified name in
    the file (``Class.method``, ``function``, or ``Class`` for a whole class).
    Methods come out as plain functions, ``self`` first. Line numbers are
    kept, so a traceback points into the tree's file. Annotations stay
    strings, so names used only in annotations need not exist.
    """
    module = ast.parse(path.read_bytes(), filename=str(path))
    flags = __future__.annotations.compiler_flag
    for local, qualname in wanted.items():
        node = _definition(module, qualname)
        if not keep_decorators and not isinstance(node, ast.ClassDef):
            node.decorator_list = []
        code = compile(
            ast.Module(body=[node], type_ignores=[]),
            str(path),
            "exec",
            flags=flags,
            dont_inherit=True,
        )
        exec(code, namespace)
        namespace[local] = namespace[node.name]
    return {local: namespace[local] for local in wanted}


def _definition(module: ast.Module, qualname: str) -> Any:
    scope: list[ast.stmt] = module.body
    *owners, name = qualname.split(".")
    for owner in owners:
        scope = next(
            node.body
            for node in scope
            if isinstance(node, ast.ClassDef) and node.name == owner
        )
    for node in scope:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == name
        ):
            return node
    raise LookupError(f"{qualname} is not defined in {module}")


def measurement(
    what: str,
    symptom: bool,
    mechanism: str,
    figures: dict[str, Any],
    notes: Iterable[str] = (),
) -> dict[str, Any]:
    """One side's measurement, as evidence reports it."""
    return {
        "what": what,
        "symptom": symptom,
        "mechanism": mechanism,
        "figures": figures,
        "notes": list(notes),
    }

"""Helpers for a patch's ``prove(tree)``: find the tree's own code and call it.

A proof runs in the process `deepstack-patch verify` starts, whose
``sys.path`` begins with the tree, so ``import vllm`` is the tree's. Model
modules often import optional dependencies from outside the tree
(torchvision, mistral_common) that a CPU proof environment does not carry;
for those, :func:`function_from_tree` compiles the one function the proof
needs from the tree's own file, so the code exercised is still the tree's.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from deepstack_patch.engine.protocol import Finding, Patch, PatchState
from deepstack_patch.engine.source import SourceFile
from deepstack_patch.engine.tree import VllmTree


def proof_targets(tree: Path, patch: Patch) -> list[tuple[str, Finding]]:
    """Where ``patch`` recognises its target in ``tree`` (needed or applied).

    Proofs locate the code by the patch's own recogniser rather than by a
    hard-coded path, so they follow the code wherever a release moved it.
    """
    found = []
    vllm_tree = VllmTree.open(tree)
    for relpath in vllm_tree.glob(patch.paths):
        raw = (tree / relpath).read_bytes()
        if not any(marker in raw for marker in patch.markers):
            continue
        for finding in patch.recognise(SourceFile(relpath, raw).ast, relpath):
            if finding.state in (PatchState.NEEDED, PatchState.APPLIED):
                found.append((relpath, finding))
    if not found:
        raise AssertionError(
            f"{patch.id}: no target ({', '.join(patch.parts.values())}) found in "
            f"{tree}: nothing to prove"
        )
    return found


def module_name(relpath: str) -> str:
    """``vllm/a/b.py`` -> ``vllm.a.b``."""
    return ".".join(Path(relpath).with_suffix("").parts)


def import_from_tree(relpath: str) -> ModuleType | None:
    """The tree's module at ``relpath``, or None when it cannot import here.

    The reason is printed to stderr (verify shows it with the proof), so a
    fallback to :func:`function_from_tree` is never silent.
    """
    import logging
    import warnings

    name = module_name(relpath)
    # What libraries log once per process on import (transformers: "requires
    # torchvision, falling back ...") lands in whichever process imports
    # them first: a job, or verify's fork server when it preloads them. Kept
    # out, a proof's output is the same either way.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception as exc:  # any import failure means: fall back
        print(
            f"note: {name} does not import here ({type(exc).__name__}: {exc}); "
            "the proof compiles the function it needs from the tree's source",
            file=sys.stderr,
        )
        return None
    finally:
        logging.disable(previous)


def function_from_tree(
    tree: Path, relpath: str, qualname: str, namespace: dict[str, Any]
) -> Any:
    """Compile the function ``qualname`` (``Class.method``) from the tree's file.

    Its globals are ``namespace``: give it every global name the function
    reads. Line numbers are kept, so a traceback points into the tree's file.
    """
    path = tree / relpath
    module = ast.parse(path.read_bytes(), filename=str(path))
    *owners, name = qualname.split(".")
    scope: list[ast.stmt] = module.body
    for owner in owners:
        scope = next(
            node.body
            for node in scope
            if isinstance(node, ast.ClassDef) and node.name == owner
        )
    function = next(
        node
        for node in scope
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name == name
    )
    function.decorator_list = []
    # Annotations stay strings, so names used only in annotations need not exist.
    code = compile(
        ast.Module(body=[function], type_ignores=[]),
        str(path),
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    exec(code, namespace)
    return namespace[name]

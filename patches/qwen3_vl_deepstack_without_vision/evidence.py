"""The evidence of vllm#49397: startup on the device with image and video off.

vLLM builds the model under the target device (``with torch.device(...)``)
and, with ``--limit-mm-per-prompt`` 0 for image and video, builds the vision
tower's block under ``torch.device("meta")`` (``_mark_tower_model``). This
measurement does the same with the tree's own code compiled from its files:
the model class's ``__init__`` and deepstack methods (``qwen3_vl.py``), the
tower and language-model contexts (``interfaces.py``) and the helpers they
import (``utils.py``: ``no_init_weights``, ``collect_children``,
``StageMissingLayer``). Towers and the language model are stand-ins with one
weight; the multimodal config is a stand-in with the limits. Then the first
step's deepstack path runs on the device: ``_get_deepstack_input_embeds``
and the decoder's add of each level to the hidden states. A buffer built on
the meta device raises ``Tensor on device meta is not on the expected device
...`` there: on a GPU, the engine dies at startup (vllm#49384).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import sys
import types
from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.proof.measure import (
    IntermediateTensors,
    compile_functions,
    measurement,
    timed,
)

from .._deepstack_buffer import BUFFERS
from .proof import (
    LANGUAGE_CONTEXT,
    TOWER_CONTEXT,
    VISION,
    BufferBuilder,
    _global_names,
    _kept_body,
    _no_op_methods,
    _stand_ins,
    buffer_builders,
    compile_class,
    tiny_vllm_config,
)

#: The model vllm#49384 was reported on: its class is measured.
REPORTED_FILE = "qwen3_vl.py"
BUFFER_ROWS = 8192
#: Per device: hidden size; rows of the first step.
SIZES = {"cpu": (256, 16), "cuda": (2048, 16)}
PACKAGE = "_deepstack_evidence_models"
#: What this measurement reads besides the files the patch recognises: the
#: tower contexts and the helpers they import (``bench/gpu_evidence.py``
#: carries them to a GPU machine).
EXTRA_FILES = (
    "vllm/model_executor/models/interfaces.py",
    "vllm/model_executor/models/utils.py",
)


def measure(tree: Path, patch: Patch, device: str) -> dict[str, Any]:
    import torch

    hidden, rows = SIZES["cuda" if "cuda" in device else "cpu"]
    builders = buffer_builders(tree)
    builder = next(
        (b for b in builders if Path(b.relpath).name == REPORTED_FILE), None
    ) or (builders[0] if builders else None)
    if builder is None:
        raise LookupError(f"no model class in {tree} builds {BUFFERS}")
    cls = _tree_class(tree, builder)
    limits = {m: 0 if m in VISION else 1 for m in builder.modalities}
    with _no_op_methods(cls), torch.device(device):
        model, seconds = timed(
            lambda: cls(vllm_config=_vllm_config(limits, hidden)), device
        )
    buffers = getattr(model, BUFFERS, [])
    devices = sorted({str(b.device) for b in buffers})
    error = ""
    try:
        levels = model._get_deepstack_input_embeds(rows)
        hidden_states = torch.zeros(rows, hidden, device=device)
        for tensor in (levels.tensors if levels is not None else {}).values():
            hidden_states = hidden_states + tensor
        float(hidden_states.sum())
    except RuntimeError as exc:
        error = str(exc)
    symptom = bool(error)
    where = "inside" if builder.inside_tower else "after"
    return measurement(
        what=(
            f"{builder.qualname}.__init__ under torch.device({device!r}) with "
            f"limits {limits}, then the first step's deepstack path "
            f"({rows} tokens, hidden {hidden}, buffers of {BUFFER_ROWS} rows)"
        ),
        symptom=symptom,
        mechanism=(
            f"buffers built {where} the {TOWER_CONTEXT} block, on "
            f"{', '.join(devices) or 'no device'}; "
            + (f"the step raised: {error}" if symptom else "the step ran")
        ),
        figures={
            "error": error,
            "buffer_devices": devices,
            "startup_ms": round(seconds * 1000, 3),
        },
    )


def _vllm_config(limits: dict[str, int], hidden: int) -> Any:
    """The proof's tiny ``VllmConfig``, with a multimodal config that answers
    the limits without importing vLLM."""
    multimodal = types.SimpleNamespace(
        get_limit_per_prompt=lambda modality: limits.get(modality, 1),
        mm_encoder_tp_mode="weights",
        mm_encoder_only=False,
        video_pruning_rate=None,
        is_multimodal_pruning_enabled=lambda: False,
    )
    return tiny_vllm_config(limits, hidden, multimodal, rows=BUFFER_ROWS)


def _tree_class(tree: Path, builder: BufferBuilder) -> type:
    """The builder's class, compiled from the tree with the tree's contexts."""
    import torch

    models = (tree / builder.relpath).parent
    mixin = _contexts_mixin(models)
    path = tree / builder.relpath
    # The stand-ins for what __init__ constructs; builtins it calls there
    # (getattr) stay builtins.
    stand_ins = {
        name: value
        for name, value in _stand_ins(builder).items()
        if not hasattr(builtins, name)
    }
    namespace: dict[str, Any] = {
        **stand_ins,
        "torch": torch,
        "nn": torch.nn,
        "IntermediateTensors": IntermediateTensors,
        "maybe_prefix": lambda prefix, name: f"{prefix}.{name}" if prefix else name,
        "__proof_bases__": (torch.nn.Module, mixin),
        "__name__": f"{PACKAGE}.{Path(builder.relpath).stem}",
    }
    kept = _kept_body(builder.node)
    # Other globals __init__ reads that the tree's model folder defines
    # (StageMissingLayer from utils.py): compiled from there.
    module_ast = ast.parse(path.read_bytes(), filename=str(path))
    for name in sorted(_global_names(kept) - namespace.keys()):
        source = _imported_from(tree, models, module_ast, name)
        if source is not None:
            target = _context_namespace(torch)
            compile_functions(source, {name: name}, target)
            namespace[name] = target[name]
    return compile_class(builder, kept, path, namespace)


def _imported_from(
    tree: Path, models: Path, module: ast.Module, name: str
) -> Path | None:
    """The tree's file in the model folder a top-level import takes ``name``
    from (``from .utils import X``, ``from vllm.model_executor.models.utils
    import X``), where that file defines it at top level."""
    for node in module.body:
        match node:
            case ast.ImportFrom(module=str(source), names=aliases, level=level) if any(
                (a.asname or a.name) == name for a in aliases
            ):
                base = models if level == 1 else tree
                path = base / (source.replace(".", "/") + ".py")
                if path.parent == models and path.exists() and _defines(path, name):
                    return path
    return None


def _defines(path: Path, name: str) -> bool:
    return any(
        getattr(node, "name", None) == name
        for node in ast.parse(path.read_bytes()).body
    )


def _contexts_mixin(models: Path) -> type:
    """A class holding the tree's ``_mark_tower_model`` and
    ``_mark_language_model``, with the modules their relative imports name
    compiled from the tree's files into a package of ours."""
    import torch

    for path in sorted(models.glob("*.py")):
        raw = path.read_bytes()
        if f"def {TOWER_CONTEXT}".encode() not in raw:
            continue
        module = ast.parse(raw, filename=str(path))
        for node in module.body:
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
            if TOWER_CONTEXT not in methods:
                continue
            wanted = [m for m in (TOWER_CONTEXT, LANGUAGE_CONTEXT) if m in methods]
            _install_relative_imports(models, [methods[m] for m in wanted])
            namespace = _context_namespace(torch)
            namespace["__name__"] = f"{PACKAGE}.{path.stem}"
            namespace["__package__"] = PACKAGE
            compiled = compile_functions(
                path,
                {m: f"{node.name}.{m}" for m in wanted},
                namespace,
                keep_decorators=True,
            )
            return type(f"{node.name}Contexts", (), compiled)
    raise LookupError(f"no class in {models} defines {TOWER_CONTEXT}")


def _context_namespace(torch: Any) -> dict[str, Any]:
    from torch.nn.modules.module import register_module_module_registration_hook

    return {
        "torch": torch,
        "nn": torch.nn,
        "contextmanager": contextlib.contextmanager,
        "nullcontext": contextlib.nullcontext,
        "ExitStack": contextlib.ExitStack,
        "register_module_module_registration_hook": (
            register_module_module_registration_hook
        ),
    }


def _install_relative_imports(models: Path, functions: list[ast.FunctionDef]) -> None:
    """``from .utils import a, b`` inside the functions: ``a`` and ``b``
    compiled from ``utils.py`` into ``_deepstack_evidence_models.utils``."""
    import torch

    package = sys.modules.setdefault(PACKAGE, types.ModuleType(PACKAGE))
    package.__path__ = []
    for function in functions:
        for node in ast.walk(function):
            match node:
                case ast.ImportFrom(module=str(name), names=aliases, level=1):
                    target = types.ModuleType(f"{PACKAGE}.{name}")
                    target.__dict__.update(_context_namespace(torch))
                    compile_functions(
                        models / f"{name}.py",
                        {a.name: a.name for a in aliases},
                        target.__dict__,
                        keep_decorators=True,
                    )
                    sys.modules[target.__name__] = target

"""The proof of vllm#49397: image and video off, no meta tensor reaches the decoder.

Each class whose ``__init__`` builds the deepstack buffers next to its vision
tower is constructed through that real ``__init__`` and the tree's own
``_mark_tower_model``, with a tiny config and image and video limits 0 (every
other tower, such as Qwen3-Omni's audio, on). The towers, the language model,
the pipeline group and the tokenizer are stand-ins: the bug is in where the
buffers are built, not in those. Then one dummy step runs the deepstack path
the decoder runs: ``_get_deepstack_input_embeds`` and the add of each level to
the hidden states. A buffer built on the meta device makes that add raise
``Tensor on device meta is not on the expected device cpu!``, the CPU form of
vllm#49384. With vision on, a stored payload must still reach the decoder.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch.engine.syntax import is_self_attribute
from deepstack_patch.proof import proving

from .._deepstack_buffer import BUFFERS, CLEAR, GET, MODEL_PATHS, RESIZE, SET

TOWER_CONTEXT = "_mark_tower_model"
LANGUAGE_CONTEXT = "_mark_language_model"
VISION = ("image", "video")
MARKERS = (BUFFERS.encode(), TOWER_CONTEXT.encode())

#: What ``__init__`` calls for what is not under test: the pipeline group (no
#: distributed state here), the tokenizer (no files), and the MoE bookkeeping
#: that walks the real language model's layers.
STAND_IN_GLOBALS = ("get_pp_group", "cached_tokenizer_from_config")
STAND_IN_METHODS = ("set_moe_parameters",)

#: The tiny model: hidden size, deepstack levels, buffer rows, rows of a step.
HIDDEN = 8
LEVELS = 2
BUFFER_ROWS = 16
STEP_ROWS = 5

CRASH = "vllm#49384"


class ProofCannotRun(RuntimeError):
    """The tree's class cannot be built here: the proof cannot judge."""


@dataclass(frozen=True)
class BufferBuilder:
    """A class whose ``__init__`` builds the deepstack buffers by its towers."""

    relpath: str
    name: str
    node: ast.ClassDef
    #: Every modality its tower contexts name (``image``, ``video``, ``audio``).
    modalities: tuple[str, ...]
    #: Global names called to build a tower or the language model.
    constructors: tuple[str, ...]
    #: True where the buffers are built inside the tower block (the bug).
    inside_tower: bool

    @property
    def qualname(self) -> str:
        return f"{proving.module_name(self.relpath)}.{self.name}"


def _context_name(item: ast.withitem) -> str | None:
    match item.context_expr:
        case ast.Call(func=ast.Attribute(value=ast.Name(id="self"), attr=name)) if (
            name in (TOWER_CONTEXT, LANGUAGE_CONTEXT)
        ):
            return name
    return None


def _modalities(item: ast.withitem) -> list[str]:
    match item.context_expr:
        case ast.Call(args=[_, ast.Constant(value=str(one))]):
            return [one]
        case ast.Call(args=[_, ast.Set(elts=elements) | ast.Tuple(elts=elements)]):
            return [e.value for e in elements if isinstance(e, ast.Constant)]
    return []


def _assigns_buffers(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Assign)
        and any(is_self_attribute(t, BUFFERS) for t in n.targets)
        for n in ast.walk(node)
    )


def _constructors(block: ast.With) -> set[str]:
    """The global names called in ``self.x = ...`` expressions of a context."""
    names = set()
    for node in ast.walk(block):
        match node:
            case ast.Assign(
                targets=[ast.Attribute(value=ast.Name(id="self"))],
                value=ast.Call() as value,
            ):
                names |= {
                    call.func.id
                    for call in ast.walk(value)
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                }
    return names


def buffer_builder(relpath: str, cls: ast.ClassDef) -> BufferBuilder | None:
    """``cls`` if its ``__init__`` builds the buffers in or after a tower block."""
    init = next(
        (
            n
            for n in cls.body
            if isinstance(n, ast.FunctionDef) and n.name == "__init__"
        ),
        None,
    )
    if init is None:
        return None
    modalities: list[str] = []
    constructors: set[str] = set()
    inside = after = False
    for statement in init.body:
        contexts = (
            [_context_name(item) for item in statement.items]
            if isinstance(statement, ast.With)
            else []
        )
        if TOWER_CONTEXT in contexts:
            assert isinstance(statement, ast.With)
            modalities += [m for item in statement.items for m in _modalities(item)]
            inside = inside or _assigns_buffers(statement)
        elif modalities and _assigns_buffers(statement):
            after = True
        if contexts and isinstance(statement, ast.With):
            constructors |= _constructors(statement)
    if not (inside or after):
        return None
    return BufferBuilder(
        relpath,
        cls.name,
        cls,
        tuple(dict.fromkeys(modalities)),
        tuple(sorted(constructors)),
        inside,
    )


def buffer_builders(tree: Path) -> list[BufferBuilder]:
    """Every top-level class in the tree's model files that builds the buffers."""
    found = []
    for pattern in MODEL_PATHS:
        for path in sorted(tree.glob(pattern)):
            raw = path.read_bytes()
            if not all(marker in raw for marker in MARKERS):
                continue
            relpath = path.relative_to(tree).as_posix()
            module = ast.parse(raw, filename=str(path))
            for node in module.body:
                if isinstance(node, ast.ClassDef):
                    builder = buffer_builder(relpath, node)
                    if builder is not None:
                        found.append(builder)
    return found


# -- building the tree's classes ------------------------------------------------


def _stand_in_module() -> type:
    import torch

    class StandIn(torch.nn.Module):
        """A tower or language model that is not under test: one tiny weight."""

        packed_modules_mapping: dict[str, list[str]] = {}

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.make_empty_intermediate_tensors = None
            self.start_layer = 0

    return StandIn


def _stand_ins(builder: BufferBuilder) -> dict[str, Any]:
    stand_in = _stand_in_module()
    names: dict[str, Any] = dict.fromkeys(builder.constructors, stand_in)
    names["get_pp_group"] = lambda: types.SimpleNamespace(
        is_first_rank=True, is_last_rank=True, world_size=1, rank_in_group=0
    )
    names["cached_tokenizer_from_config"] = lambda *args, **kwargs: None
    return names


@contextlib.contextmanager
def _patched(namespace: dict[str, Any], names: dict[str, Any]) -> Iterator[None]:
    """``names`` in ``namespace`` for the duration; what was there after."""
    missing = object()
    saved = {name: namespace.get(name, missing) for name in names}
    namespace.update(names)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


@contextlib.contextmanager
def _no_op_methods(cls: type) -> Iterator[None]:
    """The setup methods ``STAND_IN_METHODS`` do nothing for the duration."""
    missing = object()
    saved = {name: cls.__dict__.get(name, missing) for name in STAND_IN_METHODS}
    for name in STAND_IN_METHODS:
        setattr(cls, name, lambda self: None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(cls, name)
            else:
                setattr(cls, name, value)


def tiny_vllm_config(
    limits: dict[str, int],
    hidden: int = HIDDEN,
    multimodal: Any = None,
    rows: int = BUFFER_ROWS,
) -> Any:
    """The parts of a ``VllmConfig`` these ``__init__``s read, tiny.

    The multimodal config is the tree's own unless ``multimodal`` stands in
    for it (the GPU evidence runs without importing vLLM), so
    ``_mark_tower_model`` asks the tree's ``get_limit_per_prompt``; the rest
    are plain namespaces.
    """
    if multimodal is None:
        from vllm.config.multimodal import MultiModalConfig

        multimodal = MultiModalConfig(limit_per_prompt=dict(limits))
    vision = types.SimpleNamespace(
        deepstack_visual_indexes=list(range(LEVELS)),
        out_hidden_size=hidden,
        hidden_size=hidden,
    )
    text = types.SimpleNamespace(hidden_size=hidden, rms_norm_eps=1e-6)
    audio = types.SimpleNamespace(d_model=hidden)
    # One object serves Qwen3-VL (config.vision_config) and the Omni thinker
    # (hf_config.thinker_config.vision_config).
    hf_config = types.SimpleNamespace(
        vision_config=vision,
        text_config=text,
        audio_config=audio,
        rms_norm_eps=1e-6,
        # The Omni thinker copies it for its language model from 0.29.0 on.
        architectures=["TinyDeepstackModel"],
    )
    hf_config.thinker_config = hf_config
    model_config = types.SimpleNamespace(
        hf_config=hf_config,
        multimodal_config=multimodal,
        get_multimodal_config=lambda: multimodal,
        max_model_len=rows,
    )
    vllm_config = types.SimpleNamespace(
        model_config=model_config,
        quant_config=None,
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=rows),
        use_v2_model_runner=False,
    )
    vllm_config.with_hf_config = lambda *args, **kwargs: vllm_config
    return vllm_config


class TreeClasses:
    """The builders' classes from the tree: imported, or compiled from source.

    A model module that cannot be imported here (transformers' Qwen2-VL image
    processor needs torchvision, which the CPU proof environment lacks) is
    not skipped: the class is compiled from the tree's file with its
    ``__init__``, its deepstack methods and its literal class attributes, on
    the bases the module imports (the tree's ``SupportsMultiModal`` brings
    ``_mark_tower_model``), its globals resolved through the module's own
    imports. The code exercised is still the tree's.
    """

    def __init__(self, tree: Path, builders: list[BufferBuilder]) -> None:
        self.tree = tree
        self.builders = {(b.relpath, b.name): b for b in builders}
        self.classes: dict[tuple[str, str], tuple[type, dict[str, Any]]] = {}

    def get(self, builder: BufferBuilder) -> tuple[type, dict[str, Any]]:
        """The class and the namespace its ``__init__`` reads globals from."""
        key = (builder.relpath, builder.name)
        if key not in self.classes:
            module = proving.import_from_tree(builder.relpath)  # says so on failure
            if module is not None:
                cls = getattr(module, builder.name)
                self.classes[key] = (cls, module.__dict__)
            else:
                self.classes[key] = self._compile(builder)
        return self.classes[key]

    def _compile(self, builder: BufferBuilder) -> tuple[type, dict[str, Any]]:
        import torch

        path = self.tree / builder.relpath
        module_ast = ast.parse(path.read_bytes(), filename=str(path))
        imports = _imported_names(module_ast, proving.module_name(builder.relpath))
        kept = _kept_body(builder.node)
        wanted = _global_names(kept) | _global_names(builder.node.bases)
        namespace: dict[str, Any] = {"__name__": proving.module_name(builder.relpath)}
        stand_ins = _stand_ins(builder)
        for name in sorted(wanted):
            if name in stand_ins or hasattr(builtins, name):
                continue
            value = self._resolve(name, imports)
            if value is not None:
                namespace[name] = value
        imported = [
            base
            for node in builder.node.bases
            if (base := _evaluated(node, namespace)) is not None
        ]
        # Only the bases __init__ needs: the module, the tree's class that
        # defines the tower context, and another builder it inherits from.
        # The other interfaces check class attributes this copy leaves out.
        compiled = {cls for cls, _namespace in self.classes.values()}
        bases = [
            b
            for b in imported
            if b is torch.nn.Module or TOWER_CONTEXT in vars(b) or b in compiled
        ]
        if not any(hasattr(b, TOWER_CONTEXT) for b in bases):
            raise ProofCannotRun(
                f"{builder.qualname}: none of its bases that import here "
                f"({', '.join(b.__name__ for b in imported) or 'none'}) defines "
                f"{TOWER_CONTEXT}; cannot build the class without its module"
            )
        namespace["__proof_bases__"] = tuple(bases)
        return compile_class(builder, kept, path, namespace), namespace

    def _resolve(self, name: str, imports: dict[str, tuple[str, str]]) -> Any:
        """A global ``name`` of the module: another builder's class, or imported."""
        if name in imports:
            source_module, attribute = imports[name]
            relpath = source_module.replace(".", "/") + ".py"
            if (relpath, attribute) in self.builders:
                return self.get(self.builders[(relpath, attribute)])[0]
            try:
                imported = importlib.import_module(source_module)
            except ImportError as exc:
                if attribute == "":
                    raise ProofCannotRun(
                        f"cannot import {source_module}: {exc}"
                    ) from exc
                print(
                    f"note: {name} (from {source_module}) does not import here "
                    f"({type(exc).__name__}: {exc}); left out",
                    file=sys.stderr,
                )
                return None
            return imported if attribute == "" else getattr(imported, attribute, None)
        # Defined in the module itself (a helper class such as a mixin): left
        # out; what __init__ needs from it is stood in for.
        return None


def compile_class(
    builder: BufferBuilder, kept: list[ast.stmt], path: Path, namespace: dict[str, Any]
) -> type:
    """The builder's class with only ``kept`` as its body, compiled from the
    tree's file (tracebacks point into it) over ``namespace``, whose
    ``__proof_bases__`` are its bases."""
    cls_node = ast.ClassDef(
        name=builder.name,
        bases=[ast.Starred(ast.Name("__proof_bases__", ast.Load()), ast.Load())],
        keywords=[],
        body=kept,
        decorator_list=[],
        type_params=[],
    )
    ast.copy_location(cls_node, builder.node)
    module = ast.Module(body=[cls_node], type_ignores=[])
    ast.fix_missing_locations(module)
    flags = __future__.annotations.compiler_flag
    exec(compile(module, str(path), "exec", flags=flags, dont_inherit=True), namespace)
    return namespace[builder.name]


def _evaluated(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """A base class written ``Name`` or ``module.Name`` (``nn.Module``)."""
    match node:
        case ast.Name(id=name):
            return namespace.get(name)
        case ast.Attribute(value=value, attr=attribute):
            owner = _evaluated(value, namespace)
            return getattr(owner, attribute, None) if owner is not None else None
    return None


def _kept_body(cls: ast.ClassDef) -> list[ast.stmt]:
    """What a compiled class keeps: ``__init__``, the deepstack methods, the
    methods they call on ``self`` that the class defines, literal attributes."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    wanted = {"__init__", GET, RESIZE, SET, CLEAR} & methods.keys()
    pending = list(wanted)
    while pending:
        for node in ast.walk(methods[pending.pop()]):
            match node:
                case ast.Call(
                    func=ast.Attribute(value=ast.Name(id="self"), attr=name)
                ) if name in methods and name not in wanted:
                    wanted.add(name)
                    pending.append(name)
    return [
        n for n in cls.body if _literal_attribute(n) or n in map(methods.get, wanted)
    ]


def _literal_attribute(node: ast.stmt) -> bool:
    match node:
        case ast.Assign(value=value) | ast.AnnAssign(value=value) if value is not None:
            try:
                ast.literal_eval(value)
            except ValueError:
                return False
            return True
    return False


def _global_names(nodes: list[Any]) -> set[str]:
    return {
        n.id
        for node in nodes
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }


def _imported_names(module: ast.Module, module_name: str) -> dict[str, tuple[str, str]]:
    """Top-level imports: local name -> (module, attribute or "" for a module)."""
    package = module_name.rpartition(".")[0]
    names = {}
    for node in module.body:
        match node:
            case ast.Import(names=aliases):
                for alias in aliases:
                    local = alias.asname or alias.name.partition(".")[0]
                    target = alias.name if alias.asname else local
                    names[local] = (target, "")
            case ast.ImportFrom(module=source, names=aliases, level=level):
                base = (
                    importlib.util.resolve_name("." * level + (source or ""), package)
                    if level
                    else source
                )
                for alias in aliases:
                    names[alias.asname or alias.name] = (base or "", alias.name)
    return names


# -- the dummy step ---------------------------------------------------------------


def build_model(
    classes: TreeClasses, builder: BufferBuilder, limits: dict[str, int]
) -> Any:
    """The tree's class through its real ``__init__``; the rest stood in."""
    cls, namespace = classes.get(builder)
    vllm_config = tiny_vllm_config(limits)
    with _patched(namespace, _stand_ins(builder)), _no_op_methods(cls):
        return cls(vllm_config=vllm_config)


def deepstack_step(model: Any, rows: int) -> Any:
    """What the decoder does with the deepstack of one step: hidden states out.

    ``None`` when ``_get_`` hands the decoder no deepstack levels.
    """
    import torch

    levels = model._get_deepstack_input_embeds(rows)
    if levels is None:
        return None
    hidden_states = torch.zeros(rows, HIDDEN)
    for tensor in levels.tensors.values():
        hidden_states = hidden_states + tensor
    return hidden_states


def prove_no_meta_buffers_without_vision(tree: Path) -> None:
    """With image and video off, the deepstack step runs; with them on, it adds."""
    import torch

    builders = buffer_builders(tree)
    if not builders:
        raise AssertionError(
            f"no model class in {tree} builds {BUFFERS} in or after a "
            f"{TOWER_CONTEXT} block: nothing to prove"
        )
    print(
        "note: classes proven: " + ", ".join(b.qualname for b in builders),
        file=sys.stderr,
    )
    classes = TreeClasses(tree, builders)
    crashed = []
    for builder in builders:
        others = {m: 1 for m in builder.modalities if m not in VISION}
        without_vision = {**others, **dict.fromkeys(VISION, 0)}
        model = build_model(classes, builder, without_vision)
        try:
            deepstack_step(model, STEP_ROWS)
        except RuntimeError as exc:
            devices = sorted({str(b.device) for b in getattr(model, BUFFERS, [])})
            where = "inside" if builder.inside_tower else "after"
            crashed.append(
                f"{builder.qualname}: {exc} (buffers on {', '.join(devices)}, "
                f"built {where} the {TOWER_CONTEXT} block)"
            )

        with_vision = {**others, **dict.fromkeys(VISION, 1)}
        model = build_model(classes, builder, with_vision)
        payload = torch.arange(1, LEVELS + 1, dtype=torch.float32).reshape(LEVELS, 1, 1)
        model._set_deepstack_input_embeds(payload.expand(LEVELS, STEP_ROWS, HIDDEN))
        hidden_states = deepstack_step(model, STEP_ROWS)
        assert hidden_states is not None, (
            f"{builder.qualname}: with image and video on, a stored deepstack "
            "payload did not reach the decoder (_get_deepstack_input_embeds "
            "returned None): deepstack is off although the vision tower exists"
        )
        expected = float(payload.sum())
        assert bool(hidden_states.eq(expected).all()), (
            f"{builder.qualname}: with image and video on, the decoder's "
            f"deepstack add gave {hidden_states[:, 0].tolist()}, expected "
            f"{expected} in every row (the sum of the stored levels)"
        )
    if crashed:
        raise AssertionError(
            "with image and video limits 0, the deepstack step crashed: "
            "_get_deepstack_input_embeds handed the decoder buffers built on "
            f"the meta device (the engine dies at startup, {CRASH}):\n"
            + "\n".join(f"  {line}" for line in crashed)
        )

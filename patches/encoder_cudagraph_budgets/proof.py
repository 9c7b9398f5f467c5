"""The proof of vllm#38040: each part's code, from the tree, run on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch


def prove(tree: Path, patch: Patch) -> None:
    """Run the tree's own code for each part on the CPU; collect what is wrong.

    The manager is built with small stand-in configs and model (it only asks
    them for fields and the budget range). The Qwen3-VL methods are taken from
    the tree's model file and run on a stand-in ``self``: importing the model
    module needs torchvision and more, which a CPU proof has no use for.
    """
    import importlib
    import sys

    # 0.19.x's encoder graph modules import each other as
    # vllm.v1.worker.gpu.mm.*, which that release does not ship (there they
    # live in vllm/v1/worker/): map the name so the code can run at all.
    for name in ("encoder_cudagraph_defs", "encoder_cudagraph"):
        try:
            importlib.import_module(f"vllm.v1.worker.gpu.mm.{name}")
        except ModuleNotFoundError:
            shipped = f"vllm.v1.worker.{name}"
            if importlib.util.find_spec(shipped) is None:
                continue
            sys.modules[f"vllm.v1.worker.gpu.mm.{name}"] = importlib.import_module(
                shipped
            )

    problems: list[str] = []
    problems += _prove_manager()
    problems += _prove_config()
    problems += _prove_qwen3_vl(tree, patch)
    assert not problems, "vllm#38040 not in effect: " + "; ".join(problems)


class _EndlessBudgets(Exception):
    """Budgets generated from a non-positive minimum: the loop never ends."""


def _build_manager(
    budgets: list[int], items: int, low: int = 64, high: int = 16384
) -> Any:
    """The tree's ``EncoderCudaGraphManager`` on stand-in configs and model."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager

    class Model:
        def get_encoder_cudagraph_config(self) -> object:
            # 0.30.0 on also read the encoder's paths (one, with the
            # budgets as they are) and no extra capture axis.
            return SimpleNamespace(
                modalities=["image"],
                max_frames_per_video=1,
                paths={
                    "default": SimpleNamespace(
                        min_token_budget=None, allow_zero_tokens=False
                    )
                },
                capture_axes=(),
            )

        def get_encoder_cudagraph_budget_range(self, vllm_config: object) -> tuple:
            return low, high

        def get_max_frames_per_video(self) -> int:
            return 1

    generate = EncoderCudaGraphManager._generate_budgets

    def guarded_generate(min_budget: int, max_budget: int) -> list[int]:
        # Doubling from 0 never passes max_budget: stop where the buggy code
        # would hang instead of hanging the proof.
        if min_budget <= 0 <= max_budget:
            raise _EndlessBudgets(f"_generate_budgets({min_budget}, {max_budget})")
        return generate(min_budget, max_budget)

    compilation = SimpleNamespace(
        encoder_cudagraph_token_budgets=budgets,
        # 0.19.x reads the first name, 0.20 and later the second.
        encoder_cudagraph_max_images_per_batch=items,
        encoder_cudagraph_max_vision_items_per_batch=items,
        encoder_cudagraph_max_frames_per_batch=None,
    )
    multimodal = SimpleNamespace(
        mm_encoder_tp_mode="replicate",
        # No video: keeps the frame budget off the path under test.
        get_limit_per_prompt=lambda modality: 0,
    )
    vllm_config = SimpleNamespace(
        compilation_config=compilation,
        model_config=SimpleNamespace(multimodal_config=multimodal),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    EncoderCudaGraphManager._generate_budgets = staticmethod(guarded_generate)
    try:
        return EncoderCudaGraphManager(
            vllm_config=vllm_config,
            device=torch.device("cpu"),
            dtype=torch.float32,
            model=Model(),
        )
    finally:
        EncoderCudaGraphManager._generate_budgets = staticmethod(generate)


def _prove_manager() -> list[str]:
    """The invariant on every configuration path, and the bad inputs refused."""
    problems = []
    for label, kwargs in (
        ("automatic budgets and batch size", {"budgets": [], "items": 0}),
        ("user budgets [32, 64] only", {"budgets": [32, 64], "items": 0}),
        ("user batch size 128 only", {"budgets": [], "items": 128}),
    ):
        try:
            built = _build_manager(**kwargs)
        except Exception as exc:  # the check is what the manager does
            problems.append(f"{label}: EncoderCudaGraphManager raised {exc!r}")
            continue
        if built.max_batch_size > min(built.token_budgets):
            problems.append(
                f"{label}: max_batch_size {built.max_batch_size} > smallest "
                f"token budget {min(built.token_budgets)}"
            )
    for label, kwargs, words in (
        (
            "user budgets [64] with batch size 256",
            {"budgets": [64], "items": 256},
            ("256", "64"),
        ),
        (
            "model budget range (0, 128)",
            {"budgets": [], "items": 0, "low": 0, "high": 128},
            (),
        ),
        (
            "model budget range (200, 100)",
            {"budgets": [], "items": 0, "low": 200, "high": 100},
            (),
        ),
    ):
        try:
            _build_manager(**kwargs)
        except ValueError as exc:
            missing = [w for w in words if w not in str(exc)]
            if missing:
                problems.append(
                    f"{label}: the ValueError does not name {missing}: {exc}"
                )
        except _EndlessBudgets as exc:
            problems.append(f"{label}: accepted, and {exc} would never return")
        except Exception as exc:
            problems.append(f"{label}: raised {exc!r}, not ValueError")
        else:
            problems.append(f"{label}: accepted without ValueError")
    return problems


def _prove_config() -> list[str]:
    from vllm.config.compilation import CompilationConfig

    problems = []
    for budgets in ([0, 128], [-1, 64]):
        try:
            CompilationConfig(encoder_cudagraph_token_budgets=budgets)
        except ValueError:
            continue
        problems.append(
            f"CompilationConfig accepted encoder_cudagraph_token_budgets={budgets}"
        )
    return problems


def _load_qwen3_vl_methods(tree: Path, patch: Patch) -> dict[str, Any]:
    """The tree's own Qwen3-VL methods, by part, compiled from its model file."""
    import torch
    from deepstack_patch.proof.proving import function_from_tree, proof_targets

    methods: dict[str, Any] = {}
    for relpath, found in proof_targets(tree, patch):
        if found.part in ("ceil-per-item", "pruning-no-graphs"):
            methods.setdefault(
                found.part,
                function_from_tree(tree, relpath, found.symbol, {"torch": torch}),
            )
    return methods


def _prove_qwen3_vl(tree: Path, patch: Patch) -> list[str]:
    import inspect
    from types import SimpleNamespace

    import torch

    methods = _load_qwen3_vl_methods(tree, patch)
    problems = []
    capture = methods.get("ceil-per-item")
    if capture is None:
        problems.append("no Qwen3-VL prepare_encoder_cudagraph_capture_inputs found")
    else:
        merge = 2
        # From 0.23.0 the capture inputs keep no grid (`values` only): the
        # grid is what the method hands the tower's metadata.
        grids: list[Any] = []

        def metadata(grid: Any, **kwargs: Any) -> dict[str, Any]:
            grids.append(grid)
            return {}

        visual = SimpleNamespace(
            spatial_merge_size=merge,
            patch_embed=SimpleNamespace(
                proj=SimpleNamespace(in_channels=1), patch_size=1, temporal_patch_size=1
            ),
            prepare_encoder_metadata=metadata,
        )
        budget, batch = 100, 8
        arguments = {
            "token_budget": budget,
            "max_batch_size": batch,
            "max_frames_per_batch": batch,
            "device": torch.device("cpu"),
            "dtype": torch.float32,
        }
        accepted = inspect.signature(capture).parameters
        inputs = capture(
            SimpleNamespace(visual=visual),
            **{k: v for k, v in arguments.items() if k in accepted},
        )
        mm_kwargs = getattr(inputs, "mm_kwargs", None)
        grid = mm_kwargs["image_grid_thw"] if mm_kwargs is not None else grids[-1]
        per_item = [t * (h // merge) * (w // merge) for t, h, w in grid]
        if min(per_item) * batch < budget:
            problems.append(
                f"capture inputs for token_budget={budget}, max_batch_size={batch} "
                f"give {min(per_item)} tokens per item (floor division), fewer than "
                f"one item using the whole budget needs"
            )
    config = methods.get("pruning-no-graphs")
    if config is None:
        problems.append("no Qwen3-VL get_encoder_cudagraph_config found")
    else:

        def model(pruning: bool) -> SimpleNamespace:
            return SimpleNamespace(
                is_multimodal_pruning_enabled=pruning,
                visual=SimpleNamespace(out_hidden_size=8),
                get_max_frames_per_video=lambda: 1,
            )

        pruned = config(model(True)).modalities
        if pruned:
            problems.append(
                f"with multimodal pruning on, encoder CUDA graphs still serve {pruned}"
            )
        if "image" not in config(model(False)).modalities:
            problems.append("without pruning, image encoder CUDA graphs are gone")
    return problems

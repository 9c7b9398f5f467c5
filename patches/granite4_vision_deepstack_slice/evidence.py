"""The evidence of vllm#40917: the compiled decode step of Granite4Vision.

Two of the tree's functions are compiled from its file: the outer model's
``forward``, which builds the deepstack ``IntermediateTensors`` from the
persistent buffers, and the language model's ``forward`` (the class whose
``forward`` takes ``deepstack_input_embeds``, compiled by vLLM), which adds
each level to the hidden states in its layer loop. The language model's
forward is compiled with Inductor over stand-in decoder layers (a linear
layer each); the buffers hold 8,192 rows (the default
``max_num_batched_tokens``). A 1-token decode step runs through both; the
figures are the rows the compiled step receives per deepstack level and the
step's time after warm-up.
"""

from __future__ import annotations

import ast
import itertools
import types
from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.proof.measure import (
    IntermediateTensors,
    compile_functions,
    measurement,
    time_calls,
)
from deepstack_patch.proof.proving import proof_targets

BUFFER_ROWS = 8192
DEEPSTACK_PARAMETER = "deepstack_input_embeds"
#: Per device: hidden size, decoder layers, deepstack layers, repetitions.
SIZES = {"cpu": (256, 8, (1, 3, 5), 30), "cuda": (2048, 16, (2, 5, 8, 11), 200)}
DECODE_ROWS = 1


def measure(tree: Path, patch: Patch, device: str) -> dict[str, Any]:
    import torch

    hidden, layers, ds_layers, repetitions = SIZES[
        "cuda" if "cuda" in device else "cpu"
    ]
    ((relpath, target), *_) = proof_targets(tree, patch)
    path = tree / relpath
    outer = compile_functions(path, {"forward": target.symbol}, _outer_namespace())
    language_class = _language_model_class(path)
    inner = compile_functions(
        path,
        {"forward": f"{language_class}.forward"},
        {"torch": torch, "islice": itertools.islice, **_outer_namespace()},
    )["forward"]

    language_model = _StandInLanguageModel(hidden, layers).to(device).eval()
    compiled, graphs = _compiled_counting(types.MethodType(inner, language_model))
    seen: list[dict[str, int]] = []

    def language_model_call(**kwargs: Any) -> Any:
        ds = kwargs.get(DEEPSTACK_PARAMETER)
        seen.append({k: int(v.shape[0]) for k, v in (ds.tensors if ds else {}).items()})
        return compiled(**kwargs)

    model = types.SimpleNamespace(
        _ds_layer_indices=list(ds_layers),
        _ds_buffers=[
            torch.zeros(BUFFER_ROWS, hidden, device=device) for _ in ds_layers
        ],
        _ds_num_tokens=0,
        language_model=types.SimpleNamespace(model=language_model_call),
    )
    inputs_embeds = torch.randn(DECODE_ROWS, hidden, device=device)
    positions = torch.zeros(DECODE_ROWS, dtype=torch.long, device=device)
    input_ids = torch.zeros(DECODE_ROWS, dtype=torch.long, device=device)

    def step() -> Any:
        with torch.no_grad():
            return outer["forward"](
                model,
                input_ids=input_ids,
                positions=positions,
                intermediate_tensors=None,
                inputs_embeds=inputs_embeds,
            )

    out = step()
    assert out.shape[0] == DECODE_ROWS, f"the step returned {tuple(out.shape)}"
    figures: dict[str, Any] = {"step": time_calls(step, device, repetitions, 5)}
    rows = sorted({r for call in seen for r in call.values()})
    figures["rows_reaching_compiled_step"] = rows
    figures["buffer_rows"] = BUFFER_ROWS
    figures["compilations"] = len(graphs)
    symptom = any(r > DECODE_ROWS for r in rows)
    return measurement(
        what=(
            f"{target.symbol} and {language_class}.forward ({relpath}); the "
            f"latter compiled with Inductor over {layers} stand-in layers "
            f"(hidden {hidden}, deepstack at layers {list(ds_layers)}); "
            f"buffers of {BUFFER_ROWS} rows; a {DECODE_ROWS}-token decode step"
        ),
        symptom=symptom,
        mechanism=(
            f"the compiled step receives deepstack tensors of {rows} rows for "
            f"a {DECODE_ROWS}-token step"
        ),
        figures=figures,
        notes=[
            "compiled with dynamo's defaults (guards on, shapes as they come), "
            "not vLLM's dispatcher, which traces once at max_num_batched_tokens "
            "and drops the guards: the time is what the compiled step costs "
            "with the rows it receives"
        ],
    )


def _compiled_counting(function: Any) -> tuple[Any, list[int]]:
    """``function`` compiled with Inductor, and a list that grows by one for
    each graph Inductor compiles."""
    import torch

    graphs: list[int] = []

    def counting_inductor(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        from torch._inductor.compile_fx import compile_fx

        graphs.append(1)
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(function, backend=counting_inductor), graphs


def ratio(pristine: dict[str, Any], patched: dict[str, Any]) -> float | None:
    """Pristine step time over patched, from the two measurements."""
    before = pristine["figures"]["step"]["median_ms"]
    after = patched["figures"]["step"]["median_ms"]
    return round(before / after, 2) if after else None


def _outer_namespace() -> dict[str, Any]:
    import torch

    first_rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
    return {
        "torch": torch,
        "IntermediateTensors": IntermediateTensors,
        "get_pp_group": lambda: first_rank,
    }


def _language_model_class(path: Path) -> str:
    """The class in the file whose ``forward`` takes the deepstack tensors."""
    module = ast.parse(path.read_bytes(), filename=str(path))
    for node in module.body:
        match node:
            case ast.ClassDef(name=name, body=body):
                for item in body:
                    match item:
                        case ast.FunctionDef(name="forward", args=args) if any(
                            a.arg == DEEPSTACK_PARAMETER
                            for a in args.args + args.kwonlyargs
                        ):
                            return name
    raise LookupError(f"no class in {path} has a forward taking {DEEPSTACK_PARAMETER}")


def _stand_in_layer(hidden: int) -> Any:
    import torch

    class Layer(torch.nn.Module):
        """A decoder layer that is not under test: one linear map."""

        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(hidden, hidden)

        def forward(self, positions: Any, hidden_states: Any) -> Any:
            return hidden_states + self.proj(hidden_states)

    return Layer()


class _StandInLanguageModel:
    """What the tree's language model ``forward`` reads from ``self``."""

    def __new__(cls, hidden: int, layers: int) -> Any:
        import torch

        module = torch.nn.Module()
        module.layers = torch.nn.ModuleList(
            [_stand_in_layer(hidden) for _ in range(layers)]
        )
        module.norm = torch.nn.LayerNorm(hidden)
        module.start_layer, module.end_layer = 0, layers
        module.config = types.SimpleNamespace(embedding_multiplier=1.0)
        return module

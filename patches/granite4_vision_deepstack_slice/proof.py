"""The proof of vllm#40917: ``forward`` passes buffers of the step's rows."""

from __future__ import annotations

from pathlib import Path

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.proof.proving import (
    function_from_tree,
    import_from_tree,
    proof_targets,
)


def prove_forward(tree: Path, patch: Patch) -> None:
    """``forward`` hands the language model buffers of the step's rows.

    The tree's ``forward`` runs on a weight-less stand-in for the model:
    64-row buffers, a language model that records what it is given, and
    a pipeline-parallel group that is the first rank. For steps of 5 and
    1 tokens, every deepstack tensor must have ``inputs_embeds.size(0)``
    rows and be a view of its buffer's first rows.
    """
    for relpath, target in proof_targets(tree, patch):
        _prove_forward(tree, relpath, target.symbol, patch.id)


def _prove_forward(tree: Path, relpath: str, qualname: str, patch_id: str) -> None:
    import contextlib
    import types
    from unittest import mock

    import torch
    from vllm.sequence import IntermediateTensors

    first_rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
    module = import_from_tree(relpath)
    if module is not None:
        owner = module
        for name in qualname.split(".")[:-1]:
            owner = getattr(owner, name)
        forward = getattr(owner, qualname.rsplit(".", 1)[-1])
        stub_pp = mock.patch.object(module, "get_pp_group", lambda: first_rank)
    else:
        namespace = {
            "torch": torch,
            "IntermediateTensors": IntermediateTensors,
            "get_pp_group": lambda: first_rank,
        }
        forward = function_from_tree(tree, relpath, qualname, namespace)
        stub_pp = contextlib.nullcontext()

    received: list[object] = []

    def language_model(**kwargs: object) -> torch.Tensor:
        received.append(kwargs.get("deepstack_input_embeds"))
        return torch.zeros(1)

    buffer_rows, hidden, layers = 64, 8, [2, 5]
    model = types.SimpleNamespace(
        _ds_layer_indices=layers,
        _ds_buffers=[torch.randn(buffer_rows, hidden) for _ in layers],
        _ds_num_tokens=0,
        language_model=types.SimpleNamespace(model=language_model),
    )
    with stub_pp:
        for rows in (5, 1):
            received.clear()
            forward(
                model,
                input_ids=torch.zeros(rows, dtype=torch.long),
                positions=torch.arange(rows),
                intermediate_tensors=None,
                inputs_embeds=torch.zeros(rows, hidden),
            )
            assert len(received) == 1, (
                f"{qualname} called the language model {len(received)} times"
            )
            (ds,) = received
            assert isinstance(ds, IntermediateTensors), (
                f"{qualname} passed deepstack_input_embeds={ds!r}, expected "
                "IntermediateTensors"
            )
            assert sorted(ds.tensors) == [f"ds_{layer}" for layer in layers], (
                f"{qualname} passed deepstack keys {sorted(ds.tensors)}"
            )
            for level, layer in enumerate(layers):
                tensor = ds[f"ds_{layer}"]
                assert tensor.size(0) == rows, (
                    f"{qualname} passed ds_{layer} with {tensor.size(0)} rows for "
                    f"a step of {rows} tokens (inputs_embeds.size(0)): the whole "
                    f"{buffer_rows}-row buffer reaches the compiled model, which "
                    f"specialises on it ({patch_id} not applied)"
                )
                buffer = model._ds_buffers[level]
                assert tensor.data_ptr() == buffer.data_ptr() and torch.equal(
                    tensor, buffer[:rows]
                ), f"{qualname}: ds_{layer} is not the first rows of its buffer"

"""The evidence of vllm#38933: the recompilation when the batch size leaves 1.

The tree's ``batched_count_greater_than`` is compiled from its file with its
own ``@torch.compile(...)`` decorator (the platform's compile backend is
Inductor, as on CUDA and CPU), through a backend that counts the graphs and
hands each to Inductor. The tree's ``Sampler.gather_logprobs`` calls it, as in
a sampling step that asks for logprobs. Each repetition starts from a reset
dynamo (Inductor's caches stay warm, as in a running server), runs batch 1,
then times the first call at batch 2 and at batch 8: without the fix, the
batch-2 call builds and compiles a second graph.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.proof.measure import (
    compile_functions,
    measurement,
    time_calls,
    timed,
    timing,
)
from deepstack_patch.proof.proving import proof_targets

from . import callers, compiled

#: Per device: vocabulary size, logprobs asked for, timed repetitions.
SIZES = {"cpu": (32_000, 5, 3), "cuda": (151_936, 5, 10)}
BATCHES = (1, 2, 8)


def measure(tree: Path, patch: Patch, device: str) -> dict[str, Any]:
    import torch

    vocab, num_logprobs, repetitions = SIZES["cuda" if "cuda" in device else "cpu"]
    gather, graphs = _tree_gather_logprobs(tree, patch)

    def inputs(batch: int) -> tuple[Any, Any]:
        logprobs = torch.randn(batch, vocab, device=device).log_softmax(-1)
        tokens = torch.randint(0, vocab, (batch,), dtype=torch.int64, device=device)
        return logprobs, tokens

    data = {batch: inputs(batch) for batch in BATCHES}
    first_call: dict[int, list[float]] = {2: [], 8: []}
    compiles: list[int] = []
    # One untimed round first: Inductor's first compile in a process loads
    # its toolchain (seconds), which is not the recompilation under test.
    for round_ in range(repetitions + 1):
        torch._dynamo.reset()
        graphs.clear()
        gather(data[1][0], num_logprobs, data[1][1])
        for batch in (2, 8):
            _, seconds = timed(
                lambda b=batch: gather(data[b][0], num_logprobs, data[b][1]), device
            )
            if round_:
                first_call[batch].append(seconds)
        compiles.append(len(graphs))
    steady = time_calls(
        lambda: gather(data[2][0], num_logprobs, data[2][1]),
        device,
        repetitions=max(repetitions, 5),
        warmup=2,
    )
    count = compiles[-1]
    symptom = count > 1
    return measurement(
        what=(
            f"{_where(tree, patch)} compiled with Inductor; gather_logprobs at "
            f"batch 1, then the first call at batch 2 and at 8 (vocabulary "
            f"{vocab}, {num_logprobs} logprobs), dynamo reset before each round"
        ),
        symptom=symptom,
        mechanism=(
            f"{count} compilation(s) for batch sizes 1, 2, 8"
            + (" (batch 2 recompiles)" if symptom else "")
        ),
        figures={
            "compilations": count,
            "compilations_per_round": compiles[1:],
            "first_call_batch_2": timing(first_call[2], warmup=1),
            "first_call_batch_8": timing(first_call[8], warmup=1),
            "steady_call_batch_2": steady,
        },
        notes=[
            "Inductor's caches are warm after the untimed round: the figures "
            "are the recompilation a running server pays, not a cold start"
        ],
    )


def _where(tree: Path, patch: Patch) -> str:
    parts = {finding.part: relpath for relpath, finding in proof_targets(tree, patch)}
    return f"{compiled.COUNT_FUNCTION} ({parts.get(compiled.PART, '?')})"


def _tree_gather_logprobs(tree: Path, patch: Patch) -> tuple[Any, list[int]]:
    """The tree's ``Sampler.gather_logprobs`` over the tree's compiled count,
    and the list the counting backend appends each graph's batch size to."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    targets = proof_targets(tree, patch)
    count_path = next(r for r, f in targets if f.part == compiled.PART)
    caller_path, caller = next(
        (r, f.symbol) for r, f in targets if f.part == callers.PART
    )
    graphs: list[int] = []

    def counting_inductor(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        graphs.append(len(graphs) + 1)
        return compile_fx(gm, example_inputs)

    real_compile = torch.compile

    def compile_counting(*args: Any, **kwargs: Any) -> Any:
        # The tree's own arguments (dynamic=...) stay; the backend it names
        # is the platform's, Inductor: counted, then compiled by Inductor.
        kwargs["backend"] = counting_inductor
        return real_compile(*args, **kwargs)

    platform = types.SimpleNamespace(simple_compile_backend="inductor")
    namespace: dict[str, Any] = {"torch": torch, "current_platform": platform}
    torch.compile = compile_counting
    try:
        count = compile_functions(
            tree / count_path,
            {compiled.COUNT_FUNCTION: compiled.COUNT_FUNCTION},
            namespace,
            keep_decorators=True,
        )[compiled.COUNT_FUNCTION]
    finally:
        torch.compile = real_compile
    caller_namespace = {
        "torch": torch,
        compiled.COUNT_FUNCTION: count,
        "LogprobsTensors": lambda *tensors: tensors,
    }
    gather = compile_functions(
        tree / caller_path, {"gather": caller}, caller_namespace
    )["gather"]
    return gather, graphs

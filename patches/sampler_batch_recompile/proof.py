"""The proof of vllm#38933: the tree's compiled count is built once for every batch.

The module defining ``batched_count_greater_than`` is executed again with
``torch.compile`` swapped for a wrapper that keeps every argument the tree's
decorator passes (``dynamic`` above all) but compiles through a counting
backend. ``Sampler.gather_logprobs`` then runs for batch sizes 1, 2 and 8.
Each half of the fix shows in what the backend sees: without
``mark_unbacked`` a second graph is built for batch 2; with ``dynamic=True``
the vocabulary dimension is symbolic too; without
``torch._check(x.shape[0] >= 1)`` the batch size's lower bound is 0.
"""

from __future__ import annotations

from typing import Any

from .compiled import COUNT_FUNCTION

#: One graph build: the batch and vocabulary sizes the backend saw (ints, or
#: ``torch.SymInt`` where symbolic) and the batch size's lower bound.
Graph = tuple[Any, Any, int]


def prove_single_compile() -> None:
    """Count the graph builds of the tree's own compiled function."""
    graphs = _graphs_for_batch_sizes((1, 2, 8))
    problems = _problems(graphs)
    assert not problems, "vllm#38933 not in effect: " + "; ".join(problems)


def _counting_backend(graphs: list[Graph]) -> Any:
    import torch

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        tensors = [
            n.meta.get("example_value")
            for n in gm.graph.nodes
            if n.op == "placeholder"
            and isinstance(n.meta.get("example_value"), torch.Tensor)
        ]
        x = tensors[0]
        batch, vocab = x.shape[0], x.shape[1]
        if isinstance(batch, torch.SymInt):
            shape_env = batch.node.shape_env
            lower = int(shape_env.bound_sympy(batch.node.expr).lower)
        else:
            lower = int(batch)
        graphs.append((batch, vocab, lower))
        return gm.forward

    return backend


def _graphs_for_batch_sizes(batch_sizes: tuple[int, ...]) -> list[Graph]:
    """Run ``Sampler.gather_logprobs`` per batch size; the graphs compiled."""
    import importlib

    import torch
    import vllm.v1.sample.ops.logprobs as logprobs_module
    import vllm.v1.sample.sampler as sampler_module

    graphs: list[Graph] = []
    backend = _counting_backend(graphs)
    real_compile = torch.compile

    def compile_with_counter(*args: object, **kwargs: object) -> object:
        kwargs["backend"] = backend
        return real_compile(*args, **kwargs)

    original = sampler_module.__dict__.get(COUNT_FUNCTION)
    torch._dynamo.reset()
    torch.compile = compile_with_counter
    try:
        importlib.reload(logprobs_module)
    finally:
        torch.compile = real_compile
    sampler_module.__dict__[COUNT_FUNCTION] = getattr(logprobs_module, COUNT_FUNCTION)
    try:
        vocab_size, num_logprobs = 32, 3
        for batch_size in batch_sizes:
            logprobs = torch.randn(batch_size, vocab_size)
            token_ids = torch.randint(0, vocab_size, (batch_size,), dtype=torch.int64)
            result = sampler_module.Sampler.gather_logprobs(
                logprobs, num_logprobs, token_ids
            )
            chosen = logprobs.gather(-1, token_ids.unsqueeze(-1))
            expected = (logprobs >= chosen).sum(-1)
            assert torch.equal(result.selected_token_ranks, expected), (
                f"wrong token ranks for batch size {batch_size}"
            )
    finally:
        sampler_module.__dict__[COUNT_FUNCTION] = original
        importlib.reload(logprobs_module)
        torch._dynamo.reset()
    return graphs


def _problems(graphs: list[Graph]) -> list[str]:
    """What the graphs show of each half of the fix missing."""
    import torch

    problems = []
    if len(graphs) != 1:
        problems.append(
            f"{COUNT_FUNCTION} was compiled {len(graphs)} times for batch sizes "
            "1, 2, 8 (expected once: the batch dimension is not marked unbacked, "
            "so dynamo specialises batch size 1 and recompiles)"
        )
    if graphs:
        batch, vocab, lower = graphs[0]
        if not isinstance(batch, torch.SymInt):
            problems.append(f"the first graph has a static batch size {batch}")
        if isinstance(vocab, torch.SymInt):
            problems.append(
                "the vocabulary dimension is symbolic (torch.compile still has "
                "dynamic=True)"
            )
        if isinstance(batch, torch.SymInt) and lower < 1:
            problems.append(
                f"the batch size's lower bound is {lower}, not 1 "
                "(torch._check(x.shape[0] >= 1) is missing)"
            )
    return problems

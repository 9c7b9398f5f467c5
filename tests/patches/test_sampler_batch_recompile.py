"""vllm#38933 beyond the example harness: shapes already fixed another way
(issue 12 item 5), and the proof on real releases.

A vendor may compile ``batched_count_greater_than`` by a call at module level
instead of the decorator, or not compile it at all (the decorator commented
out). With upstream's two ``torch._check`` calls and without ``dynamic=True``
that is fixed: ``applied``, never ``drifted``, and never rewritten.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.patches import patch_by_id

from tests.support import apply_one, run_proof

PATCH = patch_by_id("vllm#38933")
CHECKED_BODY = """
    torch._check(x.shape[0] >= 1)
    torch._check(x.shape[0] == values.shape[0])
    return (x >= values).sum(-1)
"""


def states(code: str) -> list[tuple[str, PatchState]]:
    return [(f.part, f.state) for f in PATCH.recognise(ast.parse(code), "x.py")]


def test_compile_wrapper_at_module_level_is_applied() -> None:
    code = (
        "def _count_impl(x, values):"
        + CHECKED_BODY
        + "\n\nbatched_count_greater_than = torch.compile(\n"
        "    _count_impl, backend=current_platform.simple_compile_backend\n)\n"
    )
    assert states(code) == [("compiled-count", PatchState.APPLIED)]
    assert rewrite_text(PATCH, code) == code


def test_same_name_compiled_by_a_call_is_applied() -> None:
    # Also the `torch.compile(...)(fn)` spelling of the call.
    code = (
        "def batched_count_greater_than(x, values):"
        + CHECKED_BODY
        + "\n\nbatched_count_greater_than = torch.compile(fullgraph=True)(\n"
        "    batched_count_greater_than\n)\n"
    )
    assert states(code) == [("compiled-count", PatchState.APPLIED)]


def test_commented_out_decorator_with_checks_is_applied() -> None:
    code = (
        "# @torch.compile(dynamic=True, backend=platform.simple_compile_backend)\n"
        "def batched_count_greater_than(x, values):" + CHECKED_BODY
    )
    assert states(code) == [("compiled-count", PatchState.APPLIED)]
    assert rewrite_text(PATCH, code) == code


def test_module_level_compile_still_dynamic_is_drifted_not_applied() -> None:
    # The bug in a shape the patch does not rewrite: it must say so.
    code = (
        "def _count_impl(x, values):\n    return (x >= values).sum(-1)\n\n\n"
        "batched_count_greater_than = torch.compile(_count_impl, dynamic=True)\n"
    )
    [(part, state)] = states(code)
    assert state is PatchState.DRIFTED
    [found] = PATCH.recognise(ast.parse(code), "x.py")
    assert "module level (line 5)" in found.reason


def test_undecorated_without_checks_is_still_drifted() -> None:
    code = (
        "def batched_count_greater_than(x, values):\n    return (x >= values).sum(-1)\n"
    )
    assert states(code) == [("compiled-count", PatchState.DRIFTED)]


@pytest.mark.verify
@pytest.mark.release
@pytest.mark.parametrize("version", ["0.19.1", "0.17.0"])
def test_proof_fails_before_and_passes_after(
    version: str,
    proof_env: object,
    release_tree: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    pristine = release_tree(version)
    status, message = run_proof(proof_env, pristine, PATCH.id)
    assert status == "failed", f"the proof does not fail on pristine {version}"
    assert f"{PATCH.id} not in effect" in message
    assert "compiled 2 times" in message
    patched = apply_one(PATCH.id, pristine, tmp_path / version)
    status, message = run_proof(proof_env, patched, PATCH.id)
    assert status == "passed", f"the proof fails on patched {version}: {message}"

"""Every patch's worked examples are its first tests (RewriteTest-style).

For each example of each patch in the series, collected automatically:
the patch recognises ``before`` in the stated state; ``before`` becomes
``after``; ``after`` is recognised as applied and a second pass changes
nothing; code the patch does not target, around the example, stays
byte-identical; and the result compiles.
"""

from __future__ import annotations

import ast

import pytest
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import (
    Example,
    Finding,
    Patch,
    PatchState,
    combine_states,
)
from deepstack_patch.engine.source import SourceFile, parsed_from
from deepstack_patch.patches import SERIES

CASES = [
    pytest.param(patch, example, id=f"{patch.id}-{example.name}")
    for patch in SERIES
    for example in patch.examples
]

# Unrelated code around an example must come out byte-identical, including
# its odd formatting and comments.
PROLOGUE = '''# -*- coding: utf-8 -*-
"""A module the patch does not target, apart from the example."""
import os   # spacing kept


def unrelated( a,b ):  # formatting the rewrite must not touch
    return os.path.join(a,b)

'''
EPILOGUE = """

class Unrelated :
    x = [1,
         2]
"""


def findings_of(patch: Patch, code: str, path: str = "example.py") -> list[Finding]:
    return patch.recognise(ast.parse(code), path)


def state_of(patch: Patch, code: str, path: str = "example.py") -> PatchState:
    return combine_states([f.state for f in findings_of(patch, code, path)])


@pytest.mark.parametrize(("patch", "example"), CASES)
def test_the_engines_parse_is_recognised_as_a_plain_parse_is(
    patch: Patch, example: Example
) -> None:
    """A shortcut a recogniser takes on a file the engine read (a byte search
    of :func:`parsed_from` before a walk) never changes a finding."""
    for code in (example.before, example.after):
        if code is None:
            continue
        engine_tree = SourceFile(example.path, code.encode()).ast
        assert parsed_from(engine_tree) == code.encode()
        assert patch.recognise(engine_tree, example.path) == findings_of(
            patch, code, example.path
        )


def test_every_patch_has_examples() -> None:
    for patch in SERIES:
        states = {example.state for example in patch.examples}
        assert PatchState.NEEDED in states, f"{patch.id} has no needed example"
        assert PatchState.APPLIED in states, f"{patch.id} has no applied example"


@pytest.mark.parametrize(("patch", "example"), CASES)
def test_example(patch: Patch, example: Example) -> None:
    path = example.path
    assert state_of(patch, example.before, path) is example.state
    if example.state is PatchState.NEEDED:
        assert example.after is not None, "a needed example must show its after"
    if example.after is None:
        # `rewrite_text(before) == before` would follow from the state: the
        # engine rewrites only needed findings. What can fail is a location
        # still needed inside an example whose combined state hides it (one
        # drifted location outranks it): an example that must not be
        # rewritten has no needed location at all.
        needed = [
            f"{f.symbol} ({f.part or 'the patch'})"
            for f in findings_of(patch, example.before, path)
            if f.state is PatchState.NEEDED
        ]
        assert not needed, f"needed locations in a must-not-rewrite example: {needed}"
        return

    after = rewrite_text(patch, example.before, path)
    assert after == example.after
    compile(after, path, "exec")
    assert state_of(patch, after, path) is PatchState.APPLIED
    assert rewrite_text(patch, after, path) == after, "a second pass changed the code"

    wrapped = rewrite_text(patch, PROLOGUE + example.before + EPILOGUE, path)
    assert wrapped == PROLOGUE + example.after + EPILOGUE

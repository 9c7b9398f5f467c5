"""Documentation a fix changes alone is carried (issue 40 item 5).

A docstring upstream rewords in a definition whose code it does not change
(a function, a class, the module: vllm#48008's ``FusedMoE``, the class
docstrings of vllm#40859 and vllm#41006) is a unit of its own, carried
where the old text is found exactly; where the fixed text is there it is
applied; where neither is, it is left out (not applicable, ``left out: ...``)
without holding the fix's code back, and the patch is never ``applied``
while it is left out. The modules here are made up.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import pytest
from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.derived import DerivedPatch
from deepstack_patch.engine.plan import plan_tree, rewrite_text
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import ASKED_FOR, VllmTree
from deepstack_patch.output.documents import patch_json

CODE = "vllm/pool.py"
DOCS = "vllm/layer.py"

POOL = '''"""A pool of blocks."""


class Pool:
    """Blocks, handed out in order."""

    def take(self, n):
        return self.free[:n]
'''

#: The fix: ``take``'s code, and the class's docstring alone.
POOL_FIXED = POOL.replace("self.free[:n]", "self.free[: max(n, 0)]").replace(
    "handed out in order.", "handed out in order (never a negative count)."
)

LAYER = '''"""Layers."""


def Layer(
    size: int,
    bias: bool = False,  # keeps its comment
):
    """Make a layer.

    Args:
        size: the width
        bias: whether to add a bias. Setting this
        to True costs memory.
    """
    return size, bias


class Norm:
    def __init__(self, eps):
        """The norm."""
        self.eps = eps
'''

#: Documentation alone: a function's, a method's and the module's docstring.
LAYER_FIXED = (
    LAYER.replace('"""Layers."""', '"""Layers, built by factories."""')
    .replace(
        "        bias: whether to add a bias. Setting this\n"
        "        to True costs memory.\n",
        "        bias: whether to add a bias. Setting this\n"
        "            to True costs memory.\n",
    )
    .replace('"""The norm."""', '"""The norm, with its epsilon."""')
)


def _tree(root: Path, files: dict[str, str]) -> VllmTree:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm/__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.0.1\n"
    )
    # This tool's partial extraction (toy code: ``Pool.free`` is defined
    # nowhere): runtime names are not what is tested here.
    (root / ASKED_FOR).write_text("")
    for path, text in files.items():
        (root / path).write_text(text)
    return VllmTree.open(root)


def _diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
        )
    )


@pytest.fixture
def derived(tmp_path: Path) -> tuple[DerivedPatch, str, list[str]]:
    base = _tree(tmp_path / "base", {CODE: POOL, DOCS: LAYER})
    diff = _diff(CODE, POOL, POOL_FIXED) + _diff(DOCS, LAYER, LAYER_FIXED)
    result = derive_patch_from_text(diff, base, "local#48008")
    return result.patch, result.round_trip, result.notes


def test_documentation_alone_is_a_unit_of_its_own(derived) -> None:
    patch, round_trip, notes = derived
    assert (round_trip, notes) == ("text", [])
    assert sorted(
        (unit.path, unit.kind, unit.name, unit.documentation_only)
        for unit in patch.units
    ) == [
        (DOCS, "function", "Layer", True),
        (DOCS, "method", "Norm.__init__", True),
        (DOCS, "module-statement", "__doc__", True),
        (CODE, "class", "Pool", True),
        (CODE, "method", "Pool.take", False),
    ]


def test_the_rewrite_writes_upstreams_text_and_nothing_else(derived) -> None:
    patch, _, _ = derived
    assert rewrite_text(patch, POOL, CODE) == POOL_FIXED
    assert rewrite_text(patch, LAYER, DOCS) == LAYER_FIXED
    # A target laid out otherwise around the docstrings keeps its layout.
    spaced = LAYER.replace(
        "    return size, bias\n", "\n    return (size, bias)  # ok\n"
    )
    assert rewrite_text(patch, spaced, DOCS) == LAYER_FIXED.replace(
        "    return size, bias\n", "\n    return (size, bias)  # ok\n"
    )


def test_states_on_the_base_and_after_the_fix(derived, tmp_path: Path) -> None:
    patch, _, _ = derived
    before = plan_tree(_tree(tmp_path / "b", {CODE: POOL, DOCS: LAYER}), [patch])
    assert before.report(patch.id).state is PatchState.NEEDED
    assert {edit.relpath: edit.new.decode() for edit in before.edits} == {
        CODE: POOL_FIXED,
        DOCS: LAYER_FIXED,
    }
    after = plan_tree(
        _tree(tmp_path / "a", {CODE: POOL_FIXED, DOCS: LAYER_FIXED}), [patch]
    )
    assert after.report(patch.id).state is PatchState.APPLIED
    # The code in, a docstring still the old one: needed, the docstring alone.
    code_only = plan_tree(
        _tree(tmp_path / "c", {CODE: POOL_FIXED, DOCS: LAYER}), [patch]
    )
    assert code_only.report(patch.id).state is PatchState.NEEDED
    assert [edit.relpath for edit in code_only.edits] == [DOCS]


def test_documentation_found_nowhere_exactly_is_left_out_and_shown(
    derived, tmp_path: Path
) -> None:
    """A vendor's wording is neither the old text nor the new: that unit is
    left out, the code goes in, and the patch is never applied while it is
    left out."""
    patch, _, _ = derived
    vendor = LAYER.replace("Make a layer.", "Make a layer (vendor's words).")
    plan = plan_tree(_tree(tmp_path / "v", {CODE: POOL, DOCS: vendor}), [patch])
    report = plan.report(patch.id)
    assert report.state is PatchState.NEEDED
    left = report.part_state(f"{DOCS}::Layer")
    assert left == (
        PatchState.NOT_APPLICABLE,
        "left out: the docstring of def Layer is neither the one the fix edits "
        "nor the fixed one",
    )
    fixed = {edit.relpath: edit.new.decode() for edit in plan.edits}
    assert fixed[CODE] == POOL_FIXED
    # The other documentation of the file is carried; Layer's is left as it is.
    assert fixed[DOCS] == LAYER_FIXED.replace(
        "Make a layer.", "Make a layer (vendor's words)."
    ).replace("            to True costs memory.\n", "        to True costs memory.\n")
    # Once the rest is in, the patch is not applied: Layer's docstring is
    # still left out, and status says so (text and JSON read the same parts).
    done = plan_tree(
        _tree(tmp_path / "d", {CODE: POOL_FIXED, DOCS: fixed[DOCS]}), [patch]
    )
    report = done.report(patch.id)
    assert report.state is PatchState.NOT_APPLICABLE
    assert not done.edits
    assert "the documentation the fix edits is left out: Layer (vllm/layer.py)" in (
        report.reason
    )
    parts = {part["name"]: part for part in patch_json(report)["parts"]}
    assert parts[f"{DOCS}::Layer"]["reason"].startswith("left out: the docstring")
    assert "applied" not in {part["state"] for part in parts.values()}


def test_absent_documentation_never_holds_the_code_back(
    derived, tmp_path: Path
) -> None:
    patch, _, _ = derived
    without = LAYER.replace("class Norm:", "class Other:")
    plan = plan_tree(_tree(tmp_path / "w", {CODE: POOL, DOCS: without}), [patch])
    report = plan.report(patch.id)
    assert report.state is PatchState.NEEDED
    assert report.part_state(f"{DOCS}::Norm.__init__") == (
        PatchState.NOT_APPLICABLE,
        f"left out: method Norm.__init__ in {DOCS} is absent",
    )


def test_documentation_alone_never_makes_a_patch_needed(
    derived, tmp_path: Path
) -> None:
    """Where the fix's code is not in the tree, its documentation alone is
    nothing to do."""
    patch, _, _ = derived
    take = "    def take(self, n):\n        return self.free[:n]\n"
    elsewhere = POOL.replace(take, "")
    plan = plan_tree(_tree(tmp_path / "e", {CODE: elsewhere, DOCS: LAYER}), [patch])
    assert plan.report(patch.id).state is PatchState.NOT_APPLICABLE
    assert not plan.edits


def test_a_docstring_is_compared_exactly(derived) -> None:
    """The old text is found byte for byte (the indentation inside the
    string too): a docstring that differs only in its layout is left out."""
    patch, _, _ = derived
    (found,) = [
        f
        for f in patch.recognise(
            ast.parse(
                LAYER.replace("        to True costs", "          to True costs")
            ),
            DOCS,
        )
        if f.part == f"{DOCS}::Layer"
    ]
    assert found.state is PatchState.NOT_APPLICABLE
    assert found.reason.startswith("left out:")


#: vllm#48008's documentation-only file, as 0.25.1's maintainers carried it.
FUSED_MOE = "vllm/model_executor/layers/fused_moe/layer.py"


@pytest.mark.release
def test_vllm_48008s_docstring_is_carried_as_the_maintainers_did() -> None:
    """The fact this adds: on the real 0.25.0, ``FusedMoE``'s docstring as
    0.25.1 has it (the release diff restricted to that function, whose code
    did not change) is a documentation unit, needed; the rewrite writes
    0.25.1's text byte for byte, which is then applied."""
    from tests.support.upstream_diff import (
        release_files,
        restricted_after,
        upstream_diff,
    )

    diff = upstream_diff("0.25.0", "0.25.1", {FUSED_MOE: (["FusedMoE"], [])})
    base = release_files("0.25.0", [FUSED_MOE])
    result = derive_patch_from_text(diff, base, "local#48008")
    assert result.round_trip == "text"
    (unit,) = result.patch.units
    assert (unit.name, unit.documentation_only) == ("FusedMoE", True)
    plan = plan_tree(base, [result.patch], rewrite=True)
    assert plan.report(result.patch.id).state is PatchState.NEEDED
    (edit,) = plan.edits
    before = Path(base.root, FUSED_MOE).read_text()
    after = Path(release_files("0.25.1", [FUSED_MOE]).root, FUSED_MOE).read_text()
    assert edit.new.decode() == restricted_after(before, after, ["FusedMoE"])
    fixed = plan_tree(release_files("0.25.1", [FUSED_MOE]), [result.patch])
    assert fixed.report(result.patch.id).state is PatchState.APPLIED


def test_documentation_of_a_fix_partly_absent_is_never_written(tmp_path: Path) -> None:
    """One method of the fix already fixed, the other absent (a release that
    never had that code), the documentation still old: whatever the patch
    says, nothing is written while it is not needed."""
    give = "\n    def give(self, blocks):\n        self.free += blocks\n"
    pool = POOL + give
    pool_fixed = POOL_FIXED + give.replace("+= blocks", "+= list(blocks)")
    base = _tree(tmp_path / "base", {CODE: pool, DOCS: LAYER})
    diff = _diff(CODE, pool, pool_fixed) + _diff(DOCS, LAYER, LAYER_FIXED)
    patch = derive_patch_from_text(diff, base, "local#48009").patch
    partly = POOL_FIXED  # take fixed, give absent; the docstrings old
    plan = plan_tree(_tree(tmp_path / "p", {CODE: partly, DOCS: LAYER}), [patch])
    report = plan.report(patch.id)
    assert report.state is not PatchState.NEEDED, report.reason
    assert not plan.edits, report.reason

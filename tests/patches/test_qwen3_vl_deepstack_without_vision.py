"""vllm#49397 on real releases, and the companion rule that ties it to vllm#43617.

The examples (tests/patches/test_examples.py) hold the rewrite's shapes; here:
upstream's 0.27.1 becomes upstream's 0.28.0; after `apply` no class of any
release in targets.toml builds its deepstack buffers inside a tower block
(checked by a walk of our own, not by the patch's recogniser); and vllm#43617
never ships without its companion where both are needed.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES, patch_by_id

from tests.support import TARGETS
from tests.support.plans import ReleasePlans

pytestmark = pytest.mark.release

COMPANION = patch_by_id("vllm#49397")
FIX = patch_by_id("vllm#43617")
MODELS = "vllm/model_executor/models"
THREE = {
    f"{MODELS}/qwen3_vl.py": "Qwen3VLForConditionalGeneration",
    f"{MODELS}/qwen3_vl_moe.py": "Qwen3VLMoeForConditionalGeneration",
    f"{MODELS}/qwen3_omni_moe_thinker.py": (
        "Qwen3OmniMoeThinkerForConditionalGeneration"
    ),
}


def buffers_in_tower_blocks(root: Path) -> dict[str, list[str]]:
    """Every class (by file) whose ``__init__`` assigns the deepstack buffers
    inside a ``with self._mark_tower_model(...)`` block: built on the meta
    device when the tower is skipped."""
    found: dict[str, list[str]] = {}
    for path in sorted(
        [*root.glob(f"{MODELS}/*.py"), *root.glob("vllm/models/**/*.py")]
    ):
        source = path.read_bytes()
        if (
            b"_mark_tower_model" not in source
            or b"deepstack_input_embeds" not in source
        ):
            continue
        for cls in ast.walk(ast.parse(source)):
            if not isinstance(cls, ast.ClassDef):
                continue
            for init in cls.body:
                if (
                    isinstance(init, ast.FunctionDef)
                    and init.name == "__init__"
                    and any(_tower_block_builds_buffers(w) for w in ast.walk(init))
                ):
                    rel = path.relative_to(root).as_posix()
                    found.setdefault(rel, []).append(cls.name)
    return found


def _tower_block_builds_buffers(node: ast.AST) -> bool:
    if not isinstance(node, ast.With):
        return False
    header = ast.unparse(node.items[0].context_expr)
    if not header.startswith("self._mark_tower_model("):
        return False
    return any(
        isinstance(n, ast.Assign)
        and any(ast.unparse(t) == "self.deepstack_input_embeds" for t in n.targets)
        and not (isinstance(n.value, ast.Constant) and n.value.value is None)
        for n in ast.walk(node)
    )


def test_the_three_classes_are_found_in_0_20_2(
    release_tree: Callable[[str], Path], release_plan: ReleasePlans
) -> None:
    found = buffers_in_tower_blocks(release_tree("0.20.2"))
    assert found == {path: [name] for path, name in THREE.items()}
    plan = release_plan("0.20.2", rewrite=False)
    symbols = {
        (loc.path, loc.finding.symbol.removesuffix(".__init__"))
        for loc in plan.report(COMPANION.id).locations
        if loc.finding.symbol.endswith(".__init__")
    }
    assert symbols == set(THREE.items())


@pytest.mark.parametrize("version", TARGETS.releases)
def test_apply_leaves_no_buffers_in_a_tower_block(
    version: str, patched_copy: Callable[[str], Path], release_plan: ReleasePlans
) -> None:
    """Our own walk of the code (not the patch's recognition) finds buffers
    built in a tower block before the series is applied where the fix is
    needed, and none after, on every release: this test's fact. The plan is
    the run's shared one; that a second apply writes nothing is
    test_releases::test_apply's, on the same plan and tree."""
    root = patched_copy(version)
    before = buffers_in_tower_blocks(root)
    plan = release_plan(version)
    assert plan.report(COMPANION.id).state is TARGETS.expected(version)[COMPANION.id]
    write_edits(root, plan.edits)
    assert buffers_in_tower_blocks(root) == {}, f"{version}: still in a tower block"
    if TARGETS.expected(version)[COMPANION.id] is PatchState.NEEDED:
        assert before, f"{version}: needed, but our own walk found nothing to fix"


def test_0_27_1_becomes_upstream_0_28_0(
    patched_copy: Callable[[str], Path], release_tree: Callable[[str], Path]
) -> None:
    """The three ``__init__``s and the imports of ``StageMissingLayer`` are
    upstream's own, byte for byte (the rest of 0.28.0 changed for other
    reasons)."""
    root = patched_copy("0.27.1")
    tree = VllmTree.open(root)
    write_edits(root, plan_tree(tree, SERIES, {COMPANION.id}).edits)
    upstream = release_tree("0.28.0")
    compared = 0
    for relpath, name in THREE.items():
        ours, theirs = (root / relpath).read_text(), (upstream / relpath).read_text()
        assert _init_source(ours, name) == _init_source(theirs, name), relpath
        assert _import_lines(ours) == _import_lines(theirs), relpath
        compared += 1
    assert compared == 3


def _init_source(text: str, class_name: str) -> str:
    module = ast.parse(text)
    (cls,) = [
        n for n in module.body if isinstance(n, ast.ClassDef) and n.name == class_name
    ]
    (init,) = [
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    ]
    lines = text.splitlines()
    return "\n".join(lines[init.lineno - 1 : init.end_lineno])


def _import_lines(text: str) -> list[str]:
    module = ast.parse(text)
    lines = text.splitlines()
    return [
        "\n".join(lines[node.lineno - 1 : node.end_lineno])
        for node in module.body
        if isinstance(node, ast.ImportFrom)
        and any(alias.name == "StageMissingLayer" for alias in node.names)
    ]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "selection",
    [("--only", "vllm#43617"), ("--skip", "vllm#49397")],
    ids=["only-the-fix", "skip-the-companion"],
)
def test_the_fix_without_its_companion_is_refused(
    selection: tuple[str, str], patched_copy: Callable[[str], Path]
) -> None:
    root = patched_copy("0.20.2")
    before = {p: p.read_bytes() for p in (root / MODELS).glob("qwen3*.py")}
    text = cli("apply", "--vllm-src", str(root), *selection)
    assert text.returncode == 2, text.stdout + text.stderr
    assert "error: vllm#43617 ships only with its companion vllm#49397" in text.stderr
    assert "vllm#49384" in text.stderr and "nothing was written" in text.stderr
    # The hint names the option the user gave (issue 31 item 5).
    hint = {"--only": "add --only vllm#49397", "--skip": "drop --skip vllm#49397"}
    assert f"hint: {hint[selection[0]]}" in text.stderr, text.stderr
    as_json = cli("apply", "--vllm-src", str(root), *selection, "--format", "json")
    assert as_json.returncode == 2
    error = json.loads(as_json.stdout)["error"]
    assert "companion vllm#49397" in error["message"] and error["hint"]
    assert {p: p.read_bytes() for p in before} == before, "a refused apply wrote"

    status = cli("status", "--vllm-src", str(root), *selection, "--format", "json")
    assert status.returncode == 0, status.stderr
    report = {p["id"]: p for p in json.loads(status.stdout)["patches"]}["vllm#43617"]
    assert report["state"] == "needed" and report["blocked_by"] == ["vllm#49397"]
    assert report["companions"] == ["vllm#49397"]


def test_the_fix_with_its_companion_applies_both(
    patched_copy: Callable[[str], Path],
) -> None:
    root = patched_copy("0.20.2")
    done = cli(
        "apply",
        "--vllm-src",
        str(root),
        "--only",
        "vllm#43617",
        "--only",
        "vllm#49397",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["applied"]) == {"vllm#43617", "vllm#49397"}
    # The companion alone is fine: it repairs releases that crash natively.
    alone = patched_copy("0.23.0")
    done = cli("apply", "--vllm-src", str(alone), "--only", "vllm#49397")
    assert done.returncode == 0, done.stderr
    # --verbose: plain status counts the follow-ups in one line (issue 25).
    text = cli("status", "--vllm-src", str(root), "--verbose")
    assert "vllm#43617  follow-up: vllm#44384" in text.stdout
    assert "follow-up: vllm#49397" not in text.stdout, "a companion is no follow-up"

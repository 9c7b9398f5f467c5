"""``apply --skip-drifted``: a batch in one run (issue 41, item 1).

Each drifted patch is left out with whatever cannot go without it (a patch
that requires it, a fix that names it as companion); the rest is written.
A toy series serves the engine's rule; the built-in series on a synthetic
tree serves the command line (text, JSON, --dry-run, --check, --commit).
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.cli.common import drift_error
from deepstack_patch.engine.apply import CHECK, DRY_RUN, WRITE, apply_tree
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import Finding, Patch, PatchState
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite
from deepstack_patch.patches import qwen3_vl_deepstack_resize as resize

from tests import support
from tests.test_json_schemas import errors
from tests.test_verify import make_tree


class _Toy(Patch):
    """``def NAME(): return N`` in every file it looks at: 0 needed, 1
    applied, any other number drifted."""

    title = symptom = "toy"
    markers = (b"def ",)
    parts = {"toy": "toy function"}

    def __init__(
        self,
        patch_id: str,
        requires: tuple[str, ...] = (),
        companions: tuple[str, ...] = (),
        paths: tuple[str, ...] = ("vllm/toy.py",),
    ) -> None:
        self.id = patch_id
        self.requires = requires
        self.companions = companions
        self.paths = paths

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        for node in tree.body:
            match node:
                case ast.FunctionDef(
                    name=self.id, body=[ast.Return(ast.Constant(int(value)))]
                ):
                    state = {0: PatchState.NEEDED, 1: PatchState.APPLIED}.get(
                        value, PatchState.DRIFTED
                    )
                    reason = "" if value in (0, 1) else f"returns {value}"
                    lines = (node.lineno, node.end_lineno or node.lineno)
                    return [Finding(state, self.id, node.lineno, lines, reason, "toy")]
        return []

    def rewrite(self, module, needed):  # type: ignore[no-untyped-def]
        import libcst

        old = f"def {self.id}():\n    return 0\n"
        return libcst.parse_module(
            module.code.replace(old, f"def {self.id}():\n    return 1\n")
        )


def toy_tree(root: Path, files: dict[str, dict[str, int]]) -> VllmTree:
    """A tree whose files hold ``def NAME(): return N`` for each name."""
    make_tree(root, [])
    for relpath, returns in files.items():
        (root / relpath).write_text(
            "".join(
                f"def {name}():\n    return {n}\n\n\n" for name, n in returns.items()
            )
        )
    return VllmTree.open(root)


# The drifted patch, one that requires it, a fix whose companion it is, one
# that stands alone, and one that requires the one standing alone.
SERIES = [
    _Toy("drifts"),
    _Toy("builds_on", requires=("drifts",)),
    _Toy("fix", companions=("drifts",)),
    _Toy("alone"),
    _Toy("after_alone", requires=("alone",)),
]
RETURNS = {"drifts": 7, "builds_on": 0, "fix": 0, "alone": 0, "after_alone": 0}


def test_the_drifted_one_and_what_waits_for_it_are_left_out(tmp_path: Path) -> None:
    tree = toy_tree(tmp_path / "t", {"vllm/toy.py": RETURNS})
    before = support.snapshot(tree.root)
    refused = apply_tree(tree, SERIES, {p.id for p in SERIES}, WRITE)
    assert refused.exit_code == 2 and refused.written == []
    assert support.snapshot(tree.root) == before

    result = apply_tree(tree, SERIES, {p.id for p in SERIES}, WRITE, skip_drifted=True)
    assert result.exit_code == 0
    assert result.written == ["vllm/toy.py"]
    assert result.applied_now == ["alone", "after_alone"]
    left = {out.patch_id: out for out in result.left_out}
    assert list(left) == ["drifts", "builds_on", "fix"]
    drifted = left["drifts"]
    assert (drifted.state, drifted.path, drifted.line) == (
        PatchState.DRIFTED,
        "vllm/toy.py",
        1,
    )
    assert drifted.reason == "returns 7"
    assert left["builds_on"].waits_for == ("drifts",)
    assert left["builds_on"].reason == "requires drifts, which is left out"
    assert left["fix"].reason == (
        "ships only with its companion drifts, which is left out"
    )
    assert left["fix"].state is PatchState.NEEDED and left["fix"].path is None
    states = {
        r.patch.id: r.state for r in plan_tree(tree, SERIES, rewrite=False).reports
    }
    assert states == {
        "drifts": PatchState.DRIFTED,
        "builds_on": PatchState.NEEDED,
        "fix": PatchState.NEEDED,
        "alone": PatchState.APPLIED,
        "after_alone": PatchState.APPLIED,
    }


def test_check_and_dry_run_leave_out_the_same(tmp_path: Path) -> None:
    tree = toy_tree(tmp_path / "t", {"vllm/toy.py": RETURNS})
    before = support.snapshot(tree.root)
    ids = {p.id for p in SERIES}
    check = apply_tree(tree, SERIES, ids, CHECK, skip_drifted=True)
    dry = apply_tree(tree, SERIES, ids, DRY_RUN, skip_drifted=True)
    for result in (check, dry):
        assert [out.patch_id for out in result.left_out] == [
            "drifts",
            "builds_on",
            "fix",
        ]
        assert [r.patch.id for r in result.plan.needed] == ["alone", "after_alone"]
    assert check.exit_code == 1  # --check: patches are needed
    assert dry.exit_code == 0 and dry.written == []
    assert [e.patch_ids for e in dry.plan.edits] == [["alone", "after_alone"]]
    assert support.snapshot(tree.root) == before


def test_a_partly_needed_patch_left_out_leaves_no_half_rewrite(tmp_path: Path) -> None:
    """Needed in one file, drifted in another: its rewrite of the first file
    is not written, and the patch after it in that file is planned on the
    code without it."""
    both = ("vllm/a.py", "vllm/b.py")
    series = [_Toy("half", paths=both), _Toy("alone", paths=both)]
    tree = toy_tree(
        tmp_path / "t",
        {"vllm/a.py": {"half": 0, "alone": 0}, "vllm/b.py": {"half": 3}},
    )
    result = apply_tree(tree, series, {"half", "alone"}, WRITE, skip_drifted=True)
    assert [out.patch_id for out in result.left_out] == ["half"]
    assert result.left_out[0].path == "vllm/b.py"
    assert result.written == ["vllm/a.py"]
    assert [e.patch_ids for e in result.plan.edits] == [["alone"]]
    text = (tree.root / "vllm/a.py").read_text()
    assert "def half():\n    return 0" in text
    assert "def alone():\n    return 1" in text


def test_the_drift_hint_skips_every_drifted_patch_and_what_needs_it(
    tmp_path: Path,
) -> None:
    returns = {**RETURNS, "alone": 5}  # a second drifted patch
    tree = toy_tree(tmp_path / "t", {"vllm/toy.py": returns})
    plan = plan_tree(tree, SERIES, {p.id for p in SERIES}, rewrite=False)
    error = drift_error(plan, "apply")
    skips = "--skip drifts --skip alone --skip builds_on --skip fix --skip after_alone"
    assert skips in (error.hint or ""), error.hint
    assert "--skip-drifted" in (error.hint or "")
    # Commands without --skip-drifted do not suggest it.
    assert "--skip-drifted" not in (drift_error(plan, "export").hint or "")


# -- the command line, on the built-in series ---------------------------------------

MODEL = "vllm/model_executor/models/granite4_vision.py"
QWEN = "vllm/model_executor/models/qwen3_vl.py"


@pytest.fixture
def batch_tree(tmp_path: Path) -> Path:
    """vllm#40917 drifted (its slice bounded otherwise); vllm#43617 needed."""
    root = tmp_path / "tree"
    (root / "vllm/model_executor/models").mkdir(parents=True)
    (root / "vllm/__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (root / MODEL).write_text(granite.SLICED_OTHERWISE)
    (root / QWEN).write_text(resize.BEFORE)
    return root


def test_apply_skip_drifted_writes_the_rest_and_names_the_drifted_one(
    batch_tree: Path,
) -> None:
    plain = CliRunner().invoke(main, ["apply", "--vllm-src", str(batch_tree)])
    assert plain.exit_code == 2
    assert "--skip vllm#40917 (or --skip-drifted" in plain.stderr, plain.stderr
    granite_before = (batch_tree / MODEL).read_bytes()
    result = CliRunner().invoke(
        main, ["apply", "--vllm-src", str(batch_tree), "--skip-drifted"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = lines.index("left out, not written: 1 drifted")
    assert lines[at + 1].startswith(f"  vllm#40917 drifted at {MODEL}:5: "), lines
    assert "applied now vllm#43617; wrote 1 file(s):" in result.stdout
    assert "skipped (not selected)" not in result.stdout
    assert (batch_tree / MODEL).read_bytes() == granite_before
    assert "_resize_deepstack_input_embeds" in (batch_tree / QWEN).read_text()
    again = CliRunner().invoke(
        main, ["apply", "--vllm-src", str(batch_tree), "--skip-drifted"]
    )
    assert again.exit_code == 0
    assert (
        "nothing to do: every other selected patch is applied or not applicable"
        in again.stdout
    )


@pytest.mark.parametrize(
    ("flags", "code"),
    [([], 0), (["--dry-run"], 0), (["--check"], 1), (["--dry-run", "--check"], 1)],
)
def test_skip_drifted_json_lists_what_it_left_out(
    batch_tree: Path, flags: list[str], code: int
) -> None:
    before = support.snapshot(batch_tree)
    args = ["apply", "--vllm-src", str(batch_tree), "--skip-drifted", *flags]
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == code, result.output
    document = json.loads(result.stdout)
    assert errors("apply", document) == []
    (left,) = document["left_out"]
    assert left["id"] == "vllm#40917" and left["state"] == "drifted"
    assert (left["path"], left["line"], left["waits_for"]) == (MODEL, 5, [])
    assert left["reason"]
    assert "error" not in document
    (granite_patch,) = [p for p in document["patches"] if p["id"] == "vllm#40917"]
    assert granite_patch["selected"] is False
    if flags:
        assert support.snapshot(batch_tree) == before
    else:
        assert document["written"] == [QWEN]
    if "--dry-run" in flags:
        assert f"+++ b/{QWEN}" in document["diff"] and MODEL not in document["diff"]
        text = CliRunner().invoke(main, args)
        assert text.exit_code == code
        assert text.stdout.startswith(f"diff --git a/{QWEN}")
        assert "left out, not written: 1 drifted" in text.stderr


def test_apply_commit_skip_drifted_commits_the_rest(batch_tree: Path) -> None:
    for git in (["init", "-q"], ["add", "."], ["commit", "-qm", "vLLM"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *git],
            cwd=batch_tree,
            check=True,
        )
    result = CliRunner().invoke(
        main,
        ["apply", "--vllm-src", str(batch_tree), "--commit", "--skip-drifted"],
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )
    assert result.exit_code == 0, result.output
    assert "left out, not written: 1 drifted" in result.stdout
    log = subprocess.run(
        ["git", "log", "--format=%s", "--name-only"],
        cwd=batch_tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert QWEN in log and MODEL not in log.split("vLLM")[0], log

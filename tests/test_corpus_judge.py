"""The derive corpus's judge (bench/corpus_judge.py) finds what it says it
finds: the corpus's "wrong: 0" (docs/derived-vs-series.md) is only worth
something if each of its checks can say wrong.

Synthetic files only: a made-up ``vllm`` package in a temporary folder, a
"commit" that changes one function, and writes that are right, or wrong in
each way the judge looks for.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import corpus_judge  # noqa: E402

PATH = "vllm/layers.py"
PARENT = (
    "import os\n\nfrom vllm.helpers import scale\n\n\ndef f(x):\n"
    "    return scale(x)\n\n\ndef g():\n    return os.sep\n"
)
FIXED = PARENT.replace("import scale", "import clamp, scale").replace(
    "return scale(x)", "return clamp(scale(x))"
)
#: The release: the parent with a vendor's line at the end, so that git
#: apply's context still matches and a 3-way merge is clean.
RELEASE = PARENT + "\n\nLIMIT = 4\n"
HELPERS = "def scale(x):\n    return 2 * x\n\n\ndef clamp(x):\n    return min(x, 4)\n"


def _diff(tmp_path: Path) -> str:
    for name, text in (("a", PARENT), ("b", FIXED)):
        (tmp_path / name / "vllm").mkdir(parents=True)
        (tmp_path / name / PATH).write_text(text)
    result = subprocess.run(
        ["git", "diff", "--no-index", "a/vllm/layers.py", "b/vllm/layers.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    return result.stdout.replace("a/a/", "a/").replace("b/b/", "b/")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[corpus_judge.Commit, Path, Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tree = tmp_path / "release"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("")
    (tree / "vllm" / "helpers.py").write_text(HELPERS)
    (tree / PATH).write_text(RELEASE)
    commit = corpus_judge.Commit(
        sha="0" * 40,
        patch_id="local#1",
        paths=[PATH],
        diff=_diff(tmp_path / "diff"),
        parent_text={PATH: PARENT},
        commit_text={PATH: FIXED},
    )
    pristine = corpus_judge._copy_files(tree, [PATH], tmp_path / "pristine")
    return commit, tree, pristine


def _written(tmp_path: Path, text: str) -> Path:
    ours = tmp_path / "ours"
    (ours / "vllm").mkdir(parents=True, exist_ok=True)
    (ours / PATH).write_text(text)
    return ours


def test_the_release_takes_the_diff(setup, tmp_path: Path) -> None:
    commit, tree, pristine = setup
    git = corpus_judge._copy_files(tree, [PATH], tmp_path / "git")
    assert corpus_judge._git_apply(git, commit.diff, "--check")
    assert not corpus_judge._git_apply(git, commit.diff, "--check", "-R")


def test_a_right_write_beyond_git_apply_has_nothing_wrong(setup, tmp_path) -> None:
    commit, tree, pristine = setup
    right = RELEASE.replace("import scale", "import clamp, scale").replace(
        "return scale(x)", "return clamp(scale(x))"
    )
    ours = _written(tmp_path, right)
    assert corpus_judge._beyond_wrongs(commit, tree, pristine, ours, PATH) == []


@pytest.mark.parametrize(
    ("written", "wrong"),
    [
        # Code that does not compile.
        (RELEASE.replace("return scale(x)", "return clamp(scale(x)"), "compile"),
        # A name nothing defines (the import was not added).
        (RELEASE.replace("return scale(x)", "return clamp(scale(x))"), "F821"),
        # An import of a name the release's module lacks.
        (
            RELEASE.replace("import scale", "import scale, squash").replace(
                "return scale(x)", "return squash(scale(x))"
            ),
            "lacks it here",
        ),
        # An import of a module the release lacks.
        (
            "from vllm.gone import clamp\n"
            + RELEASE.replace("return scale(x)", "return clamp(scale(x))"),
            "which this release lacks",
        ),
        # Compiles and resolves, but is not what a clean 3-way merge gives.
        (
            RELEASE.replace("import scale", "import clamp, scale").replace(
                "return scale(x)", "return scale(clamp(x))"
            ),
            "3-way merge",
        ),
    ],
    ids=["syntax", "undefined-name", "missing-name", "missing-module", "merge"],
)
def test_each_check_says_wrong(setup, tmp_path, written: str, wrong: str) -> None:
    commit, tree, pristine = setup
    ours = _written(tmp_path, written)
    found = corpus_judge._beyond_wrongs(commit, tree, pristine, ours, PATH)
    assert any(wrong in line for line in found), found


def test_a_write_unlike_git_apply_is_wrong_and_a_refusal_is_counted(
    setup, tmp_path
) -> None:
    commit, tree, pristine = setup
    git = corpus_judge._copy_files(tree, [PATH], tmp_path / "git")
    corpus_judge._git_apply(git, commit.diff)
    other = RELEASE.replace("return scale(x)", "return scale(x) + 0")
    cell = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    cell.written, cell.git_forward = [PATH], True
    ours = _written(tmp_path, other)
    assert corpus_judge._verdict(cell, commit, tree, pristine, ours, git) == "wrong"
    assert cell.wrong == [f"{PATH}: not the AST of git apply's result"]

    same = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    same.written, same.git_forward = [PATH], True
    verdict = corpus_judge._verdict(same, commit, tree, pristine, git, git)
    assert verdict == "same"

    refused = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    refused.state, refused.git_forward = "drifted", True
    verdict = corpus_judge._verdict(refused, commit, tree, pristine, ours, git)
    assert verdict == "refused-where-git-applies"

    applied = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    applied.state, applied.git_forward = "applied", True
    verdict = corpus_judge._verdict(applied, commit, tree, pristine, ours, git)
    assert verdict == "applied-wrongly"

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
import runtime_checks  # noqa: E402

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
    return _diff_of(tmp_path, PARENT, FIXED)


def _diff_of(tmp_path: Path, parent: str, fixed: str) -> str:
    for name, text in (("a", parent), ("b", fixed)):
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


# -- the checks of what a write reads at run time (issue 34 item 7) ----------

CONFIG = (
    "class ModelConfig:\n    def __init__(self):\n        self.is_pooling = False\n"
)
ENVS = (
    "import os\nfrom typing import TYPE_CHECKING, Any, Callable\n\n"
    "if TYPE_CHECKING:\n    VLLM_TYPED: bool = False\n\n"
    "environment_variables: dict[str, Callable[[], Any]] = {\n"
    '    "VLLM_TYPED": lambda: False,\n'
    '    "VLLM_LISTED": lambda: os.getenv("VLLM_LISTED"),\n}\n\n\n'
    "def __getattr__(name: str):\n"
    "    if name in environment_variables:\n"
    "        return environment_variables[name]()\n"
    '    raise AttributeError(f"no {name}")\n'
)
USER = "vllm/sampling.py"
USER_BEFORE = (
    "import torch\n\nimport vllm.envs as envs\n"
    "from vllm.config import ModelConfig\n\n\n"
    "def check(config: ModelConfig, x) -> bool:\n"
    "    if envs.VLLM_TYPED:\n        return torch.any(x)\n"
    "    return config.is_pooling\n"
)


@pytest.fixture
def runtime_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "release"
    for path, text in {
        "vllm/__init__.py": "",
        "vllm/config.py": CONFIG,
        "vllm/envs.py": ENVS,
        USER: USER_BEFORE,
        "vllm/other.py": "def f(t):\n    return t.narrow(0, 0, 2)\n\n\n"
        # torch's private set, read as vllm#42481's release reads it
        'def h(m):\n    return getattr(m, "_buffers_set", set())\n',
    }.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    return tree


def _write(tmp_path: Path, tree: Path, after: str) -> tuple[Path, Path]:
    pristine = corpus_judge._copy_files(tree, [USER], tmp_path / "pristine")
    ours = tmp_path / "ours"
    (ours / USER).parent.mkdir(parents=True, exist_ok=True)
    (ours / USER).write_text(after)
    return pristine, ours


@pytest.mark.skipif(
    not runtime_checks.ty_available(), reason="ty is not installed (pip install ty)"
)
def test_the_type_check_says_wrong_on_a_new_error_only(runtime_tree, tmp_path) -> None:
    """vllm#45468's shape: the fix reads a field the release's class lacks.
    ty's new error makes the write wrong; an error the release's file has
    already, an unresolved third-party import, and an error on a line its
    author marked ``# type: ignore[...]`` (mypy's codes), do not."""
    broken = USER_BEFORE.replace("config.is_pooling", "config.is_diffusion")
    pristine, ours = _write(tmp_path, runtime_tree, broken)
    wrongs = runtime_checks.type_wrongs(runtime_tree, ours, [USER])
    assert wrongs == [
        f"{USER}: ty missing-attribute: Object of type `ModelConfig` has no "
        "attribute `is_diffusion`"
    ], wrongs
    right = USER_BEFORE.replace(
        "return config.is_pooling",
        "return not config.is_pooling or config.is_diffusion  # type: ignore[attr]",
    )
    (ours / USER).write_text("import numpy\n" + right)
    assert runtime_checks.type_wrongs(runtime_tree, ours, [USER]) == []


def test_the_envs_check_says_wrong_on_an_undeclared_name(
    runtime_tree, tmp_path
) -> None:
    """vllm#51997's shape: ``envs.X`` that the release's vllm/envs.py does not
    declare (its module ``__getattr__`` hides it from a type checker); a
    name in the dict only, or in the TYPE_CHECKING block, is declared."""
    broken = USER_BEFORE.replace("envs.VLLM_TYPED", "envs.VLLM_MAX_STOP_STRINGS")
    pristine, ours = _write(tmp_path, runtime_tree, broken)
    assert runtime_checks.envs_wrongs(runtime_tree, pristine, ours, [USER]) == [
        f"{USER}: reads envs.VLLM_MAX_STOP_STRINGS, which this release's "
        "vllm/envs.py does not declare"
    ]
    listed = USER_BEFORE.replace("envs.VLLM_TYPED", "envs.VLLM_LISTED")
    (ours / USER).write_text(listed)
    assert runtime_checks.envs_wrongs(runtime_tree, pristine, ours, [USER]) == []
    from_import = "from vllm.envs import VLLM_GONE\n" + USER_BEFORE
    (ours / USER).write_text(from_import)
    assert runtime_checks.envs_wrongs(runtime_tree, pristine, ours, [USER]) == [
        f"{USER}: reads envs.VLLM_GONE, which this release's vllm/envs.py does "
        "not declare"
    ]


def test_the_attribute_check_says_wrong_on_a_name_defined_nowhere(
    runtime_tree, tmp_path
) -> None:
    """vllm#43482's shape: ``self.model.fc_norm`` on an object nothing types.
    A name the release defines nowhere and reads nowhere is wrong; one it
    reads elsewhere (a tensor's method) is only noted; one it defines (a
    field), a method of a builtin or standard library class (a stream's
    ``isatty``), or one the write asks ``hasattr`` of first, is fine; a
    ``getattr(m, "NAME", ...)`` in the release is a read of it."""
    broken = USER_BEFORE.replace("config.is_pooling", "config.fc_norm")
    pristine, ours = _write(tmp_path, runtime_tree, broken)
    wrongs, external = runtime_checks.attribute_wrongs(
        runtime_tree, pristine, ours, [USER]
    )
    assert wrongs == [
        f"{USER}: reads the attribute `fc_norm`, which this release defines "
        "nowhere (and reads nowhere) under vllm/"
    ]
    assert external == []
    fine = USER_BEFORE.replace(
        "return torch.any(x)",
        "return x.narrow(0, 0, 1) or str(x).strip() or sys.stdout.isatty()",
    ).replace(
        "return config.is_pooling",
        "return config.is_pooling or config.scale or config._buffers_set or "
        '(hasattr(config, "fc_gate") and config.fc_gate)',
    )
    (ours / USER).write_text(fine + "\n\ndef g(c):\n    c.scale = 1\n")
    wrongs, external = runtime_checks.attribute_wrongs(
        runtime_tree, pristine, ours, [USER]
    )
    assert (wrongs, external) == (
        [],
        [
            f"{USER}: ._buffers_set (read elsewhere, defined nowhere)",
            f"{USER}: .narrow (read elsewhere, defined nowhere)",
        ],
    )


def test_what_a_standard_library_class_sets_on_itself_is_defined(
    runtime_tree, tmp_path
) -> None:
    """vllm#33992 on 0.16.0 reads ``spec.origin`` off what
    ``importlib.util.find_spec`` returns: ``ModuleSpec`` sets ``origin`` in
    its ``__init__``, so the class's ``dir`` lacks it; the judge reads the
    standard library's sources for what their classes set on ``self``."""
    reads = USER_BEFORE.replace(
        "return config.is_pooling",
        "return config.is_pooling or config.origin or config._option_string_actions",
    )
    pristine, ours = _write(tmp_path, runtime_tree, reads)
    assert runtime_checks.attribute_wrongs(runtime_tree, pristine, ours, [USER]) == (
        [],
        [],
    )
    assert "origin" not in dir(__import__("importlib.machinery").machinery.ModuleSpec)


def test_a_write_that_keeps_an_import_git_apply_drops_is_beyond(
    setup, tmp_path
) -> None:
    """vllm#50533 on 0.25.1: the commit drops an import the release still
    uses in another function. git apply's result reads a name it no longer
    has; the write that keeps the import is judged by the beyond checks, not
    held to git apply's AST. A write as broken as git apply's stays wrong."""
    commit, tree, _ = setup
    parent = PARENT.replace("import scale", "import clamp, scale")
    fixed = parent.replace("import clamp, scale", "import clamp").replace(
        "return scale(x)", "return clamp(x)"
    )
    commit.diff = _diff_of(tmp_path / "drop", parent, fixed)
    commit.parent_text, commit.commit_text = {PATH: parent}, {PATH: fixed}
    release = parent + "\n\nLIMIT = 4\n\n\ndef h(x):\n    return scale(x)\n"
    (tree / PATH).write_text(release)
    pristine = corpus_judge._copy_files(tree, [PATH], tmp_path / "pristine2")
    git = corpus_judge._copy_files(tree, [PATH], tmp_path / "git")
    assert corpus_judge._git_apply(git, commit.diff)
    kept = release.replace(
        "    return scale(x)\n\n\ndef g", "    return clamp(x)\n\n\ndef g"
    )
    assert kept != release
    cell = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    cell.written, cell.git_forward = [PATH], True
    ours = _written(tmp_path / "a", kept)
    verdict = corpus_judge._verdict(cell, commit, tree, pristine, ours, git)
    assert cell.git_broken == [PATH]
    assert cell.checks["ast"] == "ok" and cell.checks["beyond"] == "ok", cell.wrong
    assert verdict == "beyond"
    # The same write with the import dropped, as git apply drops it.
    broken = kept.replace("import clamp, scale", "import clamp").replace(
        "LIMIT = 4", "LIMIT = 5"
    )
    other = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    other.written, other.git_forward = [PATH], True
    ours = _written(tmp_path / "b", broken)
    assert corpus_judge._verdict(other, commit, tree, pristine, ours, git) == "wrong"
    assert other.git_broken == []
    assert f"{PATH}: not the AST of git apply's result" in other.wrong


def test_text_not_kept_is_its_own_verdict(setup, tmp_path) -> None:
    """Where git apply applies: the same text is ``same``; the same AST with
    other text (quotes, a comment dropped) is ``same-ast``, the ``text``
    check saying wrong and where."""
    commit, tree, pristine = setup
    git = corpus_judge._copy_files(tree, [PATH], tmp_path / "git")
    corpus_judge._git_apply(git, commit.diff)
    commented = (git / PATH).read_text().replace("import os", "import os  # a comment")
    ours = _written(tmp_path, commented)
    cell = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    cell.written, cell.git_forward = [PATH], True
    assert corpus_judge._verdict(cell, commit, tree, pristine, ours, git) == "same-ast"
    assert cell.checks["ast"] == "ok" and cell.checks["text"] == "wrong"
    assert cell.text_differs == [
        f"{PATH}:1: 'import os  # a comment', not git apply's line"
    ]
    assert cell.wrong == []


def test_a_write_git_apply_makes_too_is_wrong_if_it_cannot_run(
    runtime_tree, tmp_path
) -> None:
    """vllm#45468: git apply writes the same code, which reads a name the
    release lacks. The judge holds the write to the release, not to git
    apply: the cell is wrong, whatever git apply does."""
    broken = USER_BEFORE.replace("config.is_pooling", "config.fc_norm")
    pristine, ours = _write(tmp_path, runtime_tree, broken)
    diff_root = tmp_path / "diff"
    for name, text in (("a", USER_BEFORE), ("b", broken)):
        (diff_root / name / USER).parent.mkdir(parents=True)
        (diff_root / name / USER).write_text(text)
    diff = subprocess.run(
        ["git", "diff", "--no-index", f"a/{USER}", f"b/{USER}"],
        cwd=diff_root, capture_output=True, text=True,
    ).stdout.replace("a/a/", "a/").replace("b/b/", "b/")  # fmt: skip
    commit = corpus_judge.Commit(
        "1" * 40, "local#2", [USER], diff, {USER: USER_BEFORE}, {USER: broken}
    )
    git = corpus_judge._copy_files(runtime_tree, [USER], tmp_path / "git")
    assert corpus_judge._git_apply(git, diff)
    cell = corpus_judge.Cell(commit.sha, commit.patch_id, "0.0.1")
    cell.written, cell.git_forward = [USER], True
    verdict = corpus_judge._verdict(cell, commit, runtime_tree, pristine, git, git)
    assert verdict == "wrong"
    assert cell.checks["ast"] == "ok" and cell.checks["attributes"] == "wrong"
    assert cell.checks["envs"] == "ok"

"""A tree's glob finds what ``Path.glob`` finds, links and hidden folders included."""

from __future__ import annotations

import os
from pathlib import Path

from deepstack_patch.engine.tree import VllmTree, glob_matcher

PATTERNS = [
    "vllm/models/**/*.py",
    "vllm/models/*.py",
    "vllm/**/*.py",
    "**/*.py",
    "vllm/models/a/*.py",
    "vllm/models/*/*.py",
    "vllm/models/linkfile.py",
    "vllm/models/broken.py",
    "vllm/models/??.py",
]


def test_glob_agrees_with_pathlib(tmp_path: Path) -> None:
    for folder in ["vllm/models/a/.hidden", "vllm/models/b", "outside"]:
        (tmp_path / folder).mkdir(parents=True)
    for name in [
        "vllm/__init__.py",
        "vllm/models/x.py",
        "vllm/models/ab.py",
        "vllm/models/a/y.py",
        "vllm/models/a/.hidden/z.py",
        "vllm/models/.dot.py",
        "vllm/models/b/notes.txt",
        "outside/o.py",
    ]:
        (tmp_path / name).write_text("")
    models = tmp_path / "vllm" / "models"
    os.symlink("../../outside", models / "linkdir")
    os.symlink("../../outside", models / "dirlink.py")
    os.symlink("../../outside/o.py", models / "linkfile.py")
    os.symlink("nowhere.py", models / "broken.py")
    tree = VllmTree.open(tmp_path)
    compared = 0
    for pattern in PATTERNS:
        expected = sorted(
            path.relative_to(tmp_path).as_posix()
            for path in tmp_path.glob(pattern)
            if path.is_file() or path.is_symlink()
        )
        assert tree.glob((pattern,)) == expected, pattern
        compared += len(expected)
    assert compared > 20


def test_glob_matcher_picks_what_glob_finds(tmp_path: Path) -> None:
    """``glob_matcher`` chooses archive members before there is a tree: on
    regular files it agrees with ``VllmTree.glob``, pattern by pattern and
    for the series' patterns together."""
    from deepstack_patch.patches import SERIES

    names = [
        "vllm/__init__.py",
        "vllm/models/x.py",
        "vllm/models/ab.py",
        "vllm/models/a/y.py",
        "vllm/models/a/.hidden/z.py",
        "vllm/models/.dot.py",
        "vllm/models/b/notes.txt",
        "vllm/model_executor/models/qwen3_vl.py",
        "vllm/model_executor/models/deep/er.py",
        "vllm/config/compilation.py",
        "vllm/config/sub/no.py",
        "vllm/v1/sample/ops/logprobs.py",
        "outside/o.py",
    ]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    tree = VllmTree.open(tmp_path)
    series_patterns = [pattern for patch in SERIES for pattern in patch.paths]
    compared = 0
    for patterns in [*([p] for p in PATTERNS), series_patterns]:
        matches = glob_matcher(patterns)
        assert matches is not None
        assert sorted(n for n in names if matches(n)) == tree.glob(patterns), patterns
        compared += len(tree.glob(patterns))
    assert compared > 20
    assert glob_matcher(["vllm/[ab]*.py"]) is None

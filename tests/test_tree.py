"""A tree's glob finds what ``Path.glob`` finds, links and hidden folders included."""

from __future__ import annotations

import os
from pathlib import Path

from deepstack_patch.engine.tree import VllmTree

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

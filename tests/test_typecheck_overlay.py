"""The folders ty runs in are laid over again from one run to the next
(engine/derived/tyfolders.py, ``Folder``): each must read, for ty, as the
folder a fresh overlay of the same files makes: the same files with the
same bytes, the same folders, and no folder the tree lacks left behind by
an earlier run (a namespace package ty would find)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from deepstack_patch.engine.derived.tyfolders import Folder, overlay

TREE = {
    "vllm/__init__.py": b"",
    "vllm/config.py": b"LIMIT = 1\n",
    "vllm/models/__init__.py": b"",
    "vllm/models/a.py": b"A = 1\n",
    "vllm/models/b.py": b"B = 1\n",
    "vllm/v1/worker/runner.py": b"R = 1\n",
    "setup.py": b"",
}
#: What runs may lay: the tree's files changed, and files the tree lacks (a
#: module a fix adds, in a folder of its own).
LAYABLE = [
    "vllm/config.py",
    "vllm/models/a.py",
    "vllm/v1/worker/runner.py",
    "vllm/models/new.py",
    "vllm/added/__init__.py",
    "vllm/added/deep/mod.py",
]


def listing(out: Path) -> dict[str, object]:
    """What ty reads under ``out``, links followed: each folder, and each
    file's bytes (a folder made for an earlier run, holding links to every
    entry of the tree's, reads as the link to it a fresh overlay makes)."""
    found: dict[str, object] = {}
    for folder, dirs, names in os.walk(out, followlinks=True):
        for name in dirs:
            found[(Path(folder) / name).relative_to(out).as_posix()] = "folder"
        for name in names:
            path = Path(folder) / name
            found[path.relative_to(out).as_posix()] = path.read_bytes()
    return found


def test_a_folder_laid_over_again_is_a_fresh_overlay(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for relpath, raw in TREE.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(raw)
    chance = random.Random(41)  # every run lays one file at least: its own
    folder = Folder(root, tmp_path / "reused")
    for run in range(60):
        files = {
            relpath: f"# run {run}\n".encode() * chance.randint(1, 2)
            for relpath in chance.sample(LAYABLE, chance.randint(1, len(LAYABLE)))
        }
        folder.lay(files)
        fresh = tmp_path / f"fresh{run}"
        overlay(root, fresh, files)
        assert listing(folder.out) == listing(fresh), (run, sorted(files))

"""One cache folder for every layer: DEEPSTACK_PATCH_CACHE reaches them all."""

from __future__ import annotations

from pathlib import Path

import pytest
from deepstack_patch.engine.cache import cache_dir
from deepstack_patch.engine.transaction import tree_lock


def test_tree_lock_file_lands_under_deepstack_patch_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(cache))
    tree = tmp_path / "tree"
    tree.mkdir()
    with tree_lock(tree):
        held = list((cache / "locks").glob("*.lock"))
    assert len(held) == 1, held
    assert cache_dir() == cache
    assert not any(tree.iterdir())  # the tree gains no stray file


def test_fetch_proof_and_vendor_share_the_engine_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepstack_patch.fetch.releases import cache_dir as fetch_cache
    from deepstack_patch.proof.envs import envs_dir

    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path))
    assert fetch_cache() == tmp_path
    assert envs_dir() == tmp_path / "envs"

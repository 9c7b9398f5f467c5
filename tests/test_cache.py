"""One cache folder for every layer: DEEPSTACK_PATCH_CACHE reaches them all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deepstack_patch.engine.cache import cache_dir
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.locks import tree_lock


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


@pytest.mark.parametrize("xdg", [None, "", "/srv/cache", "/srv/cache/"])
def test_user_cache_dir_is_the_one_platformdirs_gives(
    xdg: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import platformdirs
    from deepstack_patch.engine.cache import user_cache_dir

    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert user_cache_dir() == platformdirs.user_cache_dir("deepstack-patch")


def test_a_relative_xdg_cache_home_is_ignored_as_the_spec_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deepstack_patch.engine.cache import user_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert user_cache_dir() == os.path.expanduser("~/.cache/deepstack-patch")


def test_an_empty_deepstack_patch_cache_means_the_user_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", "")
    assert cache_dir() == tmp_path / "deepstack-patch"


def test_a_second_lock_on_a_tree_is_refused_at_once_and_freed_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    with tree_lock(tree):
        with pytest.raises(DeepstackError) as raised, tree_lock(tree):
            pass
        assert "another deepstack-patch run is writing to" in raised.value.message
        with tree_lock(tmp_path / "other tree"):  # one lock per tree
            pass
    with tree_lock(tree):  # released when the first run ended
        pass


def test_one_folder_reached_by_two_paths_takes_one_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    tree.mkdir()
    (tmp_path / "link").symlink_to(tree)
    (tmp_path / "other").mkdir()
    with tree_lock(tree):
        with pytest.raises(DeepstackError), tree_lock(tmp_path / "link"):
            pass
        with tree_lock(tmp_path / "other"):
            pass


def test_a_cache_where_no_lock_can_be_made_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "locks").write_text("a file where the lock folder goes")
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(cache))
    with pytest.raises(DeepstackError) as raised, tree_lock(tmp_path / "tree"):
        pass
    assert "cannot create the lock file" in raised.value.message
    assert "DEEPSTACK_PATCH_CACHE" in raised.value.hint

"""Reading the files a plan considers (:mod:`.plan`): from a vLLM tree,
each read whole, once, and only from inside the tree."""

from __future__ import annotations

import os

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.tree import VllmTree


def read_candidate(root: str, relpath: str) -> bytes:
    # Every file of the patches' globs is read (about 400 on a release): an
    # unbuffered read of the whole file takes half the time of pathlib's.
    try:
        with open(os.path.join(root, relpath), "rb", buffering=0) as handle:
            return handle.readall()
    except FileNotFoundError:
        raise DeepstackError(
            f"{relpath}: cannot read: no such file (a dangling symlink, or the "
            "file vanished during the run)",
            "restore the file from the release, or remove the broken link",
        ) from None
    except OSError as exc:
        raise DeepstackError(
            f"{relpath}: cannot read: {exc.strerror}",
            "check the file's permissions",
        ) from None


def check_inside(tree: VllmTree, relpath: str, real_dirs: dict[str, str]) -> None:
    """Refuse a target that resolves outside the tree (through any symlink).

    ``real_dirs`` caches each folder's real path: a file's real path is its
    folder's real path plus its name unless the file itself is a link.
    """
    folder, _, name = relpath.rpartition("/")
    if folder not in real_dirs:
        real_dirs[folder] = os.path.realpath(tree.root / folder)
    path = os.path.join(real_dirs[folder], name)
    if os.path.islink(path):
        path = os.path.realpath(path)
    root = str(tree.root)
    if path != root and not path.startswith(root + os.sep):
        link = _first_link(tree.root, relpath)
        raise DeepstackError(
            f"{link}: is a symlink to {os.path.realpath(tree.root / link)}, "
            f"outside the tree {root}",
            "replace the link with a copy of what it points to, or patch the "
            "tree it points into",
        )


def _first_link(root: os.PathLike[str], relpath: str) -> str:
    """The outermost part of ``relpath`` that is a symlink (a folder, or the file)."""
    parts = relpath.split("/")
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        if os.path.islink(os.path.join(root, prefix)):
            return prefix + ("/" if depth < len(parts) else "")
    return relpath


def refuse_unrecognised_tree(tree: VllmTree, globbed: dict[str, list[str]]) -> None:
    """A folder with no version and none of the series' files is not a vLLM
    tree (a stray ``vllm/__init__.py``): every patch would be not-applicable
    and every check would pass. A release that is too old for every patch
    has its version, and stays "nothing to do"."""
    if tree.version_source != "unknown" or any(globbed.values()):
        return
    patterns = [*globbed]
    shown = ", ".join(patterns[:3]) + (", ..." if len(patterns) > 3 else "")
    raise DeepstackError(
        f"{tree.root}: not a vLLM tree: no version (no PKG-INFO, vllm/_version.py "
        f"or git tag) and none of the files the patches look for ({shown})",
        "pass the root of a vLLM source tree: a git checkout with its tags "
        "(git fetch --tags), or an extracted vllm-X.Y.Z.tar.gz; or fetch a "
        "release with --release VERSION",
    )

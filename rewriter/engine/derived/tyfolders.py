"""Folders ``ty check`` runs in: the tree's ``vllm`` package as links, with
the files of one state of a check laid over it (:mod:`.typecheck` runs ty
there where a server cannot be told a state: a module a fix adds, a file
that is not UTF-8). Nothing is ever written into the tree: a file laid over
it replaces the link, and a folder on the way to one holds links to the
tree's other entries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class Folder:
    """A folder ty runs in: the tree's package, with some files laid over
    it (:func:`overlay`); laid over again for another run, it changes only
    the files the two runs lay differently."""

    def __init__(self, root: Path, out: Path) -> None:
        self.root, self.out = root, out
        self.laid: dict[str, bytes] | None = None

    def lay(self, files: Mapping[str, bytes]) -> None:
        if self.laid is None:
            overlay(self.root, self.out, files)
        else:
            for relpath in sorted(self.laid.keys() - files.keys()):
                restore(self.root, self.out, relpath)
            changed = {
                relpath: raw
                for relpath, raw in files.items()
                if self.laid.get(relpath) != raw
            }
            overlay(self.root, self.out, changed, fresh=False)
        self.laid = dict(files)


def restore(root: Path, out: Path, relpath: str) -> None:
    """``out``'s ``relpath`` as the tree has it again: a link to the tree's
    file, or nothing where the tree has none (and no folder the tree lacks
    that held it)."""
    target = out / relpath
    target.unlink()
    if (root / relpath).exists() or (root / relpath).is_symlink():
        target.symlink_to(root / relpath)
        return
    folder = target.parent
    while folder != out and not (root / folder.relative_to(out)).exists():
        if any(folder.iterdir()):
            break
        folder.rmdir()
        folder = folder.parent


def overlay(
    root: Path, out: Path, files: Mapping[str, bytes], *, fresh: bool = True
) -> None:
    """``out`` as the tree's package with each of ``files`` (relative path
    -> bytes) holding its bytes: every folder on the way to one is made, with
    links to its other entries (a few hundred links a folder at most); at
    the tree's root, only the folders on the way (the package)."""
    if fresh:
        out.mkdir(parents=True)
    made = {out}
    for relpath, text in sorted(files.items()):
        parts = relpath.split("/")
        source, target = root, out
        for part in parts[:-1]:
            source, target = source / part, target / part
            if target in made:
                continue
            if not fresh and target.is_dir() and not target.is_symlink():
                made.add(target)  # made for an earlier run: its links stand
                continue
            if target.is_symlink():  # linked with its parent's entries
                target.unlink()
            target.mkdir()
            made.add(target)
            for entry in sorted(os.listdir(source)) if source.is_dir() else []:
                (target / entry).symlink_to(source / entry)
        file = target / parts[-1]
        if file.is_symlink():  # never written through, into the tree
            file.unlink()
        file.write_bytes(text)

"""Runs of ``ty check``, each in a folder that holds the tree's ``vllm``
package as links, with the files of one state of a check laid over it
(:mod:`.typecheck` runs ty there where a server cannot be told a state: a
module a fix adds, a file that is not UTF-8). Nothing is ever written into
the tree: a file laid over it replaces the link, and a folder on the way to
one holds links to the tree's other entries.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

#: How many runs of ty at once (each uses every core it finds).
RUNS_AT_ONCE = max(2, os.cpu_count() or 2)


class RunFailed(Exception):
    """A run of ty that gave no diagnostics: too slow, or it failed."""


def run_all(
    binary: str,
    config: Path,
    root: Path,
    work: Path,
    runs: Sequence[tuple[Mapping[str, bytes], Sequence[str]]],
    timeout: float,
) -> list[str | RunFailed]:
    """``ty check`` of each run's paths with its files laid over the tree
    (relative path -> bytes), with the settings ``config``, a few side by
    side in folders under ``work``: each run's concise output, or why it
    gave none."""

    def start(files: Mapping[str, bytes], paths: Sequence[str], folder: Folder):
        folder.lay(files)
        command = [
            binary, "check", "--config-file", str(config),
            "--output-format", "concise", "--no-progress", "--color", "never",
            *paths,
        ]  # fmt: skip
        return subprocess.Popen(
            command,
            cwd=folder.out,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )

    # A few folders, each laid over again for the next run it takes: a
    # folder of links per run cost a fifth of a first status of 40
    # derived fixes (27,000 links made and removed on 0.20.2).
    free = [Folder(root, work / f"view{n}") for n in range(RUNS_AT_ONCE)]
    running: list[tuple[int, subprocess.Popen[bytes], Folder]] = []
    outputs: list[str | RunFailed] = [RunFailed("not run")] * len(runs)
    waiting = list(enumerate(runs))
    while waiting or running:
        while waiting and free:
            (number, (files, paths)), folder = waiting.pop(0), free.pop()
            running.append((number, start(files, paths, folder), folder))
        number, run, folder = running.pop(0)
        outputs[number] = _output(run, timeout)
        free.append(folder)
    return outputs


def _output(run: subprocess.Popen[bytes], timeout: float) -> str | RunFailed:
    """A run's output, waited for; why it gave none."""
    try:
        out, err = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.kill()
        run.communicate()
        return RunFailed(f"ty took more than {timeout:.0f} s")
    if run.returncode not in (0, 1):  # 1: diagnostics found
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        return RunFailed(f"ty exited {run.returncode}: {tail[0]}")
    return out.decode(errors="replace")


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

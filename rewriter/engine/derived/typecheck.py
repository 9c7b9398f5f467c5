"""The type checker a derived patch's runtime names are checked with: ty
(pinned in pyproject.toml; vLLM configures it, ``[tool.ty]``), run on a
file as it is and as the fix leaves it, in the tree, and its verdicts cached.

:mod:`.runtime` decides what a new diagnostic means; this module only runs
ty and keeps what :mod:`.runtime` concluded, under a digest of everything
the verdict depends on (the file, the ``vllm`` modules ty can reach from it,
:mod:`.closure`; the patch's data, the engine's code and ty's version), so
it can never go stale.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The Python version the target is checked for (vLLM's oldest supported).
PYTHON_VERSION = "3.10"

#: How long ty may take on one file before the check gives up (refusing).
TIMEOUT_S = 120


@dataclass(frozen=True)
class Diagnostic:
    line: int
    rule: str
    message: str


class CheckerFailed(Exception):
    """ty could not check the file (missing, failed, too slow)."""


def diagnostics(
    root: Path,
    path: str,
    raw: bytes,
    fixed: bytes,
    others: Mapping[str, bytes] | None = None,
    added: Mapping[str, bytes] | None = None,
) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """ty on ``path`` as it is and as fixed, each in a folder of links to
    the tree's ``vllm`` package (the fixed file in place of its own, and
    ``others``, the files earlier patches of the series rewrote, in place of
    theirs), run side by side; ``added``: the other files the fix adds
    (relative path -> text), there in the fixed run."""
    binary = _ty_binary()
    with tempfile.TemporaryDirectory(prefix="deepstack-runtime-") as scratch:
        work = Path(scratch)
        # No third-party package: their types are unknown, never errors.
        (work / "env" / "lib" / f"python{PYTHON_VERSION}" / "site-packages").mkdir(
            parents=True
        )
        (work / "ty.toml").write_text("")  # not the tree's [tool.ty]
        runs = []
        for name, files in (
            ("before", {**(others or {}), path: raw}),
            ("after", {**(others or {}), **(added or {}), path: fixed}),
        ):
            _overlay(root, work / name, files)
            command = [
                binary, "check", "--config-file", str(work / "ty.toml"),
                "--python", str(work / "env"), "--python-version", PYTHON_VERSION,
                "--output-format", "concise", "--no-progress", "--color", "never",
                path,
            ]  # fmt: skip
            runs.append(
                subprocess.Popen(
                    command,
                    cwd=work / name,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                )
            )
        return _read(runs[0], path), _read(runs[1], path)


def _read(run: subprocess.Popen[bytes], path: str) -> list[Diagnostic]:
    try:
        out, err = run.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        run.kill()
        run.communicate()
        raise CheckerFailed(f"ty took more than {TIMEOUT_S} s") from None
    if run.returncode not in (0, 1):  # 1: diagnostics found
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise CheckerFailed(f"ty exited {run.returncode}: {tail[0]}")
    pattern = re.compile(re.escape(path) + r":(\d+):\d+: \w+\[([\w-]+)\] (.*)")
    return [
        Diagnostic(int(m[1]), m[2], m[3])
        for line in out.decode(errors="replace").splitlines()
        if (m := pattern.fullmatch(line))
    ]


def _overlay(root: Path, out: Path, files: Mapping[str, bytes]) -> None:
    """``out`` as the tree's package with each of ``files`` (relative path
    -> bytes) holding its bytes: every folder on the way to one is made, with
    links to its other entries (a few hundred links a folder at most); at
    the tree's root, only the folders on the way (the package)."""
    out.mkdir(parents=True)
    made = {out}
    for relpath, text in sorted(files.items()):
        parts = relpath.split("/")
        source, target = root, out
        for part in parts[:-1]:
            source, target = source / part, target / part
            if target in made:
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


def _ty_binary() -> str:
    try:
        from ty import find_ty_bin
    except ImportError:
        raise CheckerFailed(
            "ty is not installed (pip install deepstack-patch brings it)"
        ) from None
    try:
        return os.fsdecode(find_ty_bin())
    except FileNotFoundError as exc:
        raise CheckerFailed(f"ty's binary is missing: {exc}") from None


# -- the cache ---------------------------------------------------------------------


#: Bump when what is stored changes meaning.
_CACHE_SCHEMA = "2"  # 2: the names excused beside the problem


def cache_key(patch_data: bytes, path: str, raw: bytes, reads_digest: str) -> str:
    """The key of a verdict: everything it depends on (see the module);
    ``patch_data`` is the patch's data file's fingerprint, ``reads_digest``
    that of the modules ty can read (:meth:`.closure.ModuleIndex.digest`)."""
    digest = hashlib.sha256()
    for piece in (
        _CACHE_SCHEMA,
        _ty_version(),
        _engine_digest(),
        reads_digest,
        path,
        patch_data.hex(),
    ):
        digest.update(piece.encode() + b"\0")
    digest.update(raw)
    return digest.hexdigest()


@functools.cache
def _ty_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ty")
    except PackageNotFoundError:
        return "absent"


@functools.cache
def _engine_digest() -> str:
    """The engine's code: a rewrite or a check that changed makes new keys."""
    digest = hashlib.sha256()
    engine = Path(__file__).resolve().parents[1]
    for file in sorted(engine.rglob("*.py")):
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _cache_file(key: str) -> Path | None:
    from deepstack_patch.engine.cache import cache_dir
    from deepstack_patch.engine.errors import DeepstackError

    try:
        return cache_dir() / "runtime-names" / key[:2] / f"{key}.json"
    except DeepstackError:
        return None  # no cache folder: check every time


def _stored(key: str) -> dict[str, Any]:
    file = _cache_file(key)
    try:
        stored: Any = json.loads(file.read_text()) if file else None
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def cached(key: str) -> str | None:
    problem = _stored(key).get("problem")
    return problem if isinstance(problem, str) else None


def cached_excused(key: str) -> list[str]:
    """The attribute names a verdict found there at run time (see
    :func:`store`)."""
    excused = _stored(key).get("excused")
    if not isinstance(excused, list):
        return []
    return [name for name in excused if isinstance(name, str)]


def store(key: str, problem: str, excused: list[str] | None = None) -> None:
    """Keep a verdict: the problem (empty: none), and the attribute names
    ty said a type lacks that are there at run time all the same."""
    file = _cache_file(key)
    if file is None:
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"problem": problem, "excused": excused or []}))
        partial.replace(file)
    except OSError:
        pass  # a cache that cannot be written only costs time

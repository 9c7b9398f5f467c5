"""The typed checks' verdicts, kept between runs (:mod:`.typecheck` runs
ty; :mod:`.runtime` concludes). A verdict is keyed by everything it depends
on: the checked file's bytes, a digest of the ``vllm`` modules ty can reach
from it (:mod:`.closure`), the patch's data, the engine's code and ty's
version, so a kept verdict is never stale.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

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
        engine_digest(),
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
def engine_digest() -> str:
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

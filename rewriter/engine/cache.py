"""The user cache: one folder for sdists, extractions, environments and locks.

``DEEPSTACK_PATCH_CACHE`` overrides the platform's user cache folder. Every
layer asks this one function, so the override reaches everything the tool
keeps, tree locks included.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError


def cache_dir() -> Path:
    """``$DEEPSTACK_PATCH_CACHE``, else the platform's user cache folder."""
    path = Path(os.environ.get("DEEPSTACK_PATCH_CACHE") or user_cache_dir())
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DeepstackError(
            f"cannot create the cache folder {path}: {exc.strerror}",
            "set DEEPSTACK_PATCH_CACHE to a writable folder",
            path=str(path),
        ) from exc
    return path


def user_cache_dir() -> str:
    """The user cache folder ``platformdirs.user_cache_dir`` gives this tool.

    On Linux, where vLLM runs, that is ``$XDG_CACHE_HOME`` if it is an
    absolute path (the XDG spec ignores a relative one) or ``~/.cache``, read
    here directly: importing platformdirs took about a tenth of a no-op
    ``apply``. ``tests/test_cache.py`` holds the two equal.
    """
    if sys.platform == "linux":
        base = os.environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):
            base = os.path.expanduser("~/.cache")
        return os.path.join(base, "deepstack-patch")
    import platformdirs

    return platformdirs.user_cache_dir("deepstack-patch")


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file renamed
    over it), its folder made; a failure to write is left unsaid: a cache
    is an optimisation, never a failure."""
    import tempfile  # a store only: a run served from the cache never needs it

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(name, path)
    except OSError:
        pass

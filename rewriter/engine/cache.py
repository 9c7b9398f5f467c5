"""The user cache: one folder for sdists, extractions, environments and locks.

``DEEPSTACK_PATCH_CACHE`` overrides the platform's user cache folder. Every
layer asks this one function, so the override reaches everything the tool
keeps, tree locks included.
"""

from __future__ import annotations

import os
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError


def cache_dir() -> Path:
    """``$DEEPSTACK_PATCH_CACHE``, else the platform's user cache folder."""
    from platformdirs import user_cache_dir

    path = Path(
        os.environ.get("DEEPSTACK_PATCH_CACHE", user_cache_dir("deepstack-patch"))
    )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DeepstackError(
            f"cannot create the cache folder {path}: {exc.strerror}",
            "set DEEPSTACK_PATCH_CACHE to a writable folder",
            path=str(path),
        ) from exc
    return path

"""The user cache: one folder for sdists, extractions, environments and locks.

``DEEPSTACK_PATCH_CACHE`` overrides the platform's user cache folder. Every
layer asks this one function, so the override reaches everything the tool
keeps, tree locks included.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    from platformdirs import user_cache_dir

    path = Path(
        os.environ.get("DEEPSTACK_PATCH_CACHE", user_cache_dir("deepstack-patch"))
    )
    path.mkdir(parents=True, exist_ok=True)
    return path

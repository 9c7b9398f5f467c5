"""The user cache: verified release tarballs, downloaded once under a file lock."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from deepstack_patch.engine.cache import cache_dir
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.fetch.index import (
    PROJECT,
    SourceRelease,
    index_session,
    pip_settings,
)

Progress = Callable[[int, int | None], None]

# One cache folder for every layer (engine.cache), re-exported for fetch's users.
__all__ = ["cache_dir"]


#: The cache's folder for source releases; wheels go to ``wheels``.
SDISTS = "sdists"


def cached_path(version: str) -> Path:
    return cache_dir() / SDISTS / f"{PROJECT}-{version}.tar.gz"


def download_release(
    release: SourceRelease, progress: Progress | None = None, folder: str = SDISTS
) -> Path:
    """The verified file in the cache's ``folder``, downloading it if not there.

    Any file the index lists (an sdist, a wheel) is checked against the
    index's sha256, locked while it downloads and stamped as verified.
    """
    import requests
    from filelock import FileLock

    target = cache_dir() / folder / release.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    stamp = _stamp(target)
    with FileLock(str(target) + ".lock", timeout=1800):
        if target.is_file() and sha256_of(target) == release.sha256:
            stamp.write_text(release.sha256)
            return target
        partial = target.with_suffix(".partial")
        settings = pip_settings()
        try:
            with (
                index_session(settings) as session,
                session.get(
                    release.url, stream=True, timeout=settings.timeout
                ) as response,
            ):
                response.raise_for_status()
                total = int(response.headers.get("Content-Length", 0)) or None
                done = 0
                with partial.open("wb") as handle:
                    for chunk in response.iter_content(1 << 20):
                        handle.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total)
        except requests.RequestException as exc:
            partial.unlink(missing_ok=True)
            raise DeepstackError(
                f"downloading {release.url} failed: {exc}",
                "check the network and run again; nothing was cached",
            ) from None
        actual = sha256_of(partial)
        if actual != release.sha256:
            partial.unlink(missing_ok=True)
            raise DeepstackError(
                f"{release.filename}: sha256 {actual} does not match the index's "
                f"{release.sha256} (truncated or tampered download)",
                "run again; if it persists, the index or a proxy serves a bad file",
            )
        os.replace(partial, target)
        stamp.write_text(release.sha256)
    return target


def cached_release(version: str) -> Path | None:
    """The sdist of ``version`` if the cache holds it as verified, else None.

    :func:`download_release` records the index's sha256 beside every file it
    verified; a file that still hashes to it is used without asking the index
    again (``matrix`` checks many releases, and each index request costs more
    than the check; offline, it is the only way).
    """
    target = cached_path(version)
    stamp = _stamp(target)
    verified = target.is_file() and stamp.is_file()
    if verified and sha256_of(target) == stamp.read_text().strip():
        return target
    return None


def _stamp(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sha256")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

"""Fetch a vLLM source release from the package index the user's pip uses.

``pip download vllm==X --no-binary :all:`` cannot do this: it builds vLLM's
metadata, which needs CUDA tooling. We read the index's simple API (PEP 503 /
PEP 691) instead (:mod:`.index`), take the sdist's URL and sha256 from it,
download into the user cache under a file lock and check the hash
(:mod:`.cache`), and extract (:mod:`.archives`).

The names other layers use are importable from here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.fetch.archives import extract_release, extraction_target
from deepstack_patch.fetch.cache import (
    Progress,
    cache_dir,
    cached_release,
    download_release,
)
from deepstack_patch.fetch.index import (
    PROJECT,
    PYPI_SIMPLE,
    SourceRelease,
    configured_index_url,
    find_release,
    pip_settings,
    source_versions,
)

__all__ = [
    "PROJECT",
    "PYPI_SIMPLE",
    "Progress",
    "SourceRelease",
    "cache_dir",
    "cached_release",
    "configured_index_url",
    "download_release",
    "extract_release",
    "fetch_release",
    "find_release",
    "pip_settings",
    "release_archive",
    "release_versions",
]


def release_archive(
    version: str,
    progress: Progress | None = None,
    note: Callable[[str], None] | None = None,
) -> Path:
    """The verified tarball of ``version``: from the cache, else from the index.

    A tarball the cache verified against the index's sha256 is used without
    asking the index again (as ``matrix`` does), so a machine without access
    to the index works on every release it fetched before; ``note`` is told.
    """
    cached = cached_release(version)
    if cached is not None:
        if note:
            note(f"using the verified {cached.name} from the cache (index not asked)")
        return cached
    release = find_release(version)  # a version the index lacks is said first
    if note:
        note(f"downloading {release.filename}")
    return download_release(release, progress)


def fetch_release(
    version: str,
    out: Path,
    progress: Progress | None = None,
    note: Callable[[str], None] | None = None,
) -> VllmTree:
    """Find, download (cached, verified) and extract a release into ``out``.

    ``out`` is checked first: a refusal comes before any download or note."""
    if extraction_target(out, version):
        return VllmTree.open(out)
    archive = release_archive(version, progress, note)
    if note:
        note(f"extracting {archive.name} into {out}")
    return extract_release(archive, version, out)


#: The index's list of vLLM releases, kept in the cache (see release_versions).
VERSIONS_FILE = "index/vllm-source-versions.json"


def release_versions(
    until: str | None, note: Callable[[str], None] | None = None
) -> list[str]:
    """The final vLLM releases with a source archive, oldest first.

    The list is kept in the cache. When it already holds ``until`` the range
    up to it cannot grow (releases are never withdrawn from an index), so the
    index is not asked: a repeated watch makes no network request. Without
    ``until`` the newest releases matter, so the index is asked, and the
    cached list serves only when the index cannot be reached.
    """
    import json

    from deepstack_patch.engine.errors import DeepstackError

    path = cache_dir() / VERSIONS_FILE
    try:
        cached: list[str] | None = json.loads(path.read_text())["versions"]
    except (OSError, ValueError, KeyError, TypeError):
        cached = None
    if cached is not None and until is not None and until in cached:
        if note:
            note(f"the list of vLLM releases from the cache ({path}; index not asked)")
        return cached
    try:
        versions = source_versions()
    except DeepstackError as exc:
        if cached is None:
            raise
        if note:
            note(f"warning: {exc.message}; using the cached list of releases")
        return cached
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"versions": versions}, indent=1))
    partial.replace(path)
    return versions

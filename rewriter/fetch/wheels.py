"""Fetch an official vLLM wheel from the package index the user's pip uses.

The index, the verified download and the cache are those of
:mod:`deepstack_patch.fetch.releases` (wheels in the cache's ``wheels``
folder, sdists in ``sdists``); only the choice of the file differs: a
release has one sdist but a wheel per platform (vLLM ships
``cp38-abi3-manylinux_2_35_x86_64`` and ``..._aarch64``), and the one that
fits is chosen by its PEP 425 tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.fetch.releases import (
    PROJECT,
    Progress,
    SourceRelease,
    cache_dir,
    configured_index_url,
    download_release,
)

#: The cache's folder for wheels (sdists are in ``sdists``).
WHEELS = "wheels"


def find_wheel(
    version: str, platform: str | None = None, index_url: str | None = None
) -> SourceRelease:
    """The index's wheel of vLLM ``version`` for ``platform``, with its sha256.

    ``platform`` is a platform tag (``manylinux_2_35_aarch64``) or its
    architecture alone (``aarch64``); without it, the wheel this interpreter
    would install, by the preference order of ``packaging.tags.sys_tags()``.
    """
    import requests
    from pypi_simple import NoSuchProjectError, PyPISimple

    index_url = index_url or configured_index_url()[0]
    try:
        with PyPISimple(endpoint=index_url) as client:
            page = client.get_project_page(PROJECT, timeout=60)
    except NoSuchProjectError:
        raise DeepstackError(
            f"the package index {index_url} has no project {PROJECT!r}",
            "set PIP_INDEX_URL (or pip's index-url) to an index that mirrors vLLM",
        ) from None
    except requests.RequestException as exc:
        raise DeepstackError(
            f"cannot read the package index {index_url}: {exc}",
            "check the network and PIP_INDEX_URL / pip's index-url",
        ) from None
    wheels = [
        p
        for p in page.packages
        if p.package_type == "wheel" and p.version == version and p.filename
    ]
    if not wheels:
        from deepstack_patch.fetch.index import nearest_release

        released = {p.version for p in page.packages if p.package_type == "wheel"}
        nearest = nearest_release(version, [v for v in released if v])
        raise DeepstackError(
            f"{index_url} has no wheel of vllm {version}",
            (f"did you mean {nearest}? " if nearest else "")
            + "choose a release that has wheels on the index (see "
            f"{index_url.rstrip('/')}/vllm/), or pass --wheel FILE",
        )
    chosen = choose_wheel([p.filename for p in wheels], platform)
    package = next(p for p in wheels if p.filename == chosen)
    sha256 = package.digests.get("sha256")
    if not sha256:
        raise DeepstackError(
            f"{index_url} lists {chosen} without a sha256",
            "use an index that publishes hashes (PyPI does)",
        )
    return SourceRelease(version, chosen, package.url, sha256, index_url)


def choose_wheel(filenames: Sequence[str], platform: str | None) -> str:
    """The file among ``filenames`` for ``platform`` (see :func:`find_wheel`)."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    tags_of: dict[str, set[str]] = {}
    for name in filenames:
        try:
            tags_of[name] = {str(tag) for tag in parse_wheel_filename(name)[3]}
        except InvalidWheelFilename:
            continue
    if platform is not None:
        fitting = [
            name
            for name, tags in tags_of.items()
            if any(_platform_fits(tag.rsplit("-", 1)[1], platform) for tag in tags)
        ]
        if len(fitting) == 1:
            return fitting[0]
        problem = "several wheels fit" if fitting else "no wheel fits"
        raise DeepstackError(
            f"--platform {platform}: {problem}; the index has {', '.join(tags_of)}",
            "give the full platform tag of one of them, e.g. "
            "--platform manylinux_2_35_x86_64",
        )
    for preference in (str(tag) for tag in sys_tags()):
        for name, tags in tags_of.items():
            if preference in tags:
                return name
    raise DeepstackError(
        f"no wheel of vllm on the index installs on this machine; it has "
        f"{', '.join(tags_of) or 'none'}",
        "pass --platform TAG to patch a wheel for another machine",
    )


def _platform_fits(tag_platform: str, asked: str) -> bool:
    """``manylinux_2_35_x86_64`` fits itself and its architecture, ``x86_64``."""
    return tag_platform == asked or tag_platform.endswith(f"_{asked}")


def download_wheel(release: SourceRelease, progress: Progress | None = None) -> Path:
    """The verified wheel in the cache's ``wheels`` folder, downloaded once.

    :func:`download_release` checks the sha256, locks and stamps any file the
    index lists, sdist or wheel.
    """
    return download_release(release, progress, WHEELS)


def cached_wheels(version: str) -> list[Path]:
    """The wheels of ``version`` the cache holds as verified (sha256 stamped)."""
    from deepstack_patch.fetch.cache import sha256_of

    found = []
    for wheel in sorted((cache_dir() / WHEELS).glob(f"{PROJECT}-{version}-*.whl")):
        stamp = wheel.with_name(wheel.name + ".sha256")
        if stamp.is_file() and sha256_of(wheel) == stamp.read_text().strip():
            found.append(wheel)
    return found

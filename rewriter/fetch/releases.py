"""Fetch a vLLM source release from the package index the user's pip uses.

``pip download vllm==X --no-binary :all:`` cannot do this: it builds vLLM's
metadata, which needs CUDA tooling. We read the index's simple API (PEP 503 /
PEP 691) instead, take the sdist's URL and sha256 from it, download into the
user cache under a file lock, check the hash, and extract.
"""

from __future__ import annotations

import configparser
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.tree import VllmTree, detect_version

PYPI_SIMPLE = "https://pypi.org/simple/"
PROJECT = "vllm"

Progress = Callable[[int, int | None], None]


def configured_index_url() -> tuple[str, str]:
    """The index URL pip would use, and where it was configured.

    Order as pip: ``PIP_INDEX_URL``, then the config files (site, user,
    global; later files override earlier ones as in pip), then PyPI.
    """
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"], "PIP_INDEX_URL"
    found = (PYPI_SIMPLE, "default")
    for path in _pip_config_files():
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in ("global", "download"):
            if parser.has_option(section, "index-url"):
                found = (parser.get(section, "index-url"), str(path))
    return found


def _pip_config_files() -> list[Path]:
    """pip's config files, lowest precedence first."""
    if os.environ.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    files: list[Path] = []
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    files += [Path(d) / "pip" / "pip.conf" for d in xdg_dirs]
    files.append(Path("/etc/pip.conf"))
    home = Path.home()
    files.append(home / ".pip" / "pip.conf")
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME", home / ".config"))
    files.append(xdg_home / "pip" / "pip.conf")
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    if sys.prefix != sys.base_prefix:
        files.append(Path(sys.prefix) / "pip.conf")
    return [f for f in files if f.is_file()]


@dataclass(frozen=True)
class SourceRelease:
    version: str
    filename: str
    url: str
    sha256: str
    index_url: str


def find_release(version: str, index_url: str | None = None) -> SourceRelease:
    """Look up ``vllm-<version>.tar.gz`` and its sha256 on the index."""
    import requests
    from pypi_simple import NoSuchProjectError, PyPISimple

    index_url = index_url or configured_index_url()[0]
    filename = f"{PROJECT}-{version}.tar.gz"
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
    for package in page.packages:
        if package.filename == filename:
            sha256 = package.digests.get("sha256")
            if not sha256:
                raise DeepstackError(
                    f"{index_url} lists {filename} without a sha256",
                    "use an index that publishes hashes (PyPI does)",
                )
            return SourceRelease(version, filename, package.url, sha256, index_url)
    sdists = sorted(
        {p.version for p in page.packages if p.package_type == "sdist" and p.version},
        key=_version_key,
    )
    raise DeepstackError(
        f"{index_url} has no source release {filename}",
        f"choose a released version, e.g. one of: {', '.join(sdists[-8:])}",
    )


def _version_key(version: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)


def cache_dir() -> Path:
    from deepstack_patch.engine.cache import cache_dir as user_cache

    return user_cache()


def download_release(release: SourceRelease, progress: Progress | None = None) -> Path:
    """The verified sdist in the cache, downloading it if it is not there."""
    import requests
    from filelock import FileLock

    sdists = cache_dir() / "sdists"
    sdists.mkdir(exist_ok=True)
    target = sdists / release.filename
    stamp = _stamp(target)
    with FileLock(str(target) + ".lock", timeout=1800):
        if target.is_file() and _sha256(target) == release.sha256:
            stamp.write_text(release.sha256)
            return target
        partial = target.with_suffix(".partial")
        try:
            with requests.get(release.url, stream=True, timeout=60) as response:
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
        actual = _sha256(partial)
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
    than the check).
    """
    target = cache_dir() / "sdists" / f"{PROJECT}-{version}.tar.gz"
    stamp = _stamp(target)
    verified = target.is_file() and stamp.is_file()
    if verified and _sha256(target) == stamp.read_text().strip():
        return target
    return None


def _stamp(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sha256")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract_release(archive: Path, version: str, out: Path) -> VllmTree:
    """Extract ``archive`` into ``out`` (without its top folder) and open it.

    An ``out`` that already holds an extraction of the same release is reused
    as it is (it may be patched already: states are read from the code). Any
    other non-empty ``out`` is refused.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        existing = out / "vllm" / "__init__.py"
        if out.is_dir() and existing.is_file() and detect_version(out)[0] == version:
            return VllmTree.open(out)
        raise DeepstackError(
            f"{out} exists and is not an extraction of vLLM {version}",
            "choose another folder with --out, or remove this one",
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            tops = {m.name.split("/", 1)[0] for m in members}
            if len(tops) != 1:
                raise DeepstackError(
                    f"{archive.name}: expected one top-level folder, found {len(tops)}",
                    "the file is not a vLLM source release",
                )
            extract_kwargs = (
                {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            )
            tar.extractall(staging, **extract_kwargs)
        extracted = staging / tops.pop()
        if out.exists():  # an empty folder the user chose: fill it
            for child in extracted.iterdir():
                child.rename(out / child.name)
        else:
            extracted.rename(out)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DeepstackError(
            f"extracting {archive} failed: {exc}",
            f"delete {archive} so it is downloaded again",
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return VllmTree.open(out)


def fetch_release(
    version: str, out: Path, progress: Progress | None = None
) -> VllmTree:
    """Find, download (cached, verified) and extract a release into ``out``."""
    already_there = out.is_dir() and (out / "vllm" / "__init__.py").is_file()
    if already_there and detect_version(out)[0] == version:
        return VllmTree.open(out)
    release = find_release(version)
    archive = download_release(release, progress)
    return extract_release(archive, version, out)

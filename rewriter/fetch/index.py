"""The package index the user's pip uses, read as pip reads it.

pip's settings come from pip's own configuration loader (the files in pip's
order, ``PIP_CONFIG_FILE``, the ``PIP_*`` variables; a command section
overrides ``[global]``, the environment overrides both), so a private index,
its CA (``cert``), a client certificate, ``trusted-host``, ``timeout`` and
``proxy`` work here exactly as they do for ``pip download``. Credentials may
be in the index URL (sent to that host only, as pip does) or in netrc
(requests reads it); the standard proxy variables are read by requests.
"""

from __future__ import annotations

import configparser
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from deepstack_patch.engine.errors import DeepstackError

if TYPE_CHECKING:
    import requests

PYPI_SIMPLE = "https://pypi.org/simple/"
PROJECT = "vllm"
#: pip's own default (``--timeout``) when nothing configures one.
DEFAULT_TIMEOUT = 15.0


@dataclass(frozen=True)
class PipSettings:
    """The part of pip's configuration that reaching an index needs."""

    index_url: str = PYPI_SIMPLE
    #: Where ``index_url`` came from: ``PIP_INDEX_URL``, a config file, ``default``.
    index_source: str = "default"
    cert: str | None = None
    client_cert: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    proxy: str | None = None
    extra_index_urls: tuple[str, ...] = field(default=())


def pip_settings() -> PipSettings:
    """pip's settings for a ``download``: pip's loader, else pip's file order."""
    items = _pip_items()
    values: dict[str, tuple[str, str]] = {}
    # pip's order: [global], then the command's section, then the environment.
    for section in ("global", "download", ":env:"):
        for key, (value, origin) in items.get(section, {}).items():
            if value:
                values[key] = (value, origin)

    def get(*keys: str) -> str | None:
        found = [values[key] for key in keys if key in values]
        return found[-1][0] if found else None

    index_url, index_source = values.get("index-url", (PYPI_SIMPLE, "default"))
    timeout_text = get("default-timeout", "timeout")
    try:
        timeout = float(timeout_text) if timeout_text else DEFAULT_TIMEOUT
    except ValueError:
        raise DeepstackError(
            f"pip's timeout setting {timeout_text!r} is not a number of seconds",
            "fix `timeout` in pip.conf or PIP_TIMEOUT / PIP_DEFAULT_TIMEOUT",
        ) from None
    return PipSettings(
        index_url=index_url,
        index_source=index_source,
        cert=get("cert"),
        client_cert=get("client-cert"),
        trusted_hosts=tuple((get("trusted-host") or "").split()),
        timeout=timeout,
        proxy=get("proxy"),
        extra_index_urls=tuple((get("extra-index-url") or "").split()),
    )


def configured_index_url() -> tuple[str, str]:
    """The index URL pip would use, and where it was configured."""
    settings = pip_settings()
    return settings.index_url, settings.index_source


def _pip_items() -> dict[str, dict[str, tuple[str, str]]]:
    """``{section: {key: (value, origin)}}`` from pip's configuration loader."""
    try:
        from pip._internal.configuration import Configuration, ConfigurationError
    except ImportError:  # pip is not importable here: read its files ourselves
        return _read_pip_files()
    config = Configuration(isolated=False)
    try:
        config.load()
    except ConfigurationError as exc:
        raise DeepstackError(
            f"pip's configuration cannot be read: {exc}",
            "fix the file it names (see `python -m pip config debug`)",
        ) from None
    sections: dict[str, dict[str, tuple[str, str]]] = {}
    for key, value in config.items():
        section, _, name = key.partition(".")
        origin = _origin(config, key, name)
        sections.setdefault(section, {})[name] = (str(value), origin)
    return sections


def _origin(config: Any, key: str, name: str) -> str:
    """Where pip read ``key``: the file, or the environment variable."""
    if key.startswith(":env:"):
        return "PIP_" + name.upper().replace("-", "_")
    # pip keeps the parsers per variant; the last file that sets the key wins.
    parsers = getattr(config, "_parsers", {})
    section, _, option = key.partition(".")
    origin = "pip configuration"
    for variant in getattr(config, "_override_order", ()):
        for filename, parser in parsers.get(variant, []):
            if parser.has_option(section, option):
                origin = filename
    return origin


def _read_pip_files() -> dict[str, dict[str, tuple[str, str]]]:
    """pip's files in pip's order, then ``PIP_*``; used only without pip."""
    sections: dict[str, dict[str, tuple[str, str]]] = {}
    config_file = os.environ.get("PIP_CONFIG_FILE")
    files: list[Path] = []
    if config_file != os.devnull:
        xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
        files += [Path(d) / "pip" / "pip.conf" for d in xdg_dirs]
        files.append(Path("/etc/pip.conf"))
        home = Path.home()
        xdg_home = Path(os.environ.get("XDG_CONFIG_HOME", home / ".config"))
        files += [home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf"]
        if sys.prefix != sys.base_prefix:
            files.append(Path(sys.prefix) / "pip.conf")
        if config_file:
            files.append(Path(config_file))
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        for section in parser.sections():
            for name, value in parser.items(section):
                sections.setdefault(section, {})[name] = (value, str(path))
    for name, value in os.environ.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            key = name[4:].lower().replace("_", "-")
            sections.setdefault(":env:", {})[key] = (value, name)
    return sections


def strip_credentials(url: str) -> str:
    """``url`` without ``user:password@`` (for messages and comparisons)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc))


def index_session(settings: PipSettings) -> requests.Session:
    """A requests session that reaches the index as pip would."""
    import requests

    class PipLikeSession(requests.Session):
        def merge_environment_settings(self, url, proxies, stream, verify, cert):  # type: ignore[no-untyped-def]  # noqa: ANN001
            merged = super().merge_environment_settings(
                url, proxies, stream, verify, cert
            )
            host = urlsplit(url).hostname or ""
            if host in trusted:
                merged["verify"] = False
            elif settings.cert and verify is None:
                # pip's `cert` wins over REQUESTS_CA_BUNDLE and friends, which
                # requests would otherwise prefer to the session's setting.
                merged["verify"] = settings.cert
            return merged

    trusted = {host.rpartition(":")[0] or host for host in settings.trusted_hosts}
    trusted |= set(settings.trusted_hosts)
    if trusted:
        # The user chose not to verify these hosts (pip says nothing either).
        import warnings

        from urllib3.exceptions import InsecureRequestWarning

        warnings.filterwarnings("ignore", category=InsecureRequestWarning)
    session = PipLikeSession()
    if settings.cert:
        session.verify = settings.cert
    if settings.client_cert:
        session.cert = settings.client_cert
    if settings.proxy:
        session.proxies = {"http": settings.proxy, "https": settings.proxy}
    parts = urlsplit(settings.index_url)
    if parts.username is not None:
        session.auth = _HostAuth(
            parts.hostname or "",
            parts.port,
            requests.utils.unquote(parts.username),
            requests.utils.unquote(parts.password or ""),
        )
    return session


class _HostAuth:
    """Basic auth from the index URL, sent to the index's host only (as pip)."""

    def __init__(self, host: str, port: int | None, user: str, password: str):
        self.host, self.port = host, port
        self.user, self.password = user, password

    def __call__(self, request: Any) -> Any:
        from requests.auth import HTTPBasicAuth

        parts = urlsplit(request.url)
        if parts.hostname == self.host and parts.port == self.port:
            return HTTPBasicAuth(self.user, self.password)(request)
        return request


@dataclass(frozen=True)
class SourceRelease:
    version: str
    filename: str
    url: str
    sha256: str
    index_url: str


def find_release(version: str, index_url: str | None = None) -> SourceRelease:
    """Look up ``vllm-<version>.tar.gz`` and its sha256 on the index."""
    filename = f"{PROJECT}-{version}.tar.gz"
    page, shown = _project_page(index_url)
    for package in page.packages:
        if package.filename == filename:
            sha256 = package.digests.get("sha256")
            if not sha256:
                raise DeepstackError(
                    f"{shown} lists {filename} without a sha256",
                    "use an index that publishes hashes (PyPI does)",
                )
            return SourceRelease(version, filename, package.url, sha256, shown)
    sdists = sorted(
        {p.version for p in page.packages if p.package_type == "sdist" and p.version},
        key=_version_key,
    )
    nearest = nearest_release(version, sdists)
    newest = f"the newest: {', '.join(sdists[-3:])}"
    raise DeepstackError(
        f"{shown} has no source release {filename}",
        f"did you mean {nearest}? ({newest})" if nearest else not_a_version(sdists),
    )


def not_a_version(versions: Sequence[str]) -> str:
    """What to give instead of something that is like no release at all."""
    example = versions[-1] if versions else "0.20.2"
    listed = f" (the newest: {', '.join(versions[-3:])})" if versions else ""
    return (
        f"give a release's version number, such as {example}{listed}; "
        "`pip index versions vllm` lists them all"
    )


def nearest_release(asked: str, versions: Sequence[str]) -> str | None:
    """The release a version not on the index most likely means: ``v0.20.2``
    is 0.20.2, a partial ``0.20`` the newest 0.20.x, any other version the
    closest release before it (else the first), ``latest`` the newest, and
    anything else a release it is a near miss of (``O.20.2``), or none."""
    from packaging.version import InvalidVersion, Version

    known = sorted(
        (parsed, text)
        for text in versions
        if (parsed := _parsed(text)) is not None and not parsed.is_prerelease
    )
    if not known:
        return None
    try:
        wanted = Version(asked.strip())  # accepts a leading "v"
    except InvalidVersion:
        if asked.strip().lower() in ("latest", "newest"):
            return known[-1][1]
        import difflib

        close = difflib.get_close_matches(asked.strip(), [t for _, t in known], 1)
        return close[0] if close else None
    if len(wanted.release) < 3:  # 0.20: the newest 0.20.x
        series = [
            t for v, t in known if v.release[: len(wanted.release)] == wanted.release
        ]
        if series:
            return series[-1]
    before = [t for v, t in known if v <= wanted]
    return before[-1] if before else known[0][1]


def _parsed(text: str) -> Any:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        return None


def source_versions(index_url: str | None = None) -> list[str]:
    """Every final release of vLLM the index has a source archive of, in order.

    Pre-releases, development and local versions are left out: a watch
    follows what upstream released.
    """
    from packaging.version import InvalidVersion, Version

    page, _shown = _project_page(index_url)
    versions = set()
    for package in page.packages:
        if package.package_type != "sdist" or not package.version:
            continue
        try:
            version = Version(package.version)
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease or version.local):
            versions.add(version)
    return [str(v) for v in sorted(versions)]


def _project_page(index_url: str | None = None) -> tuple[Any, str]:
    """vLLM's project page on the index pip is configured for (or
    ``index_url``), and that index's address without credentials."""
    import requests
    from pypi_simple import NoSuchProjectError, PyPISimple

    settings = pip_settings()
    if index_url:
        settings = PipSettings(**{**settings.__dict__, "index_url": index_url})
    shown = strip_credentials(settings.index_url)
    try:
        with PyPISimple(
            endpoint=settings.index_url, session=index_session(settings)
        ) as client:
            return client.get_project_page(PROJECT, timeout=settings.timeout), shown
    except NoSuchProjectError:
        raise DeepstackError(
            f"the package index {shown} has no project {PROJECT!r}",
            "set PIP_INDEX_URL (or pip's index-url) to an index that mirrors vLLM",
        ) from None
    except requests.RequestException as exc:
        raise DeepstackError(
            f"cannot read the package index {shown}: {_short(exc)}",
            _network_hint(exc, settings),
        ) from None


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "..."


def _network_hint(exc: Exception, settings: PipSettings) -> str:
    import requests

    match exc:
        case requests.exceptions.SSLError():
            return (
                "the index's certificate is not trusted: set pip's `cert` to its "
                "CA bundle (pip config set global.cert /path/ca.pem)"
            )
        case requests.HTTPError() if "401" in str(exc) or "403" in str(exc):
            return (
                "the index refused the credentials: put them in the index URL "
                "(https://user:token@host/simple) or in ~/.netrc"
            )
        case _:
            return (
                f"check the network and the index ({settings.index_source}: "
                "PIP_INDEX_URL / pip's index-url); a release already in the "
                "cache is used without asking the index"
            )


def _version_key(version: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)

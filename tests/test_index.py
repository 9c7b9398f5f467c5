"""Private and unreachable package indexes, configured the way pip is.

Each test runs the installed command line in a subprocess (so pip's
configuration is read from a clean environment) against a local index on
127.0.0.1 that serves one tiny sdist built here from an example tree of our
own (not vLLM code), or against no index at all with the real release in the
cache.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from deepstack_patch.cli import main

from tests.support import IndexHandler, tiny_sdist

VERSION = "0.0.7"
FILENAME = f"vllm-{VERSION}.tar.gz"
#: An address nothing listens on: the index is unreachable.
DEAD_INDEX = "http://127.0.0.1:9/simple/"


class LocalIndex:
    """A PEP 503 (HTML) index for one project, optionally TLS, auth, or slow."""

    def __init__(
        self,
        *,
        tls: tuple[Path, Path] | None = None,
        credentials: str | None = None,
        delay: float = 0.0,
    ) -> None:
        sdist = tiny_sdist(VERSION, "# an example tree for the index tests\n")
        digest = hashlib.sha256(sdist).hexdigest()
        self.requests: list[str] = []
        index = self

        class Handler(IndexHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                index.requests.append(self.path)
                # A proxy receives absolute URLs; an index, paths.
                path = "/" + self.path.split("://", 1)[-1].partition("/")[2]
                if credentials is not None:
                    expected = (
                        "Basic " + base64.b64encode(credentials.encode()).decode()
                    )
                    if self.headers.get("Authorization") != expected:
                        self.send_response(401)
                        self.send_header("WWW-Authenticate", 'Basic realm="index"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                if delay:
                    time.sleep(delay)
                if path.rstrip("/") == "/simple/vllm":
                    link = f'<a href="/files/{FILENAME}#sha256={digest}">{FILENAME}</a>'
                    self._send(
                        f"<html><body>{link}</body></html>".encode(), "text/html"
                    )
                elif path == f"/files/{FILENAME}":
                    self._send(sdist, "application/gzip")
                else:
                    self.send_error(404)

        class QuietServer(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that timed out and hung up is the point

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.server.socket = context.wrap_socket(
                self.server.socket, server_side=True
            )
            scheme = "https"
        self.netloc = f"127.0.0.1:{self.server.server_port}"
        self.url = f"{scheme}://{self.netloc}/simple/"

    def __enter__(self) -> LocalIndex:
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 that no system store trusts."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a self-signed certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "ca.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


def clean_env(tmp_path: Path, pip_conf: str | None = None) -> dict[str, str | None]:
    """The environment of a user whose pip settings are only ``pip_conf``.

    As overrides of this process's environment (None removes a variable):
    the command runs in process, through click's test runner.
    """
    env: dict[str, str | None] = {
        key: None
        for key in os.environ
        if key.startswith("PIP_") or key.lower().endswith("_proxy")
    }
    env["HOME"] = str(tmp_path / "home")
    env["DEEPSTACK_PATCH_CACHE"] = str(tmp_path / "cache")
    env["XDG_CONFIG_DIRS"] = str(tmp_path / "no-site-config")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "home" / ".config")
    env["VIRTUAL_ENV"] = None
    env["PIP_CONFIG_FILE"] = os.devnull
    if pip_conf is not None:
        path = tmp_path / "pip.conf"
        path.write_text(pip_conf)
        env["PIP_CONFIG_FILE"] = str(path)
    return env


def status(tmp_path: Path, env: dict[str, str | None]) -> Result:
    out = tmp_path / f"tree-{len(list(tmp_path.glob('tree-*')))}"
    args = ["status", "--release", VERSION, "--out", str(out)]
    return CliRunner().invoke(main, args, env=env)


def fetched(result: Result) -> None:
    assert result.exit_code == 0, result.output
    assert f"vLLM {VERSION} at " in result.stdout, result.output
    # Not a terminal: the download reports plain progress lines on stderr.
    assert f"downloading {FILENAME} ... 100%" in result.stderr, result.stderr


def refused(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    text = " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {result.stderr}"


def test_https_index_trusted_through_pip_conf_cert(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    with LocalIndex(tls=certificate) as index:
        # The system bundle (REQUESTS_CA_BUNDLE in this environment) does not
        # trust the index: without pip's cert the run fails, with a hint.
        env = clean_env(tmp_path, f"[global]\nindex-url = {index.url}\n")
        refused(status(tmp_path, env), "certificate", "cert")
        env = clean_env(
            tmp_path, f"[global]\nindex-url = {index.url}\ncert = {certificate[0]}\n"
        )
        fetched(status(tmp_path, env))
        assert f"/files/{FILENAME}" in index.requests


def test_trusted_host_skips_verification(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    with LocalIndex(tls=certificate) as index:
        conf = f"[global]\nindex-url = {index.url}\ntrusted-host = 127.0.0.1\n"
        fetched(status(tmp_path, clean_env(tmp_path, conf)))


def test_credentials_in_the_index_url_and_in_netrc(tmp_path: Path) -> None:
    with LocalIndex(credentials="reader:s3cret") as index:
        refused(
            status(tmp_path, clean_env(tmp_path, f"[global]\nindex-url={index.url}\n")),
            "401",
            "credentials",
        )
        with_user = index.url.replace("://", "://reader:s3cret@")
        env = clean_env(tmp_path, f"[global]\nindex-url = {with_user}\n")
        result = status(tmp_path, env)
        fetched(result)
        assert "s3cret" not in result.output  # never echoed
        # The same index, the credentials in netrc instead (requests reads it).
        shutil.rmtree(tmp_path / "cache")
        netrc = tmp_path / "netrc"
        netrc.write_text("machine 127.0.0.1 login reader password s3cret\n")
        netrc.chmod(0o600)
        env = clean_env(tmp_path, f"[global]\nindex-url = {index.url}\n")
        env["NETRC"] = str(netrc)
        fetched(status(tmp_path, env))


def test_pip_precedence_download_section_and_environment(tmp_path: Path) -> None:
    with LocalIndex() as index:
        # [download] overrides [global], as for `pip download`.
        conf = (
            f"[global]\nindex-url = {DEAD_INDEX}\n[download]\nindex-url = {index.url}\n"
        )
        fetched(status(tmp_path, clean_env(tmp_path, conf)))
        # PIP_INDEX_URL overrides every file.
        shutil.rmtree(tmp_path / "cache")
        env = clean_env(tmp_path, f"[global]\nindex-url = {index.url}\n")
        env["PIP_INDEX_URL"] = DEAD_INDEX
        refused(status(tmp_path, env), "127.0.0.1:9")


def test_proxy_from_pip_conf(tmp_path: Path) -> None:
    with LocalIndex() as proxy:  # answers absolute URLs, as a proxy
        conf = (
            "[global]\nindex-url = http://index.invalid/simple/\n"
            f"proxy = http://{proxy.netloc}\n"
        )
        fetched(status(tmp_path, clean_env(tmp_path, conf)))
        assert any(r.startswith("http://index.invalid/") for r in proxy.requests)


def test_timeout_from_pip_conf(tmp_path: Path) -> None:
    with LocalIndex(delay=5) as index:
        conf = f"[global]\nindex-url = {index.url}\ntimeout = 1\n"
        refused(status(tmp_path, clean_env(tmp_path, conf)), "timed out")


@pytest.mark.release
@pytest.mark.parametrize("command", ["apply", "backport"])
def test_unreachable_index_uses_the_verified_cached_release(
    command: str, tmp_path: Path, release_tree: object
) -> None:
    """Offline, with 0.20.2 in the (shared) cache: no index is asked."""
    release_tree("0.20.2")  # type: ignore[operator]  # puts it in the cache
    env = {**os.environ, "PIP_INDEX_URL": DEAD_INDEX}
    env.pop("PIP_CONFIG_FILE", None)
    out = tmp_path / "out"
    args = ["--dry-run"] if command == "apply" else []
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", command, "--release", "0.20.2"]
        + ["--out", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "index not asked" in result.stderr
    assert "vllm-0.20.2.tar.gz" in result.stderr

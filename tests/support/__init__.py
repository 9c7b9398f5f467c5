"""Helpers tests share (plain functions and constants; fixtures are in conftest.py).

Import as ``from tests.support import TARGETS, link_copy``: ``tests`` is a
package, so pytest puts the repository root on ``sys.path``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Container
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.targets import load_targets
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import patch_by_id

#: targets.toml: the releases and every patch's expected state on each.
TARGETS = load_targets()


def link_copy(source: Path, destination: Path) -> Path:
    """A copy of a tree whose files are hard links to the source's files."""
    shutil.copytree(source, destination, copy_function=os.link, symlinks=True)
    return destination


def apply_one(patch_id: str, source: Path, destination: Path) -> Path:
    """A hard-link copy of ``source`` with one patch applied."""
    root = link_copy(source, destination)
    tree = VllmTree.open(root)
    write_edits(root, plan_tree(tree, [patch_by_id(patch_id)]).edits)
    return root


def run_proof(env: object, tree: Path, patch_id: str) -> tuple[str, str]:
    """``(status, message)`` of one patch's proof on ``tree`` in ``env``."""
    from deepstack_patch.proof.proofs import run_proofs

    result = run_proofs(env, tree, [patch_id])[patch_id]
    return result.status, result.message


class Snapshot(dict[str, tuple[bytes, int]]):
    """Every file of a tree: its bytes and mode bits (a link: its target,
    mode 0). Compared as a dict; shown by its size, so that a failed
    comparison lists only the files that differ (pytest's dict diff), never
    the whole tree's bytes (on CI pytest prints operands unabridged)."""

    def __repr__(self) -> str:
        return f"<snapshot of {len(self)} files>"


def snapshot(root: Path, skip: Container[str] = ()) -> Snapshot:
    """Every file under ``root`` (links as their target text): bytes and mode.

    Folders named in ``skip`` (e.g. ``.git``) are left out.
    """
    found = Snapshot()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = (os.readlink(path).encode(), 0)
            else:
                found[rel] = (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
    return found


def tiny_sdist(version: str, init_text: str = "") -> bytes:
    """A tiny ``vllm-VERSION.tar.gz`` of an example tree (metadata and an
    empty package): enough for the tool to open it as a release."""
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        "vllm/__init__.py": init_text,
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class IndexHandler(BaseHTTPRequestHandler):
    """A quiet request handler for the package indexes tests serve on 127.0.0.1."""

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def site_of(release: Path, folder: Path, version: str = "0.20.2") -> Path:
    """A site-packages folder holding the vllm package of ``release`` (a source
    release ``version``) as pip installs it: a dist-info whose RECORD lists
    every file with its hash (hard links: apply only ever replaces files)."""
    folder.mkdir()
    link_copy(release / "vllm", folder / "vllm")
    info = folder / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    )
    (info / "INSTALLER").write_text("pip\n")
    rows = [
        f"{path.relative_to(folder)},sha256={digest(path)},{path.stat().st_size}"
        for path in sorted((folder / "vllm").rglob("*"))
        if path.is_file()
    ]
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")
    return folder


def digest(path: Path) -> str:
    """A RECORD row's hash: urlsafe base64 of the sha256, unpadded."""
    raw = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

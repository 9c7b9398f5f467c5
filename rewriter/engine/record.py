"""RECORD (PEP 376 / the wheel spec) and the deepstack-patch change record.

RECORD lists every installed file as ``path,sha256=<urlsafe b64, no
padding>,size``; ``pip uninstall`` removes exactly what it lists. A rewritten
file gets its new hash and size there, and every file this tool adds (the
change record, the original bytes) is listed, so uninstalling leaves nothing.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError, reinstall_hint


def record_hash(data: bytes) -> str:
    """RECORD's hash field for ``data``: ``sha256=<urlsafe b64 without padding>``."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_record(raw: bytes) -> list[list[str]]:
    return [row for row in csv.reader(io.StringIO(raw.decode("utf-8"))) if row]


def _line_ending(raw: bytes) -> str:
    # pip writes "\r\n" (the csv default), other installers "\n": keep theirs.
    return "\r\n" if b"\r\n" in raw[: raw.find(b"\n") + 1 or len(raw)] else "\n"


def updated_record(
    raw: bytes, files: Mapping[str, bytes | None], record_relpath: str
) -> bytes:
    """RECORD with new hashes and sizes for ``files``.

    ``files`` maps a path to its new bytes, or to None for a file that is
    removed: its row stays (an interpreter may write that bytecode again, and
    uninstalling should remove it) without a hash. Paths RECORD lacks are
    appended. A row without a hash (bytecode pip compiled, RECORD itself)
    keeps having none.
    """
    rows = parse_record(raw)
    seen: set[str] = set()
    for row in rows:
        path = row[0]
        if path not in files or path == record_relpath:
            continue
        seen.add(path)
        content = files[path]
        had_hash = len(row) > 1 and bool(row[1])
        row[1:] = (
            [record_hash(content), str(len(content))]
            if content is not None and had_hash
            else ["", ""]
        )
    for path, content in files.items():
        if path not in seen and path != record_relpath and content is not None:
            rows.append([path, record_hash(content), str(len(content))])
    out = io.StringIO()
    csv.writer(out, lineterminator=_line_ending(raw)).writerows(rows)
    return out.getvalue().encode("utf-8")


def record_rows(raw: bytes) -> dict[str, list[str]]:
    return {row[0]: row for row in parse_record(raw)}


def require_rows(
    raw: bytes, paths: list[str], record_relpath: str, version: str | None = None
) -> None:
    """Refuse an install whose RECORD does not list a file to be rewritten."""
    rows = record_rows(raw)
    missing = [path for path in paths if path not in rows]
    if missing:
        raise DeepstackError(
            f"{record_relpath}: has no row for {', '.join(missing)}; the install "
            "does not match its RECORD, so nothing was written",
            reinstall_hint(version, ", then run again"),
        )


def load_change_record(path: Path) -> dict[str, Any] | None:
    """The change record of an install, or None when there is none."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DeepstackError(
            f"{path}: cannot read: {exc.strerror}", "check its permissions"
        ) from None
    try:
        document = json.loads(raw)
    except ValueError:
        document = None
    if not isinstance(document, dict) or document.get("schema") != 1:
        raise DeepstackError(
            f"{path}: is not a deepstack-patch change record (schema 1)",
            "restore it from a backup, or reinstall vllm to start clean",
        )
    return document


def dump_change_record(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=False) + "\n").encode()

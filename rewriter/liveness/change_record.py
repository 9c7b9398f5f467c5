"""Read the change record ``apply --installed`` keeps in vLLM's dist-info.

The record (``<dist_info>/deepstack_patch.json``, schema 1) is written by the
installed-target code; its format is the shared contract in the project's
notes: applied and skipped ids, and per file the sha256 before and after.
Here it is only read, by ``doctor`` and by the check in every vLLM process,
so this module needs the standard library alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

RECORD_NAME = "deepstack_patch.json"


@dataclass(frozen=True)
class RecordedFile:
    path: str  # relative to site-packages
    sha256_before: str
    sha256_after: str


@dataclass(frozen=True)
class ChangeRecord:
    path: Path
    tool_version: str
    date: str
    applied: tuple[str, ...]
    skipped: tuple[str, ...]
    files: tuple[RecordedFile, ...] = field(default=())

    def changed_since(self, site_packages: Path) -> list[str]:
        """Recorded files whose bytes are no longer what the apply wrote."""
        changed = []
        for recorded in self.files:
            try:
                digest = hashlib.sha256((site_packages / recorded.path).read_bytes())
            except OSError:
                changed.append(recorded.path)
                continue
            if digest.hexdigest() != recorded.sha256_after:
                changed.append(recorded.path)
        return changed


class UnreadableRecord(ValueError):
    """The record exists but is not a schema-1 change record."""


def read_record(dist_info: Path | None) -> ChangeRecord | None:
    """The record in ``dist_info``, None if there is none."""
    if dist_info is None:
        return None
    path = Path(dist_info) / RECORD_NAME
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UnreadableRecord(f"{path}: {exc}") from None
    try:
        if document.get("schema") != 1:
            raise UnreadableRecord(f"{path}: schema {document.get('schema')!r}, not 1")
        return ChangeRecord(
            path=path,
            tool_version=str(document.get("tool_version", "")),
            date=str(document.get("date", "")),
            applied=tuple(document.get("applied", ())),
            skipped=tuple(document.get("skipped", ())),
            files=tuple(
                RecordedFile(f["path"], f.get("sha256_before", ""), f["sha256_after"])
                for f in document.get("files", ())
            ),
        )
    except (AttributeError, KeyError, TypeError) as exc:
        raise UnreadableRecord(f"{path}: not a change record ({exc})") from None

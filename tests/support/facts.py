"""The release × patch facts a test run asserted, counted (issue 35).

A release-backed test calls :func:`asserted` once an assertion about one
patch on one release has passed: ``asserted("status", "0.20.2",
"vllm#40932")``. The check names what was asserted (``drift rename
M.f:n``), so a fact asserted by two tests counts once, and a fact no test
asserts any more shows as missing when two runs' sets are compared. The
session's summary prints the count; ``DEEPSTACK_PATCH_FACTS=FILE`` writes
the set as JSON lines (``check``, ``release``, ``patch``), sorted, for such a
comparison (docs/testing.md).

``patch`` is a patch id, or ``series`` for a fact about the whole series on
that release (a second ``apply`` writes nothing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: Every (check, release, patch) asserted in this session.
FACTS: set[tuple[str, str, str]] = set()
#: The variable naming the file the session's facts are written to.
FACTS_FILE = "DEEPSTACK_PATCH_FACTS"


def asserted(check: str, release: str, patch: str) -> None:
    """Record that ``check`` passed for ``patch`` on ``release``."""
    FACTS.add((check, release, patch))


def write_facts(path: Path) -> None:
    lines = [
        json.dumps({"check": check, "release": release, "patch": patch})
        for check, release, patch in sorted(FACTS)
    ]
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def facts_file() -> Path | None:
    named = os.environ.get(FACTS_FILE)
    return Path(named) if named else None

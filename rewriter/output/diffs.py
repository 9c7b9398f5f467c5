"""Unified diffs of a plan's edits, as ``git apply`` and ``patch -p1`` read them."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from deepstack_patch.engine.plan import FileEdit


def unified_diff(edits: Sequence[FileEdit]) -> str:
    """A ``git apply`` / ``patch -p1`` compatible diff of the edits."""
    chunks = []
    for edit in edits:
        old = edit.old.decode("utf-8", "surrogateescape").splitlines(keepends=True)
        new = edit.new.decode("utf-8", "surrogateescape").splitlines(keepends=True)
        # A file added or deleted is named /dev/null on its other side, as
        # git writes it (git apply and patch -p1 then create or remove it).
        source = "/dev/null" if edit.action == "add" else f"a/{edit.relpath}"
        target = "/dev/null" if edit.action == "delete" else f"b/{edit.relpath}"
        lines = difflib.unified_diff(old, new, source, target)
        chunks.append(f"diff --git a/{edit.relpath} b/{edit.relpath}\n")
        if edit.action != "change":
            what = "new" if edit.action == "add" else "deleted"
            chunks.append(f"{what} file mode 100644\n")
        for line in lines:
            chunks.append(
                line
                if line.endswith("\n")
                else line + "\n\\ No newline at end of file\n"
            )
    return "".join(chunks)

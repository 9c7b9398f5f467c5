"""A derived patch made as a user makes it: ``derive`` on upstream's diff.

The diff is cut from the release tarballs at test time
(:mod:`tests.support.upstream`); ``derive`` runs in a subprocess with
``--base``, as the README's example runs it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.upstream import FIXES, upstream_diff


def cli(*args: str, **options: object) -> subprocess.CompletedProcess[str]:
    """``deepstack-patch ARGS`` as a user runs it, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        **options,  # type: ignore[call-overload]
    )


def derived_folder(
    fix_id: str, patch_id: str, release_root: Callable[[str], Path], work: Path
) -> Path:
    """The folder ``derive --out`` wrote ``patch_id`` into, from ``fix_id``'s
    upstream diff on the release before the fix."""
    diff = work / f"{patch_id.replace('#', '-')}.diff"
    diff.write_text(upstream_diff(fix_id, release_root))
    out = work / f"patches-{patch_id.replace('#', '-')}"
    made = cli(
        "derive", "--diff", str(diff), "--base", FIXES[fix_id].before,
        "--id", patch_id, "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    return out

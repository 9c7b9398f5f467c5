"""Fetch a release, apply the series, and write everything a vendor build needs.

Into one output folder: the patched tree, the series against the pristine
release, a patched sdist carrying a local version, and a JSON report.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import Plan
from deepstack_patch.engine.protocol import Patch

REPORT_NAME = "report.json"


@dataclass
class BackportResult:
    """The plan, and the report document (None when a patch drifted)."""

    plan: Plan
    document: dict[str, Any] | None = None

    @property
    def drifted(self) -> bool:
        return self.document is None


def prepare_out(out: Path) -> None:
    """``--out`` must be new, empty, or an earlier backport's (then replaced)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise DeepstackError(f"--out {out}: is a file", "give a folder")
    children = list(out.iterdir())
    if not children:
        return
    report = out / REPORT_NAME
    try:
        earlier = json.loads(report.read_text()).get("command") == "backport"
    except (OSError, ValueError, AttributeError):
        earlier = False
    if not earlier:
        raise DeepstackError(
            f"--out {out}: not empty, and not the output of an earlier backport",
            "give a new or empty folder",
        )
    from deepstack_patch.distribution.provenance import PROVENANCE_NAME, SBOM_NAME

    # Only what an earlier backport writes is removed.
    earlier_outputs = (REPORT_NAME, "series", SBOM_NAME, PROVENANCE_NAME)
    for child in children:
        if child.name in earlier_outputs or child.name.startswith("vllm-"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def backport_release(
    release: str,
    out: Path,
    label: str,
    series: Sequence[Patch],
    selected: set[str],
) -> BackportResult:
    """Fetch ``release``, apply the selection, write tree, series, sdist, report.

    A drifted selected patch leaves no patched tree: the result says so.
    """
    from deepstack_patch.distribution.provenance import (
        backport_document_paths,
        write_backport_provenance,
    )
    from deepstack_patch.distribution.quilt import build_date, plan_steps, write_series
    from deepstack_patch.distribution.sdist import (
        local_version,
        repack_sdist,
        version_edits,
    )
    from deepstack_patch.engine.transaction import write_edits
    from deepstack_patch.fetch.releases import extract_release
    from deepstack_patch.output.documents import dump_json, plan_json
    from deepstack_patch.output.progress import note

    started = time.monotonic()
    started_on = dt.datetime.now(dt.timezone.utc)
    new_version = local_version(release, label)
    prepare_out(out)
    archive = download(release)
    tree_dir = out / f"vllm-{new_version}"
    note(f"extracting {archive.name} into {tree_dir}")
    tree = extract_release(archive, release, tree_dir)
    if tree.version != release:
        raise DeepstackError(
            f"{archive.name}: its PKG-INFO says {tree.version}, not {release}",
            f"delete {archive} so it is downloaded again",
        )
    plan, steps = plan_steps(tree, series, selected)
    if any(r.selected and r.state.value == "drifted" for r in plan.reports):
        shutil.rmtree(tree_dir, ignore_errors=True)
        return BackportResult(plan)

    names = write_series(out / "series", steps, release)
    written = write_edits(tree.root, plan.edits)
    versioned = version_edits(tree.root, release, new_version)
    write_edits(tree.root, versioned)
    note(f"repacking vllm-{new_version}.tar.gz")
    sdist = repack_sdist(
        archive,
        [*plan.edits, *versioned],
        new_version,
        out / f"vllm-{new_version}.tar.gz",
        int(build_date().timestamp()),
    )
    document = plan_json(
        plan,
        "backport",
        release=release,
        local_version=new_version,
        applied=[step.patch.id for step in steps],
        written=written,
        outputs={
            "tree": str(tree.root),
            "series": str((out / "series").resolve()),
            "series_files": names,
            "sdist": str(sdist.resolve()),
            "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
            "report": str((out / REPORT_NAME).resolve()),
            **backport_document_paths(out),
        },
        seconds=round(time.monotonic() - started, 2),
    )
    (out / REPORT_NAME).write_text(dump_json(document) + "\n")
    write_backport_provenance(out, document, archive, started_on, series)
    return BackportResult(plan, document)


def download(release: str) -> Path:
    """The verified sdist of ``release``: the cached one, else from the index."""
    from deepstack_patch.fetch.releases import release_archive
    from deepstack_patch.output.progress import note, progress

    with progress(f"downloading vllm-{release}.tar.gz") as update:
        return release_archive(release, update, note)

"""``deepstack-patch backport``: fetch a release, apply, and write a patched sdist."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import click
from deepstack_patch.cli.common import (
    EXIT_OK,
    format_option,
    refuse_drifted,
    select_options,
    selected_drifted,
    stderr_console,
    stdout_console,
)
from deepstack_patch.engine.errors import DeepstackError

REPORT_NAME = "report.json"


def _prepare_out(out: Path) -> None:
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
    from deepstack_patch.vendor.provenance import PROVENANCE_NAME, SBOM_NAME

    # Only what an earlier backport writes is removed.
    earlier_outputs = (REPORT_NAME, "series", SBOM_NAME, PROVENANCE_NAME)
    for child in children:
        if child.name in earlier_outputs or child.name.startswith("vllm-"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


@click.command()
@click.option(
    "--release",
    required=True,
    metavar="VERSION",
    help="The vLLM release to fetch from the package index pip is configured for.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="Output folder (default ./backport-VERSION): new, empty, or an earlier "
    "backport's, which is replaced.",
)
@click.option(
    "--local-version",
    "label",
    default="deepstack.1",
    show_default=True,
    help="PEP 440 local version label of the patched release: the tarball and "
    "tree say VERSION+LABEL. Bump the number when the series for a release "
    "changes.",
)
@select_options
@format_option
def backport(
    release: str,
    out: Path | None,
    label: str,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    output_format: str,
) -> None:
    """Fetch a release, apply the series, and write everything a build needs.

    \b
    Into --out:
      vllm-VERSION+LABEL/          the patched source tree
      series/                      the patch series (see `export`), against
                                   the pristine release
      vllm-VERSION+LABEL.tar.gz    the patched source tarball
      report.json                  states, patches, outputs (schema 1)
      sbom.cdx.json                CycloneDX SBOM: the patched vLLM, its
                                   upstream ancestor and each backport
      provenance.intoto.json       in-toto statement (SLSA provenance v1)
                                   of every output file, unsigned

    The tree and the tarball carry the local version (PKG-INFO,
    vllm.egg-info/PKG-INFO, vllm/_version.py); the series carries only the
    fixes. SOURCE_DATE_EPOCH makes the tarball and series reproducible.

    \b
    Exit codes: 0 all written; 2 drifted targets or an error (the
    patched tree and tarball are not written).
    """
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.engine.transaction import write_edits
    from deepstack_patch.fetch.releases import extract_release
    from deepstack_patch.output.report import dump_json, plan_json
    from deepstack_patch.patches import SERIES
    from deepstack_patch.vendor.provenance import (
        PROVENANCE_NAME,
        SBOM_NAME,
        backport_document_paths,
        write_backport_provenance,
    )
    from deepstack_patch.vendor.quilt import build_date, plan_steps, write_series
    from deepstack_patch.vendor.sdist import local_version, repack_sdist, version_edits

    started = time.monotonic()
    started_on = dt.datetime.now(dt.timezone.utc)
    selected = select_patches(SERIES, only, skip)
    new_version = local_version(release, label)
    out = out or Path(f"backport-{release}")
    _prepare_out(out)
    console = stderr_console()

    archive = _download(release)
    tree_dir = out / f"vllm-{new_version}"
    with console.status(f"extracting {archive.name}"):
        tree = extract_release(archive, release, tree_dir)
    if tree.version != release:
        raise DeepstackError(
            f"{archive.name}: its PKG-INFO says {tree.version}, not {release}",
            f"delete {archive} so it is downloaded again",
        )
    plan, steps = plan_steps(tree, SERIES, selected)
    if selected_drifted(plan):
        shutil.rmtree(tree_dir, ignore_errors=True)
        refuse_drifted(plan, output_format, "backport")

    names = write_series(out / "series", steps, release)
    written = write_edits(tree.root, plan.edits)
    versioned = version_edits(tree.root, release, new_version)
    write_edits(tree.root, versioned)
    replaced = {edit.relpath: edit.new for edit in [*plan.edits, *versioned]}
    with console.status(f"writing vllm-{new_version}.tar.gz"):
        sdist = repack_sdist(
            archive,
            replaced,
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
    write_backport_provenance(out, document, archive, started_on)
    if output_format == "json":
        click.echo(dump_json(document))
        sys.exit(EXIT_OK)
    applied = ", ".join(document["applied"]) or "none (nothing needed)"
    stdout = stdout_console()
    stdout.print(f"vLLM {release} -> {new_version}; patches applied: {applied}")
    stdout.print(f"  tree     {tree.root}")
    stdout.print(f"  series   {out / 'series'} ({len(names)} patch file(s))")
    stdout.print(f"  tarball  {sdist}")
    stdout.print(f"  report   {out / REPORT_NAME}")
    stdout.print(f"  sbom     {out / SBOM_NAME}")
    stdout.print(f"  provenance {out / PROVENANCE_NAME}")
    console.print(f"done in {document['seconds']:.1f} s")
    sys.exit(EXIT_OK)


def _download(release: str) -> Path:
    from deepstack_patch.fetch.releases import download_release, find_release
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        *Progress.get_default_columns(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=stderr_console(),
        transient=True,
    ) as progress:
        task = progress.add_task(f"vllm-{release}.tar.gz", total=None)
        return download_release(
            find_release(release),
            lambda done, total: progress.update(task, completed=done, total=total),
        )

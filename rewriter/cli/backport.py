"""``deepstack-patch backport``: fetch a release, apply, and write a patched sdist."""

from __future__ import annotations

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
    # Only what an earlier backport writes is removed.
    for child in children:
        if child.name in (REPORT_NAME, "series") or child.name.startswith("vllm-"):
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

    The tree and the tarball carry the local version (PKG-INFO,
    vllm.egg-info/PKG-INFO, vllm/_version.py); the series carries only the
    fixes. SOURCE_DATE_EPOCH makes the tarball and series reproducible.

    \b
    Exit codes: 0 all four written; 2 drifted targets or an error (the
    patched tree and tarball are not written).
    """
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.engine.transaction import write_edits
    from deepstack_patch.fetch.releases import extract_release
    from deepstack_patch.output.progress import note
    from deepstack_patch.output.report import dump_json, plan_json
    from deepstack_patch.patches import SERIES
    from deepstack_patch.vendor.quilt import build_date, plan_steps, write_series
    from deepstack_patch.vendor.sdist import local_version, repack_sdist, version_edits

    started = time.monotonic()
    selected = select_patches(SERIES, only, skip)
    new_version = local_version(release, label)
    out = out or Path(f"backport-{release}")
    _prepare_out(out)
    console = stderr_console()

    archive = _download(release)
    tree_dir = out / f"vllm-{new_version}"
    note(f"extracting {archive.name} into {tree_dir}")
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
    note(f"repacking vllm-{new_version}.tar.gz")
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
        },
        seconds=round(time.monotonic() - started, 2),
    )
    (out / REPORT_NAME).write_text(dump_json(document) + "\n")
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
    console.print(f"done in {document['seconds']:.1f} s")
    sys.exit(EXIT_OK)


def _download(release: str) -> Path:
    from deepstack_patch.fetch.releases import release_archive
    from deepstack_patch.output.progress import note, progress

    with progress(f"downloading vllm-{release}.tar.gz") as update:
        return release_archive(release, update, note)

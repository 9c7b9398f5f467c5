"""``deepstack-patch backport``: fetch a release, apply, and write a patched sdist."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from deepstack_patch.cli.common import (
    EXIT_OK,
    format_option,
    refuse_drifted,
    stderr_console,
    stdout_console,
)
from deepstack_patch.cli.series import (
    load_series,
    patches_option,
    select_options,
)


@click.command()
@patches_option
@click.option(
    "--release",
    required=True,
    metavar="VERSION",
    help="The vLLM release to fetch from the package index pip is configured for.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="The folder backport writes everything into: the patched tree, the "
    "series, the tarball, report.json, the SBOM and the provenance (default "
    "./backport-VERSION); new, empty, or an earlier backport's, which is "
    "replaced.",
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
      sbom.cdx.json                CycloneDX SBOM of the patched release
      provenance.intoto.json       in-toto provenance over every output

    The tree and the tarball carry the local version (PKG-INFO,
    vllm.egg-info/PKG-INFO, vllm/_version.py); the series carries only the
    fixes. SOURCE_DATE_EPOCH makes the tarball and series reproducible.

    \b
    Exit codes: 0 all six written; 2 drifted targets or an error (the
    patched tree and tarball are not written).
    """
    from deepstack_patch.distribution.backport import REPORT_NAME, backport_release
    from deepstack_patch.engine.plan import select_patches
    from deepstack_patch.output.documents import dump_json

    series = load_series()
    out = out or Path(f"backport-{release}")
    selected = select_patches(series, only, skip)
    result = backport_release(release, out, label, series, selected)
    if result.document is None:
        sys.exit(refuse_drifted(result.plan, output_format, "backport"))
    document = result.document
    if output_format == "json":
        click.echo(dump_json(document))
        sys.exit(EXIT_OK)
    applied = ", ".join(document["applied"]) or "none (nothing needed)"
    outputs = document["outputs"]
    stdout = stdout_console()
    stdout.print(
        f"vLLM {release} -> {document['local_version']}; patches applied: {applied}"
    )
    stdout.print(f"  tree     {outputs['tree']}")
    stdout.print(
        f"  series   {out / 'series'} ({len(outputs['series_files'])} patch file(s))"
    )
    stdout.print(f"  tarball  {out / Path(outputs['sdist']).name}")
    stdout.print(f"  report   {out / REPORT_NAME}")
    stdout.print(f"  sbom     {outputs['sbom']}")
    stdout.print(f"  provenance {outputs['provenance']}")
    stderr_console().print(f"done in {document['seconds']:.1f} s")
    sys.exit(EXIT_OK)

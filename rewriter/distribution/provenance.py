"""Provenance a vendor pipeline reads: a CycloneDX SBOM and an in-toto statement.

Beside every patched output, two documents say what it is and how it was made:

- ``sbom.cdx.json``, a CycloneDX 1.6 SBOM whose one component is the patched
  vLLM (``V+deepstack.N``). Its ``pedigree`` holds the upstream release as
  ancestor (with the sha256 of the artefact it was made from) and one
  ``backport`` patch per applied fix, carrying that fix's series file as its
  diff, the upstream pull request it ``resolves``, and, in the component's
  properties, what upstream said about the fix since (``Patch.follow_ups``).
- ``provenance.intoto.json``, an unsigned in-toto Statement v1 with a SLSA
  provenance v1 predicate: the sha256 of every output file as subjects, the
  release, series and local version as parameters, the upstream artefact and
  deepstack-patch as resolved dependencies. A pipeline signs it (docs/vendor.md,
  "Provenance").

The SBOM's builder is the only code here that needs ``cyclonedx-python-lib``;
it is imported when a document is written, never by ``list`` or ``status``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch import __version__
from deepstack_patch.engine.protocol import Patch
from deepstack_patch.fetch.cache import sha256_of
from deepstack_patch.output.upstream import origin_words, upstream_commit

SBOM_NAME = "sbom.cdx.json"
PROVENANCE_NAME = "provenance.intoto.json"

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
#: What a ``backport`` run is, for SLSA's ``buildType`` (its parameters are
#: documented in docs/vendor.md, "Provenance"). The project has no web home yet,
#: so this is a URN rather than an address that resolves.
BACKPORT_BUILD_TYPE = "urn:deepstack-patch:build-type:backport:v1"
#: The builder when the pipeline does not name itself: set
#: ``DEEPSTACK_PATCH_BUILDER_ID`` to the identity your CI signs as (e.g. the
#: workflow's URL), since SLSA's builder is the platform, not this tool.
DEFAULT_BUILDER_ID = "urn:deepstack-patch:builder:local"
BUILDER_ID_VARIABLE = "DEEPSTACK_PATCH_BUILDER_ID"
VLLM_PROJECT_URL = "https://github.com/vllm-project/vllm"


@dataclass(frozen=True)
class UpstreamArtefact:
    """The release artefact a patched output was made from."""

    filename: str
    sha256: str
    #: ``sdist`` or ``wheel``.
    kind: str
    #: Where it was downloaded from, when known (else a purl names it).
    url: str = ""


@dataclass(frozen=True)
class AppliedPatch:
    """One applied fix and its series file, as written.

    ``path`` is where that file lies relative to the SBOM
    (``series/0001-....patch``): the patch's ``diff.url``, whose number gives
    the order CycloneDX's unordered ``patches`` cannot.
    """

    patch: Patch
    path: str
    text: bytes


def read_applied(
    series_dir: Path, patches: Sequence[Patch], names: Sequence[str], base: Path
) -> list[AppliedPatch]:
    """The applied patches of a series ``write_series`` wrote: the ``patches``
    and the file ``names`` it returned, in order; paths are relative to ``base``
    (the folder the SBOM is written to)."""
    return [
        AppliedPatch(
            patch,
            os.path.relpath(series_dir / name, base).replace(os.sep, "/"),
            (series_dir / name).read_bytes(),
        )
        for patch, name in zip(patches, names, strict=True)
    ]


def follow_up_lines(patch: Patch) -> list[str]:
    """One line per follow-up: ``vllm#53516 (closed, 2026-11-23): ... <url>``."""
    return [
        f"{f.reference} ({f.status} when recorded on {f.recorded}): {f.summary}"
        + (f" {f.url}" if f.url else "")
        for f in patch.follow_ups
    ]


# --- CycloneDX ----------------------------------------------------------------


def sbom_document(
    *,
    release: str,
    local_version: str,
    upstream: UpstreamArtefact,
    applied: Sequence[AppliedPatch],
    output_sha256: str = "",
    timestamp: dt.datetime | None = None,
) -> str:
    """The CycloneDX 1.6 JSON text describing the patched vLLM.

    ``output_sha256`` is the hash of the patched artefact itself (tarball or
    wheel) when there is one. ``timestamp`` defaults to the build date
    (``SOURCE_DATE_EPOCH`` when set); the serial number is derived from the
    content and that date, so a reproducible build gets a byte-identical SBOM.
    """
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType, Pedigree
    from cyclonedx.output.json import JsonV1Dot6
    from deepstack_patch.distribution.quilt import build_date
    from packageurl import PackageURL

    timestamp = timestamp or build_date()
    ancestor = Component(
        type=ComponentType.LIBRARY,
        name="vllm",
        version=release,
        purl=PackageURL(type="pypi", name="vllm", version=release),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=upstream.sha256)],
        description=f"upstream vLLM {release} ({upstream.kind} {upstream.filename})",
        external_references=_distribution_reference(upstream),
    )
    properties = [
        Property(name=f"deepstack-patch:follow-up:{item.patch.id}", value=line)
        for item in applied
        for line in follow_up_lines(item.patch)
    ]
    purl = PackageURL(type="pypi", name="vllm", version=local_version)
    vllm = Component(
        type=ComponentType.LIBRARY,
        bom_ref=purl.to_string(),
        name="vllm",
        version=local_version,
        purl=purl,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=output_sha256)]
        if output_sha256
        else [],
        description=f"vLLM {release} with {len(applied)} upstream fix(es) "
        "backported by deepstack-patch",
        pedigree=Pedigree(
            ancestors=[ancestor],
            commits=_pedigree_commits(applied),
            patches=[_cyclonedx_patch(item) for item in applied],
            notes=_pedigree_notes(applied),
        ),
        properties=properties,
    )
    seed = json.dumps(
        [local_version, upstream.sha256, timestamp.isoformat(), __version__]
        + [hashlib.sha256(item.text).hexdigest() for item in applied]
    )
    bom = Bom(
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"deepstack-patch:{seed}"),
        metadata=BomMetaData(component=vllm, timestamp=timestamp),
    )
    bom.metadata.tools.components.add(
        Component(
            type=ComponentType.APPLICATION,
            name="deepstack-patch",
            version=__version__,
            purl=PackageURL(type="pypi", name="deepstack-patch", version=__version__),
        )
    )
    bom.register_dependency(vllm, [])
    return JsonV1Dot6(bom).output_as_string(indent=2)


def _distribution_reference(upstream: UpstreamArtefact) -> list[Any]:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri

    if not upstream.url:
        return []
    return [
        ExternalReference(
            type=ExternalReferenceType.DISTRIBUTION, url=XsUri(upstream.url)
        )
    ]


def _cyclonedx_patch(item: AppliedPatch) -> Any:
    from cyclonedx.model import AttachedText, Encoding, XsUri
    from cyclonedx.model.component import Diff, Patch, PatchClassification
    from cyclonedx.model.issue import IssueClassification, IssueType, IssueTypeSource

    try:
        text = AttachedText(
            content=item.text.decode("utf-8"), content_type="text/x-diff"
        )
    except UnicodeDecodeError:  # a file in the tree that is not UTF-8
        text = AttachedText(
            content=base64.b64encode(item.text).decode("ascii"),
            content_type="text/x-diff",
            encoding=Encoding.BASE_64,
        )
    patch = item.patch
    # A derived patch may name no URL or first fixed release: the SBOM then
    # leaves the reference out (an empty URI is not a valid iri-reference).
    where = (
        f"first fixed upstream in vLLM {patch.fixed_in}"
        if patch.fixed_in
        else origin_words(patch)
    )
    description = " ".join(filter(None, [patch.symptom, f"({where})" if where else ""]))
    pull_request = IssueType(
        type=IssueClassification.DEFECT,
        id=patch.id,
        name=patch.title,
        description=description or None,
        source=IssueTypeSource(name="vLLM", url=XsUri(VLLM_PROJECT_URL)),
        references=[XsUri(patch.upstream_url)] if patch.upstream_url else None,
    )
    return Patch(
        type=PatchClassification.BACKPORT,
        diff=Diff(text=text, url=XsUri(item.path)),
        resolves=[pull_request],
    )


def _pedigree_commits(applied: Sequence[AppliedPatch]) -> list[Any] | None:
    """The upstream commits derived patches were made from (``derive
    --commit``): ``uid`` the sha, ``message`` the patch's id."""
    from cyclonedx.model.component import Commit

    commits = [
        Commit(uid=upstream_commit(item.patch), message=item.patch.id)
        for item in applied
        if upstream_commit(item.patch)
    ]
    return commits or None


def _pedigree_notes(applied: Sequence[AppliedPatch]) -> str | None:
    lines = [
        f"{item.patch.id} follow-up: {line}"
        for item in applied
        for line in follow_up_lines(item.patch)
    ]
    if not lines:
        return None
    return (
        "What upstream said about these fixes after they shipped, as recorded "
        "by deepstack-patch " + __version__ + ":\n" + "\n".join(lines)
    )


def write_sbom(
    path: Path,
    *,
    release: str,
    local_version: str,
    upstream: UpstreamArtefact,
    applied: Sequence[AppliedPatch],
    output: Path | None = None,
    output_sha256: str = "",
) -> Path:
    """Write the SBOM of ``output`` (the patched tarball or wheel) to ``path``;
    give ``output_sha256`` when the caller has hashed ``output`` already (a
    wheel is 244 MB)."""
    text = sbom_document(
        release=release,
        local_version=local_version,
        upstream=upstream,
        applied=applied,
        output_sha256=output_sha256 or (sha256_of(output) if output else ""),
    )
    _write_atomically(path, text + "\n")
    return path


# --- in-toto / SLSA -----------------------------------------------------------


def provenance_statement(
    *,
    subjects: Sequence[Path],
    root: Path,
    release: str,
    local_version: str,
    series: Sequence[str],
    upstream: UpstreamArtefact,
    started_on: dt.datetime,
    finished_on: dt.datetime | None = None,
    invocation_id: str = "",
) -> dict[str, Any]:
    """The in-toto Statement v1 (SLSA provenance v1) for the files ``subjects``.

    Subjects are named by their path relative to ``root`` (the output folder),
    so a consumer finds them beside the statement.
    """
    finished_on = finished_on or dt.datetime.now(dt.timezone.utc)
    upstream_uri = upstream.url or (
        f"pkg:pypi/vllm@{release}?file_name={upstream.filename}"
    )
    internal: dict[str, Any] = {}
    if os.environ.get("SOURCE_DATE_EPOCH"):
        internal["SOURCE_DATE_EPOCH"] = os.environ["SOURCE_DATE_EPOCH"]
    build_definition: dict[str, Any] = {
        "buildType": BACKPORT_BUILD_TYPE,
        "externalParameters": {
            "release": release,
            "localVersion": local_version,
            "series": list(series),
        },
        "resolvedDependencies": [
            {
                "name": upstream.filename,
                "uri": upstream_uri,
                "digest": {"sha256": upstream.sha256},
                "annotations": {"kind": upstream.kind},
            },
            {
                "name": "deepstack-patch",
                "uri": f"pkg:pypi/deepstack-patch@{__version__}",
                "annotations": {"version": __version__},
            },
        ],
    }
    if internal:
        build_definition["internalParameters"] = internal
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {
                "name": path.relative_to(root).as_posix(),
                "digest": {"sha256": sha256_of(path)},
            }
            for path in subjects
        ],
        "predicateType": SLSA_PROVENANCE_TYPE,
        "predicate": {
            "buildDefinition": build_definition,
            "runDetails": {
                "builder": {
                    "id": os.environ.get(BUILDER_ID_VARIABLE) or DEFAULT_BUILDER_ID,
                    "version": {"deepstack-patch": __version__},
                },
                "metadata": {
                    "invocationId": invocation_id or uuid.uuid4().urn,
                    "startedOn": _rfc3339(started_on),
                    "finishedOn": _rfc3339(finished_on),
                },
            },
        },
    }


def _rfc3339(moment: dt.datetime) -> str:
    moment = moment.astimezone(dt.timezone.utc).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


# --- backport -----------------------------------------------------------------


def backport_document_paths(out: Path) -> dict[str, str]:
    """The ``outputs`` entries of report.json for the two documents."""
    return {
        "sbom": str((out / SBOM_NAME).resolve()),
        "provenance": str((out / PROVENANCE_NAME).resolve()),
    }


def write_backport_provenance(
    out: Path,
    report: dict[str, Any],
    archive: Path,
    started_on: dt.datetime,
    series: Sequence[Patch],
) -> tuple[Path, Path]:
    """Write the SBOM and the statement of a finished backport into ``out``.

    ``report`` is the backport's report.json document, already written. The
    statement's subjects are the tarball, the quilt ``series`` file, each patch
    file, report.json and the SBOM: every file a build consumes, but not the
    extracted tree (the tarball holds it).
    """
    # report.json's outputs are absolute: the statement names every subject
    # relative to ``out``, which a pipeline gives relative (--out backport-V).
    out = out.resolve()
    outputs = report["outputs"]
    series_dir = Path(outputs["series"])
    names = list(outputs["series_files"])
    by_id = {patch.id: patch for patch in series}
    patches = [by_id[patch_id] for patch_id in report["applied"]]
    applied = read_applied(series_dir, patches, names, out)
    upstream = UpstreamArtefact(archive.name, sha256_of(archive), "sdist")
    tarball = Path(outputs["sdist"])
    sbom = write_sbom(
        out / SBOM_NAME,
        release=report["release"],
        local_version=report["local_version"],
        upstream=upstream,
        applied=applied,
        output=tarball,
    )
    statement = provenance_statement(
        subjects=[
            tarball,
            series_dir / "series",
            *(series_dir / name for name in names),
            Path(outputs["report"]),
            sbom,
        ],
        root=out,
        release=report["release"],
        local_version=report["local_version"],
        series=[p["id"] for p in report["patches"] if p["selected"]],
        upstream=upstream,
        started_on=started_on,
    )
    provenance = out / PROVENANCE_NAME
    _write_atomically(provenance, json.dumps(statement, indent=2) + "\n")
    return sbom, provenance

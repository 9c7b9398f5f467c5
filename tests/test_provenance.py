"""Provenance documents: the CycloneDX SBOM, the in-toto statement, follow-ups.

The builders run on synthetic input in the fast tier: the SBOM is checked with
cyclonedx-python-lib's strict JSON-schema validator (CycloneDX 1.6), the
statement with a JSON Schema written here from the in-toto Statement v1
(https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md,
resource_descriptor.md) and SLSA provenance v1
(https://slsa.dev/spec/v1.0/provenance) specifications: every field they mark
REQUIRED, and the types and formats of the optional ones used here. The
`release` tests run `backport --release 0.20.2` and check both documents.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from deepstack_patch.cli import main
from deepstack_patch.distribution.provenance import (
    PROVENANCE_NAME,
    SBOM_NAME,
    AppliedPatch,
    UpstreamArtefact,
    provenance_statement,
    read_applied,
    sbom_document,
    write_sbom,
)
from deepstack_patch.fetch.releases import cached_release
from deepstack_patch.patches import SERIES, patch_by_id
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite
from deepstack_patch.patches._follow_ups import FOLLOW_UPS
from jsonschema import Draft202012Validator

UPSTREAM = UpstreamArtefact("vllm-0.20.2.tar.gz", "ab" * 32, "sdist")
WHEN = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
SHA256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}

# --- JSON Schema of an in-toto Statement v1 with a SLSA provenance v1 predicate -

RESOURCE_DESCRIPTOR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "uri": {"type": "string", "format": "uri"},
        # DigestSet: algorithm -> lowercase hex; sha256 is 64 digits.
        "digest": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]+$"},
            "properties": {"sha256": SHA256},
        },
        "content": {"type": "string", "contentEncoding": "base64"},
        "downloadLocation": {"type": "string", "format": "uri"},
        "mediaType": {"type": "string"},
        "annotations": {"type": "object"},
    },
    # "At least one of uri, digest or content" (resource_descriptor.md).
    "anyOf": [
        {"required": ["uri"]},
        {"required": ["digest"]},
        {"required": ["content"]},
    ],
}
STATEMENT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {"ResourceDescriptor": RESOURCE_DESCRIPTOR},
    "type": "object",
    "required": ["_type", "subject", "predicateType", "predicate"],
    "properties": {
        "_type": {"const": "https://in-toto.io/Statement/v1"},
        # "Each element MUST have digest set."
        "subject": {
            "type": "array",
            "minItems": 1,
            "items": {
                "allOf": [{"$ref": "#/$defs/ResourceDescriptor"}],
                "required": ["digest"],
            },
        },
        "predicateType": {"const": "https://slsa.dev/provenance/v1"},
        "predicate": {
            "type": "object",
            "required": ["buildDefinition", "runDetails"],
            "properties": {
                "buildDefinition": {
                    "type": "object",
                    "required": ["buildType", "externalParameters"],
                    "properties": {
                        "buildType": {"type": "string", "format": "uri"},
                        "externalParameters": {"type": "object", "minProperties": 1},
                        "internalParameters": {"type": "object"},
                        "resolvedDependencies": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/ResourceDescriptor"},
                        },
                    },
                },
                "runDetails": {
                    "type": "object",
                    "required": ["builder"],
                    "properties": {
                        "builder": {
                            "type": "object",
                            "required": ["id"],
                            "properties": {
                                "id": {"type": "string", "format": "uri"},
                                "version": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                },
                                "builderDependencies": {
                                    "type": "array",
                                    "items": {"$ref": "#/$defs/ResourceDescriptor"},
                                },
                            },
                        },
                        "metadata": {
                            "type": "object",
                            "properties": {
                                "invocationId": {"type": "string"},
                                "startedOn": {"type": "string", "format": "date-time"},
                                "finishedOn": {"type": "string", "format": "date-time"},
                            },
                        },
                        "byproducts": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/ResourceDescriptor"},
                        },
                    },
                },
            },
        },
    },
}
# Fields the specifications require, as paths into a statement.
REQUIRED_PATHS = [
    ("_type",),
    ("subject",),
    ("predicateType",),
    ("predicate",),
    ("predicate", "buildDefinition"),
    ("predicate", "buildDefinition", "buildType"),
    ("predicate", "buildDefinition", "externalParameters"),
    ("predicate", "runDetails"),
    ("predicate", "runDetails", "builder"),
    ("predicate", "runDetails", "builder", "id"),
]


def statement_errors(statement: dict[str, Any]) -> list[str]:
    validator = Draft202012Validator(
        STATEMENT_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    return [error.message for error in validator.iter_errors(statement)]


def sbom_errors(text: str) -> str:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    return "" if error is None else str(error)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def applied(*ids: str) -> list[AppliedPatch]:
    return [
        AppliedPatch(
            patch_by_id(patch_id),
            f"series/{number:04d}-{patch_id.replace('#', '-')}.patch",
            f"Subject: [PATCH {number}] {patch_id}\n--- a/x.py\n+++ b/x.py\n".encode(),
        )
        for number, patch_id in enumerate(ids, start=1)
    ]


def vllm_component(text: str) -> dict[str, Any]:
    return json.loads(text)["metadata"]["component"]


# --- the SBOM (fast) ----------------------------------------------------------


def test_sbom_describes_the_patched_vllm_and_validates() -> None:
    patches = applied("vllm#38040", "vllm#40917", "vllm#43617")
    text = sbom_document(
        release="0.20.2",
        local_version="0.20.2+deepstack.1",
        upstream=UpstreamArtefact(
            "vllm-0.20.2.tar.gz", "ab" * 32, "sdist", "https://files.example/v.tgz"
        ),
        applied=patches,
        output_sha256="cd" * 32,
        timestamp=WHEN,
    )
    assert sbom_errors(text) == ""
    document = json.loads(text)
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.6"
    component = document["metadata"]["component"]
    assert component["name"] == "vllm"
    assert component["version"] == "0.20.2+deepstack.1"
    assert component["purl"] == "pkg:pypi/vllm@0.20.2%2Bdeepstack.1"
    assert component["hashes"] == [{"alg": "SHA-256", "content": "cd" * 32}]
    [ancestor] = component["pedigree"]["ancestors"]
    assert ancestor["purl"] == "pkg:pypi/vllm@0.20.2"
    assert ancestor["hashes"] == [{"alg": "SHA-256", "content": "ab" * 32}]
    assert ancestor["externalReferences"] == [
        {"type": "distribution", "url": "https://files.example/v.tgz"}
    ]
    entries = {
        entry["resolves"][0]["id"]: entry for entry in component["pedigree"]["patches"]
    }
    assert sorted(entries) == sorted(p.patch.id for p in patches)
    for item in patches:
        entry = entries[item.patch.id]
        assert entry["type"] == "backport"
        assert entry["diff"]["text"]["content"] == item.text.decode()
        assert entry["diff"]["url"] == item.path
        [issue] = entry["resolves"]
        assert issue["type"] == "defect"
        assert issue["name"] == item.patch.title
        assert issue["references"] == [item.patch.upstream_url]


def test_sbom_mentions_every_follow_up_of_the_applied_patches() -> None:
    patches = applied("vllm#40917", "vllm#43617")
    component = vllm_component(
        sbom_document(
            release="0.20.2",
            local_version="0.20.2+deepstack.1",
            upstream=UPSTREAM,
            applied=patches,
            timestamp=WHEN,
        )
    )
    recorded = [
        (item.patch.id, follow_up.reference)
        for item in patches
        for follow_up in item.patch.follow_ups
    ]
    assert ("vllm#43617", "vllm#53516") in recorded
    assert ("vllm#40917", "vllm#49094") in recorded
    properties = component["properties"]
    for patch_id, reference in recorded:
        assert any(
            p["name"] == f"deepstack-patch:follow-up:{patch_id}"
            and p["value"].startswith(f"{reference} (")
            for p in properties
        ), (patch_id, reference)
        assert f"{patch_id} follow-up: {reference}" in component["pedigree"]["notes"]
    assert len(properties) == len(recorded)


def test_sbom_without_follow_ups_or_patches_still_validates() -> None:
    text = sbom_document(
        release="0.21.0",
        local_version="0.21.0+deepstack.1",
        upstream=UPSTREAM,
        applied=[],
        timestamp=WHEN,
    )
    assert sbom_errors(text) == ""
    component = vllm_component(text)
    assert "properties" not in component and "notes" not in component["pedigree"]
    assert "patches" not in component["pedigree"]


def test_a_non_utf8_series_file_is_attached_as_base64() -> None:
    raw = b"--- a/x.py\n+++ b/x.py\n+caf\xe9\n"
    item = AppliedPatch(patch_by_id("vllm#40932"), "series/0001-x.patch", raw)
    text = sbom_document(
        release="0.20.1",
        local_version="0.20.1+deepstack.1",
        upstream=UPSTREAM,
        applied=[item],
        timestamp=WHEN,
    )
    assert sbom_errors(text) == ""
    [entry] = vllm_component(text)["pedigree"]["patches"]
    attached = entry["diff"]["text"]
    assert attached["encoding"] == "base64"
    assert base64.b64decode(attached["content"]) == raw


def test_sbom_is_reproducible_for_a_fixed_build_date() -> None:
    def build(when: dt.datetime) -> str:
        return sbom_document(
            release="0.20.2",
            local_version="0.20.2+deepstack.1",
            upstream=UPSTREAM,
            applied=applied("vllm#40917"),
            timestamp=when,
        )

    assert build(WHEN) == build(WHEN)
    later = json.loads(build(WHEN + dt.timedelta(seconds=1)))
    assert later["serialNumber"] != json.loads(build(WHEN))["serialNumber"]


def test_the_validator_rejects_a_broken_sbom() -> None:
    document = json.loads(
        sbom_document(
            release="0.20.2",
            local_version="0.20.2+deepstack.1",
            upstream=UPSTREAM,
            applied=applied("vllm#40917"),
            timestamp=WHEN,
        )
    )
    document["metadata"]["component"]["pedigree"]["patches"][0]["type"] = "fix"
    assert sbom_errors(json.dumps(document)) != ""


def test_write_sbom_for_a_wheel_reads_the_series_it_was_given(tmp_path: Path) -> None:
    series = tmp_path / "patches"
    series.mkdir()
    (series / "0001-a.patch").write_bytes(b"--- a/x.py\n+++ b/x.py\n")
    wheel = tmp_path / "dist" / "vllm-0.20.2+deepstack.1-cp38-abi3-linux_x86_64.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"wheel bytes")
    items = read_applied(
        series, [patch_by_id("vllm#40917")], ["0001-a.patch"], wheel.parent
    )
    assert items[0].path == "../patches/0001-a.patch"
    path = write_sbom(
        wheel.parent / SBOM_NAME,
        release="0.20.2",
        local_version="0.20.2+deepstack.1",
        upstream=UpstreamArtefact(
            "vllm-0.20.2-cp38-abi3-linux_x86_64.whl", "ef" * 32, "wheel"
        ),
        applied=items,
        output=wheel,
    )
    text = path.read_text()
    assert sbom_errors(text) == ""
    component = vllm_component(text)
    assert (
        component["hashes"][0]["content"] == hashlib.sha256(b"wheel bytes").hexdigest()
    )
    assert (
        "wheel vllm-0.20.2-cp38-abi3"
        in component["pedigree"]["ancestors"][0]["description"]
    )
    [entry] = component["pedigree"]["patches"]
    assert entry["diff"]["text"]["content"] == "--- a/x.py\n+++ b/x.py\n"
    assert not list(wheel.parent.glob("*.partial"))


# --- the in-toto statement (fast) ---------------------------------------------


@pytest.fixture
def outputs(tmp_path: Path) -> list[Path]:
    files = {
        "vllm-0.20.2+deepstack.1.tar.gz": b"tarball",
        "series/series": b"0001-a.patch\n",
        "series/0001-a.patch": b"--- a\n+++ b\n",
        "report.json": b"{}\n",
        SBOM_NAME: b"{}\n",
    }
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    return [tmp_path / name for name in files]


def make_statement(root: Path, subjects: list[Path]) -> dict[str, Any]:
    return provenance_statement(
        subjects=subjects,
        root=root,
        release="0.20.2",
        local_version="0.20.2+deepstack.1",
        series=[p.id for p in SERIES],
        upstream=UPSTREAM,
        started_on=WHEN,
        finished_on=WHEN + dt.timedelta(seconds=14),
    )


def test_statement_follows_in_toto_v1_and_slsa_provenance_v1(
    tmp_path: Path, outputs: list[Path]
) -> None:
    statement = make_statement(tmp_path, outputs)
    assert statement_errors(statement) == []
    names = [subject["name"] for subject in statement["subject"]]
    assert names == [path.relative_to(tmp_path).as_posix() for path in outputs]
    for subject, path in zip(statement["subject"], outputs, strict=True):
        assert subject["digest"] == {
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()
        }
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"] == {
        "release": "0.20.2",
        "localVersion": "0.20.2+deepstack.1",
        "series": [p.id for p in SERIES],
    }
    upstream, tool = definition["resolvedDependencies"]
    assert upstream["digest"] == {"sha256": UPSTREAM.sha256}
    assert upstream["uri"] == "pkg:pypi/vllm@0.20.2?file_name=vllm-0.20.2.tar.gz"
    assert tool["name"] == "deepstack-patch" and tool["annotations"]["version"]
    metadata = statement["predicate"]["runDetails"]["metadata"]
    assert metadata["startedOn"] == "2026-05-01T12:00:00Z"
    assert metadata["finishedOn"] == "2026-05-01T12:00:14Z"
    assert metadata["invocationId"].startswith("urn:uuid:")


def test_the_statement_schema_rejects_each_missing_required_field(
    tmp_path: Path, outputs: list[Path]
) -> None:
    statement = make_statement(tmp_path, outputs)
    for path in REQUIRED_PATHS:
        broken = copy.deepcopy(statement)
        parent = broken
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        assert statement_errors(broken), f"accepted without {'.'.join(path)}"
    broken = copy.deepcopy(statement)
    del broken["subject"][0]["digest"]
    assert statement_errors(broken), "accepted a subject without digest"
    broken = copy.deepcopy(statement)
    broken["predicate"]["runDetails"]["metadata"]["startedOn"] = "yesterday"
    assert statement_errors(broken), "accepted a startedOn that is no timestamp"


def test_builder_id_comes_from_the_pipeline(
    tmp_path: Path, outputs: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = "https://github.com/acme/vllm-build/.github/workflows/backport.yml"
    monkeypatch.setenv("DEEPSTACK_PATCH_BUILDER_ID", runner)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    statement = make_statement(tmp_path, outputs)
    assert statement["predicate"]["runDetails"]["builder"]["id"] == runner
    definition = statement["predicate"]["buildDefinition"]
    assert definition["internalParameters"] == {"SOURCE_DATE_EPOCH": "1700000000"}
    assert statement_errors(statement) == []


# --- follow-ups in list and status (fast) -------------------------------------


def test_list_json_lists_follow_ups_per_patch() -> None:
    code, output = run("list", "--format", "json")
    assert code == 0
    by_id = {p["id"]: p["follow_ups"] for p in json.loads(output)["patches"]}
    assert sorted(by_id) == sorted(p.id for p in SERIES)
    references = {pid: [f["reference"] for f in ups] for pid, ups in by_id.items()}
    assert "vllm#53516" in references["vllm#43617"]
    assert references["vllm#40917"] == ["vllm#49094"]
    for follow_ups in by_id.values():
        for follow_up in follow_ups:
            assert set(follow_up) == {
                "reference",
                "status",
                "recorded",
                "summary",
                "headline",
                "url",
            }
            assert follow_up["status"] in {"open", "closed", "merged"}
            assert follow_up["summary"].endswith(".")
            dt.date.fromisoformat(follow_up["recorded"])
    [issue] = [f for f in by_id["vllm#43617"] if f["reference"] == "vllm#53516"]
    assert issue["status"] == "closed"
    assert issue["url"] == "https://github.com/vllm-project/vllm/issues/53516"


def test_every_recorded_follow_up_is_on_its_patch() -> None:
    assert set(FOLLOW_UPS) <= {p.id for p in SERIES}
    compared = 0
    for patch in SERIES:
        assert patch.follow_ups == FOLLOW_UPS.get(patch.id, ()), patch.id
        compared += len(patch.follow_ups)
    assert compared == sum(len(entry) for entry in FOLLOW_UPS.values()) > 0


def test_list_text_shows_follow_ups() -> None:
    code, output = run("list")
    assert code == 0
    flat = " ".join(output.split())
    assert "follow-up: vllm#53516 (closed when recorded on" in flat
    assert "follow-up: vllm#49094 (open when recorded on" in flat


def test_status_shows_the_follow_ups_of_the_patches_that_matter(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    (tree / "vllm/model_executor/models").mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("")
    (tree / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (tree / "vllm/model_executor/models/granite4_vision.py").write_text(granite.BEFORE)
    code, output = run("status", "--vllm-src", str(tree), "--format", "json")
    assert code == 0
    by_id = {p["id"]: p for p in json.loads(output)["patches"]}
    assert [f["reference"] for f in by_id["vllm#40917"]["follow_ups"]] == ["vllm#49094"]
    assert "vllm#53516" in [f["reference"] for f in by_id["vllm#43617"]["follow_ups"]]
    code, output = run("status", "--vllm-src", str(tree), "--verbose")
    assert code == 0
    flat = " ".join(output.split())
    # Granite4Vision is needed here; Qwen3-VL is absent (not applicable).
    assert "vllm#40917 follow-up: vllm#49094" in flat
    [headline] = [f.headline for f in FOLLOW_UPS["vllm#40917"]]
    assert f"\n  {headline}\n" in output
    assert "vllm#53516" not in flat
    # Without --verbose, one line stands for them and says how to read them.
    code, output = run("status", "--vllm-src", str(tree))
    assert code == 0
    assert "vllm#49094" not in output
    # ... just above the counts that end status (issue 41, item 2).
    assert output.splitlines()[-2] == (
        "1 upstream follow-up: `deepstack-patch status --verbose` or `list` shows it"
    )


def test_every_follow_up_has_a_headline_that_fits_a_line() -> None:
    """Printed whole where a person decides: never cut, so written to fit."""
    from deepstack_patch.engine.protocol import HEADLINE_MAX

    headlines = [f.headline for ups in FOLLOW_UPS.values() for f in ups]
    assert headlines and all(headlines)
    assert [h for h in headlines if len(h) > HEADLINE_MAX] == []
    # the consequence a distributor needs for vllm#53516: the accuracy loss
    [accuracy] = [
        f.headline for f in FOLLOW_UPS["vllm#43617"] if f.reference == "vllm#53516"
    ]
    assert "27 points" in accuracy


def test_apply_with_nothing_to_do_says_only_how_many_follow_ups(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    (tree / "vllm/model_executor/models").mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("")
    (tree / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (tree / "vllm/model_executor/models/granite4_vision.py").write_text(granite.AFTER)
    code, output = run("apply", "--vllm-src", str(tree))
    assert code == 0, output
    assert " follow-up: vllm#" not in output
    assert "vllm#49094" not in output
    assert "1 upstream follow-up: `deepstack-patch status --verbose`" in output
    assert max(len(line) for line in output.splitlines() if "follow-up" in line) <= 80


def test_list_does_not_import_the_sbom_library() -> None:
    script = (
        "import sys\n"
        "from deepstack_patch.cli import main\n"
        "try:\n"
        "    main(['list', '--format', 'json'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('cyclonedx', 'packageurl', 'jsonschema'))\n"
        "print('LOADED', loaded, 'PROVENANCE', "
        "'deepstack_patch.distribution.provenance' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert "LOADED [] PROVENANCE False" in result.stdout, result.stdout


# --- backport on a real release -----------------------------------------------


@pytest.mark.release
def test_backport_writes_a_valid_sbom_and_statement(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = run("backport", "--release", "0.20.2", "--out", str(out))
    assert code == 0, output
    report = json.loads((out / "report.json").read_text())
    assert report["outputs"]["sbom"] == str((out / SBOM_NAME).resolve())
    assert report["outputs"]["provenance"] == str((out / PROVENANCE_NAME).resolve())

    text = (out / SBOM_NAME).read_text()
    assert sbom_errors(text) == ""
    component = vllm_component(text)
    assert component["version"] == "0.20.2+deepstack.1"
    assert component["hashes"][0]["content"] == report["outputs"]["sdist_sha256"]
    entries = component["pedigree"]["patches"]
    # Exactly the backports the report says were applied: four on 0.20.2,
    # vllm#49397 with the fix it accompanies.
    assert sorted(report["applied"]) == [
        "vllm#38040",
        "vllm#40917",
        "vllm#43617",
        "vllm#49397",
    ]
    assert sorted(e["resolves"][0]["id"] for e in entries) == sorted(report["applied"])
    for entry in entries:
        series_file = out / entry["diff"]["url"]
        assert entry["diff"]["text"]["content"] == series_file.read_text()
    archive = cached_release("0.20.2")
    assert archive is not None
    archive_sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert component["pedigree"]["ancestors"][0]["hashes"][0]["content"] == archive_sha

    statement = json.loads((out / PROVENANCE_NAME).read_text())
    assert statement_errors(statement) == []
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    expected = {
        "vllm-0.20.2+deepstack.1.tar.gz",
        "series/series",
        "report.json",
        SBOM_NAME,
        *(f"series/{name}" for name in report["outputs"]["series_files"]),
    }
    assert set(subjects) == expected
    for name, digest in subjects.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name
    definition = statement["predicate"]["buildDefinition"]
    assert definition["resolvedDependencies"][0]["digest"] == {"sha256": archive_sha}
    parameters = definition["externalParameters"]
    assert parameters["release"] == "0.20.2"
    assert parameters["localVersion"] == "0.20.2+deepstack.1"
    assert parameters["series"] == [p.id for p in SERIES]


def test_apply_names_the_follow_ups_of_the_fixes_it_reports(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "vllm/model_executor/models").mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("")
    (tree / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (tree / "vllm/model_executor/models/granite4_vision.py").write_text(granite.BEFORE)
    code, output = run("apply", "--vllm-src", str(tree))
    assert code == 0, output
    lines = [line for line in output.splitlines() if "follow-up:" in line]
    assert len(lines) == 1 and lines[0].startswith("vllm#40917  follow-up: vllm#49094")
    # applied now: the follow-up whole, its headline uncut, where one decides
    [follow_up] = FOLLOW_UPS["vllm#40917"]
    assert f"  {follow_up.headline}" in output.splitlines()
    assert "upstream follow-up" not in output
    code, output = run("apply", "--vllm-src", str(tree), "--format", "json")
    by_id = {p["id"]: p for p in json.loads(output)["patches"]}
    assert [f["reference"] for f in by_id["vllm#40917"]["follow_ups"]] == ["vllm#49094"]

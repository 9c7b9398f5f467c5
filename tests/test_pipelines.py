"""CI pipelines `matrix --emit` writes, checked without network.

The emitted GitHub Actions workflow and Buildkite pipeline are validated
against the services' published JSON schemas, as check-jsonschema vendors them
(SchemaStore's github-workflow.json and buildkite.json), read from the
installed package with jsonschema: offline, and a deliberately broken pipeline
must fail the same check. Every job keeps the SBOM and the in-toto statement
beside the tarball, and a GitHub job attests the tarball its backport writes
(test_distribution.py runs that backport command on a real release).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from deepstack_patch.cli import main
from jsonschema import Draft7Validator
from jsonschema.exceptions import best_match

from tests.support import TARGETS

SCHEMAS = {"github-actions": "github-workflows.json", "buildkite": "buildkite.json"}
ATTEST_ACTION = "actions/attest-build-provenance@v2"
MATRIX_EXPRESSION = re.compile(r"\$\{\{\s*matrix\.([\w-]+)\s*\}\}")


def emitted(kind: str, *options: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        main, ["matrix", "--emit", kind, "--output", "-", *options]
    )
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.output)


@cache
def validator(kind: str) -> Draft7Validator:
    """The service's schema, as check-jsonschema ships it (no download)."""
    vendored = files("check_jsonschema.builtin_schemas.vendor") / SCHEMAS[kind]
    schema = json.loads(vendored.read_text(encoding="utf-8"))
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def schema_errors(kind: str, document: dict[str, Any]) -> list[str]:
    """Where and why, from the most specific branch of each anyOf/oneOf."""
    found = []
    for error in validator(kind).iter_errors(document):
        specific = best_match([error])
        assert specific is not None
        where = "/".join(map(str, specific.absolute_path))
        found.append(f"{where}: {specific.message}")
    return found


def github_job(document: dict[str, Any]) -> dict[str, Any]:
    return document["jobs"]["backport"]


def matrix_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    return github_job(document)["strategy"]["matrix"]["include"]


def expand(text: str, row: dict[str, Any]) -> str:
    """``text`` as GitHub runs it in the job of matrix row ``row``."""

    def value(match: re.Match[str]) -> str:
        assert match.group(1) in row, f"{match.group(0)}: not in the matrix row"
        return str(row[match.group(1)])

    return MATRIX_EXPRESSION.sub(value, text)


def attest_steps(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        step
        for step in github_job(document)["steps"]
        if step.get("uses", "").startswith("actions/attest-build-provenance@")
    ]


# --- every release, and the schemas -------------------------------------------


@pytest.mark.parametrize("kind", ["github-actions", "buildkite"])
def test_emitted_pipeline_is_yaml_naming_every_release(kind: str) -> None:
    document = emitted(kind)
    if kind == "github-actions":
        rows = matrix_rows(document)
        assert [row["release"] for row in rows] == TARGETS.releases
        scripts = [row["run"] for row in rows]
    else:
        group = document["steps"][0]
        assert [s["label"].split()[-1] for s in group["steps"]] == TARGETS.releases
        scripts = ["\n".join(s["commands"]) for s in group["steps"]]
    for release, script in zip(TARGETS.releases, scripts, strict=True):
        assert f"deepstack-patch backport --release {release} " in script
        assert "deepstack-patch verify --vllm-src " in script


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        pytest.param("github-actions", (), id="github-actions"),
        pytest.param("github-actions", ("--no-attest",), id="github-no-attest"),
        pytest.param("buildkite", (), id="buildkite"),
        pytest.param("buildkite", ("--no-watch",), id="buildkite-no-watch"),
        pytest.param("github-actions", ("--no-watch",), id="github-no-watch"),
    ],
)
def test_emitted_pipeline_is_valid_by_the_service_schema(
    kind: str, options: tuple[str, ...]
) -> None:
    assert schema_errors(kind, emitted(kind, *options)) == []


def _steps(document: dict[str, Any]) -> list[dict[str, Any]]:
    return github_job(document)["steps"]


def _first_buildkite_step(document: dict[str, Any]) -> dict[str, Any]:
    return document["steps"][0]["steps"][0]


BREAKAGES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "permission-beyond-write": (
        "github-actions",
        lambda d: github_job(d)["permissions"].update({"id-token": "admin"}),
    ),
    "no-runs-on": ("github-actions", lambda d: github_job(d).pop("runs-on")),
    "step-both-uses-and-run": (
        "github-actions",
        lambda d: _steps(d)[-1].update({"run": "true"}),
    ),
    "on-read-as-yaml-1.1-boolean": (
        "github-actions",
        lambda d: d.update({True: d.pop("on")}),
    ),
    "misspelt-artifact-paths": (
        "buildkite",
        lambda d: _first_buildkite_step(d).update({"artifacts_paths": ["x"]}),
    ),
    "timeout-not-a-number": (
        "buildkite",
        lambda d: _first_buildkite_step(d).update({"timeout_in_minutes": "ninety"}),
    ),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_pipeline_fails_the_schema(breakage: str) -> None:
    """The check can fail: each deliberate mistake is caught."""
    kind, damage = BREAKAGES[breakage]
    document = emitted(kind)
    broken = copy.deepcopy(document)
    damage(broken)
    assert broken != document
    assert schema_errors(kind, broken), f"{breakage}: passed the {kind} schema"


# --- what every job keeps -------------------------------------------------------


def test_github_upload_keeps_the_sbom_and_the_statement() -> None:
    document = emitted("github-actions")
    (upload,) = [
        step
        for step in _steps(document)
        if step.get("uses", "").startswith("actions/upload-artifact@")
    ]
    assert upload["if"] == "always()"
    rows = matrix_rows(document)
    assert rows
    for row in rows:
        paths = expand(upload["with"]["path"], row).splitlines()
        folder = f"backport-{row['release']}"
        for name in ("sbom.cdx.json", "provenance.intoto.json", "report.json"):
            assert f"{folder}/{name}" in paths, (row["release"], paths)


def test_buildkite_artifact_paths_keep_the_sbom_and_the_statement() -> None:
    group = emitted("buildkite")["steps"][0]
    assert [step["label"].split()[-1] for step in group["steps"]] == TARGETS.releases
    for release, step in zip(TARGETS.releases, group["steps"], strict=True):
        for name in ("sbom.cdx.json", "provenance.intoto.json", "report.json"):
            assert f"backport-{release}/{name}" in step["artifact_paths"]
        assert not any("attest" in command for command in step["commands"])


# --- attestation ------------------------------------------------------------------


def test_github_job_attests_the_tarball_its_backport_writes() -> None:
    document = emitted("github-actions")
    job = github_job(document)
    assert job["permissions"] == {
        "id-token": "write",
        "attestations": "write",
        "contents": "read",
    }
    (attest,) = attest_steps(document)
    assert attest["uses"] == ATTEST_ACTION
    # No `if:`: only a release whose backport and verify passed is signed.
    assert "if" not in attest
    names = [step.get("name") for step in job["steps"]]
    uploads = [
        i
        for i, step in enumerate(job["steps"])
        if step.get("uses", "").startswith("actions/upload-artifact@")
    ]
    assert names.index("Backport and verify") < job["steps"].index(attest) < uploads[0]
    rows = matrix_rows(document)
    assert [row["release"] for row in rows] == TARGETS.releases
    for row in rows:
        release = row["release"]
        # backport --out DIR --local-version L writes DIR/vllm-<release>+L.tar.gz
        # (test_distribution.py holds backport to that name on a real release).
        assert (
            f"--out backport-{release} --local-version deepstack.1"
            in row["run"].splitlines()[0]
        )
        subject = expand(attest["with"]["subject-path"], row)
        assert subject == f"backport-{release}/vllm-{release}+deepstack.1.tar.gz"


def test_no_attest_leaves_out_the_step_and_its_permissions() -> None:
    document = emitted("github-actions", "--no-attest")
    assert attest_steps(document) == []
    assert github_job(document)["permissions"] == {"contents": "read"}
    assert "id-token" not in yaml.safe_dump(document)


def test_matrix_help_explains_attest() -> None:
    # Wide enough that no option name is broken across lines.
    result = CliRunner().invoke(
        main, ["matrix", "--help"], terminal_width=400, max_content_width=400
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for words in (
        "--attest / --no-attest",
        "actions/attest-build-provenance",
        "id-token: write",
        "attestations: write",
        "contents: read",
    ):
        assert words in text, words


def test_emitted_pipeline_file_round_trips(tmp_path: Path) -> None:
    """--output FILE writes what --output - prints."""
    pipeline = tmp_path / ".github" / "workflows" / "deepstack.yml"
    result = CliRunner().invoke(
        main, ["matrix", "--emit", "github-actions", "--output", str(pipeline)]
    )
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(pipeline.read_text()) == emitted("github-actions")


# --- the scheduled watch of upstream -------------------------------------------


def test_github_schedule_runs_the_watch_instead_of_the_backports() -> None:
    document = emitted("github-actions")
    assert document["on"]["schedule"] == [{"cron": "17 5 * * 1"}]
    assert github_job(document)["if"] == "github.event_name != 'schedule'"
    watch = document["jobs"]["watch"]
    assert watch["if"] == "github.event_name == 'schedule'"
    assert watch["permissions"] == {"contents": "read"}
    (run,) = [
        step["run"] for step in watch["steps"] if step.get("name") == "Watch upstream"
    ]
    assert run == f"deepstack-patch watch --since {TARGETS.releases[0]}"


def test_buildkite_schedule_runs_the_watch_instead_of_the_backports() -> None:
    group, watch = emitted("buildkite")["steps"]
    assert group["if"] == 'build.source != "schedule"'
    assert watch["if"] == 'build.source == "schedule"'
    assert (
        watch["commands"][-1] == f"deepstack-patch watch --since {TARGETS.releases[0]}"
    )


@pytest.mark.parametrize("kind", ["github-actions", "buildkite"])
def test_no_watch_leaves_the_schedule_out(kind: str) -> None:
    document = emitted(kind, "--no-watch")
    text = yaml.safe_dump(document)
    assert "watch" not in text and "schedule" not in text

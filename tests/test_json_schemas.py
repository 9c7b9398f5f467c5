"""Every command's ``--format json`` document, as a real run prints it,
matches the JSON Schema published for it in docs/schemas/; a tree and a
patch's state have one shape in all of them (docs/schemas/common.json).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tests.support import link_copy, site_of

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "docs" / "schemas"
GRANITE = "vllm/model_executor/models/granite4_vision.py"


def registry() -> Registry:
    """The schemas by file name: ``common.json#/$defs/tree`` resolves as a
    validator reading docs/schemas/ from disk resolves it."""
    return Registry().with_resources(
        (path.name, Resource.from_contents(json.loads(path.read_text())))
        for path in sorted(SCHEMAS.glob("*.json"))
    )


def errors(schema_name: str, document: dict[str, Any]) -> list[str]:
    schema = json.loads((SCHEMAS / f"{schema_name}.json").read_text())
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(
        schema,
        registry=registry(),
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
        for e in validator.iter_errors(document)
    ]


def run_json(
    *args: str, env: dict[str, str] | None = None, codes: tuple[int, ...] = (0, 1)
) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode in codes, result.stdout + result.stderr
    return json.loads(result.stdout)


def small_tree(folder: Path, granite_source: str) -> Path:
    """A 0.20.2 tree holding only Granite4Vision's model file."""
    (folder / "vllm/model_executor/models").mkdir(parents=True)
    (folder / "vllm/__init__.py").write_text("")
    (folder / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (folder / GRANITE).write_text(granite_source)
    return folder


#: Each command's documents, by the schema that describes them.
Documents = dict[str, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def documents(
    release_tree: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Documents:
    root = release_tree("0.20.2")
    work = tmp_path_factory.mktemp("json-schemas")
    src = str(root)
    copy_ = link_copy(root, work / "copy")
    site = site_of(root, work / "site")
    doctor_env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "DEEPSTACK_PATCH_CACHE": str(work / "doctor-cache"),
    }
    releases = work / "releases.txt"
    releases.write_text("0.20.2\n0.17.0\n")
    found: Documents = {
        "status": [run_json("status", "--vllm-src", src)],
        "apply": [
            run_json("apply", "--vllm-src", src, "--check"),
            run_json("apply", "--vllm-src", src, "--dry-run"),
            run_json("apply", "--vllm-src", str(copy_)),
        ],
        "export": [
            run_json("export", "--vllm-src", src, "--series", str(work / "series"))
        ],
        "list": [run_json("list")],
        "list-footprint": [run_json("list", "--footprint", "--vllm-src", src)],
        "matrix": [run_json("matrix", "--releases", str(releases), "-j", "1")],
        "doctor": [run_json("doctor", env=doctor_env)],
    }
    # revert gives back what apply wrote into the installed vLLM
    found["apply"].append(run_json("apply", "--vllm-src", str(site)))
    found["doctor"].append(run_json("doctor", env=doctor_env))
    found["revert"] = [run_json("revert", "--vllm-src", str(site))]
    found["error"] = [
        run_json("status", "--vllm-src", str(work / "absent"), codes=(2,)),
        run_json("apply", "--vllm-src", src, "--commit", "--check", codes=(2,)),
        run_json("list", "--vllm-src", src, codes=(2,)),
    ]
    return found


SCHEMA_NAMES = sorted(
    path.stem for path in SCHEMAS.glob("*.json") if path.stem != "common"
)
#: The slow runs (a backport repacks a release; watch reads several) and
#: verify (its managed environment) are validated in their own tests below;
#: cache in tests/test_cache_command.py (a private cache made there).
ELSEWHERE = {"backport", "watch", "verify", "derive", "cache"}


@pytest.mark.release
@pytest.mark.parametrize(
    "schema_name", [name for name in SCHEMA_NAMES if name not in ELSEWHERE]
)
def test_real_output_matches_its_schema(schema_name: str, documents: Documents) -> None:
    checked = documents[schema_name]
    assert checked, f"no {schema_name} document was made"
    for document in checked:
        assert errors(schema_name, document) == [], document.get("command")


@pytest.mark.release
def test_backport_and_watch_match_their_schemas(tmp_path: Path) -> None:
    out = tmp_path / "backport"
    document = run_json("backport", "--release", "0.20.2", "--out", str(out))
    assert errors("backport", document) == []
    report = json.loads((out / "report.json").read_text())
    assert errors("backport", report) == []
    assert errors("watch", run_json("watch", "--since", "0.32.0")) == []


@pytest.mark.verify
def test_verify_matches_its_schema(proof_env: object, tmp_path: Path) -> None:
    tree = small_tree(tmp_path / "tree", granite.AFTER)
    document = run_json("verify", "--vllm-src", str(tree))
    assert errors("verify", document) == []
    assert [p["state"] for p in document["patches"] if p["id"] == "vllm#40917"] == [
        "applied"
    ]


def test_derive_matches_its_schema(tmp_path: Path) -> None:
    """derive on a small tree of its own (no release needed): a written
    patch, then the same derive again, refused (the data file exists)."""
    before = "def answer():\n    return 41\n"
    tree = small_tree(tmp_path / "tree", "")
    (tree / "vllm/toy.py").write_text(before)
    diff = tmp_path / "fix.diff"
    diff.write_text(
        "--- a/vllm/toy.py\n+++ b/vllm/toy.py\n@@ -1,2 +1,2 @@\n"
        " def answer():\n-    return 41\n+    return 42\n"
    )
    args = ["derive", "--diff", str(diff), "--base-src", str(tree)]
    args += ["--id", "acme#5", "--out", str(tmp_path / "out")]
    document = run_json(*args, codes=(0,))
    assert errors("derive", document) == []
    assert document["units"] and document["fixed_in"] == ""
    refused = run_json(*args, codes=(2,))
    assert "already exists" in refused["error"]["message"]
    assert errors("error", refused) == []
    assert errors("derive", refused)  # an error is not a derived patch


@pytest.mark.release
def test_one_shape_for_a_tree_and_a_patch_everywhere(documents: Documents) -> None:
    """The same keys for a tree and for a planned patch in every command;
    the shared part of a patch's state in all the others."""
    trees = [
        document["tree"]
        for name in ("status", "apply", "export", "list-footprint", "doctor", "revert")
        for document in documents[name]
    ]
    assert len({tuple(tree) for tree in trees}) == 1, trees
    planned = [
        tuple(patch)[: len(documents["status"][0]["patches"][0])]
        for name in ("status", "apply", "export", "doctor")
        for document in documents[name]
        for patch in document["patches"]
    ]
    assert planned and len(set(planned)) == 1, set(planned)
    shared = ("id", "title", "state", "reason")
    assert planned[0][:4] == shared
    [matrix] = documents["matrix"]
    rows = [patch for release in matrix["releases"] for patch in release["patches"]]
    assert rows and {tuple(patch) for patch in rows} == {shared}
    [footprint] = documents["list-footprint"]
    assert footprint["command"] == "list --footprint"


def test_a_document_that_breaks_a_shared_shape_fails_its_schema() -> None:
    """The schemas can fail: a wrong state, a tree without its version."""
    document = {
        "schema": 1,
        "command": "status",
        "tree": {"path": "/t", "version": "0.20.2", "version_source": "PKG-INFO"},
        "patches": [],
        "counts": {"needed": 0, "drifted": 0, "applied": 0, "not-applicable": 0},
    }
    assert errors("status", document) == []
    assert errors("status", {k: v for k, v in document.items() if k != "counts"})
    broken = copy.deepcopy(document)
    del broken["tree"]["version"]
    assert errors("status", broken)
    patch = {
        "id": "vllm#1",
        "title": "t",
        "state": "needed",
        "reason": "",
        "upstream_url": "u",
        "fixed_in": "0.1.0",
        "base": "",
        "commit": "",
        "selected": True,
        "blocked_by": [],
        "companions": [],
        "applied_now": False,
        "parts": [],
        "files": [],
        "follow_ups": [],
        "not_carried": [],
        "locations": [],
    }
    assert errors("status", {**document, "patches": [patch]}) == []
    for key, value in (("state", "maybe"), ("reason", ["a", "list"])):
        assert errors("status", {**document, "patches": [{**patch, key: value}]})
    assert errors("error", {"schema": 1, "command": "status"})


def test_every_schema_is_named_in_output_md() -> None:
    output_md = (ROOT / "docs" / "output.md").read_text()
    assert SCHEMA_NAMES
    missing = [
        name
        for name in [*SCHEMA_NAMES, "common"]
        if f"schemas/{name}.json" not in output_md
    ]
    assert missing == []

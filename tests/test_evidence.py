"""`deepstack-patch verify --gpu-evidence`: each fix's symptom, measured.

The tests marked ``verify`` measure on the CPU (``--device cpu``) in verify's
managed environment, on 0.19.1, 0.20.1 and 0.20.2 against their pristine
releases, and hold the mechanisms, never the timings: the pristine tree must
show each symptom's mechanism (two compilations, 8,192 rows reaching the
compiled step, a compiled output that dropped the payload, a padded step
rejected, the meta-device error), the patched tree its absence.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.output.evidence import evidence_json, evidence_markdown
from deepstack_patch.patches import patch_by_id
from deepstack_patch.proof import envs
from deepstack_patch.proof.evidence import EvidenceReport, EvidenceRow

#: What each release's pristine tree needs that has a measurement.
MEASURED = {
    "0.19.1": {"vllm#38933", "vllm#49397"},
    "0.20.1": {"vllm#40917", "vllm#40932", "vllm#43617", "vllm#49397"},
    "0.20.2": {"vllm#40917", "vllm#43617", "vllm#49397"},
}
#: vllm#49397's bug is native before vllm#40145 (0.19), latent on 0.20 until
#: vllm#43617 is applied: its pristine side there is pristine + vllm#43617
#: (and vllm#40932, which it requires, where that is needed too).
BASELINE_49397 = {
    "0.19.1": [],
    "0.20.1": ["vllm#40932", "vllm#43617"],
    "0.20.2": ["vllm#43617"],
}


def _figures(entry: dict[str, Any], side: str) -> dict[str, Any]:
    result = entry[side]
    assert result["status"] == "measured", result
    return result["measurement"]["figures"]


def _check_38933(entry: dict[str, Any]) -> None:
    assert _figures(entry, "pristine")["compilations"] == 2
    assert _figures(entry, "patched")["compilations"] == 1


def _check_40917(entry: dict[str, Any]) -> None:
    assert _figures(entry, "pristine")["rows_reaching_compiled_step"] == [8192]
    assert _figures(entry, "patched")["rows_reaching_compiled_step"] == [1]


def _check_43617(entry: dict[str, Any]) -> None:
    before, after = _figures(entry, "pristine"), _figures(entry, "patched")
    assert before["levels_traced"] == 0 and before["levels_with_payload"] == 3
    assert before["max_abs_difference"] > 0.1 * before["max_abs_output"]
    assert after["levels_traced"] == 3
    assert after["max_abs_difference"] < 1e-4 * max(after["max_abs_output"], 1)


def _check_40932(entry: dict[str, Any]) -> None:
    before, after = _figures(entry, "pristine"), _figures(entry, "patched")
    assert not before["accepted"] and before["error"].startswith("ValueError")
    assert after["accepted"] and after["rows"] == [5] and not after["error"]


def _check_49397(entry: dict[str, Any]) -> None:
    before, after = _figures(entry, "pristine"), _figures(entry, "patched")
    assert before["buffer_devices"] == ["meta"]
    assert "Tensor on device meta" in before["error"]
    assert after["buffer_devices"] == ["cpu"] and after["error"] == ""


CHECKS = {
    "vllm#38933": _check_38933,
    "vllm#40917": _check_40917,
    "vllm#43617": _check_43617,
    "vllm#40932": _check_40932,
    "vllm#49397": _check_49397,
}


@pytest.mark.verify
@pytest.mark.release
@pytest.mark.parametrize("release", list(MEASURED))
def test_cpu_evidence_shows_each_mechanism_before_and_not_after(
    release: str,
    proof_env: envs.ProofEnv,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    pristine = release_tree(release)
    tree = patched_copy(release)
    applied = CliRunner().invoke(main, ["apply", "--vllm-src", str(tree)])
    assert applied.exit_code == 0, applied.output
    out = tmp_path / "evidence"
    result = CliRunner().invoke(
        main,
        [
            "verify", "--vllm-src", str(tree), "--against-pristine",
            "--pristine", str(pristine), "--gpu-evidence", "--device", "cpu",
            "--python", str(proof_env.python), "--evidence-out", str(out),
            "--format", "json",
        ],
    )  # fmt: skip
    document = json.loads(result.stdout)
    print(json.dumps(document, indent=1)[:6000])
    assert result.exit_code == 0, result.output[-3000:]
    assert document["mode"] == "gpu-evidence" and document["schema"] == 1
    assert document["device"]["kind"] == "cpu" and document["device"]["torch"]
    entries = {entry["id"]: entry for entry in document["patches"]}
    assert set(entries) == MEASURED[release]
    for patch_id, entry in entries.items():
        assert entry["pristine_state"] == "needed" and entry["state"] == "applied"
        CHECKS[patch_id](entry)
        if patch_id == "vllm#49397":
            assert entry["pristine_baseline"] == BASELINE_49397[release]
        assert entry["ok"], entry["problems"]
    assert json.loads((out / "evidence.json").read_text()) == document
    table = (out / "evidence.md").read_text()
    assert "CPU (" in table
    assert all(f"| {patch_id} |" in table for patch_id in entries)


def _tiny_tree(root: Path) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    return root


def test_cuda_without_a_gpu_is_a_clean_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No nvidia-smi on PATH: skipped with the reason, exit 0, nothing measured."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    tree, pristine = _tiny_tree(tmp_path / "t"), _tiny_tree(tmp_path / "p")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            "verify", "--vllm-src", str(tree), "--against-pristine",
            "--pristine", str(pristine), "--gpu-evidence", "--device", "cuda",
            "--evidence-out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "skipped: no GPU (no NVIDIA GPU: nvidia-smi is not on PATH)" in (
        result.output
    )
    document = json.loads((out / "evidence.json").read_text())
    assert document["device"]["status"] == "skipped"
    assert document["patches"] == [] and document["ok"] is True


def test_gpu_evidence_needs_the_pristine_tree(tmp_path: Path) -> None:
    tree = _tiny_tree(tmp_path / "t")
    result = CliRunner().invoke(
        main, ["verify", "--vllm-src", str(tree), "--gpu-evidence", "--device", "cpu"]
    )
    assert result.exit_code == 2 and "--against-pristine" in result.output


def _side(symptom: bool) -> dict[str, Any]:
    return {
        "status": "measured",
        "measurement": {
            "what": "x",
            "symptom": symptom,
            "mechanism": "m",
            "figures": {
                "step": {
                    "median_ms": 4.0 if symptom else 2.0,
                    "min_ms": 1.0,
                    "max_ms": 5.0,
                    "repetitions": 3,
                    "warmup": 1,
                }
            },
            "notes": [],
        },
    }


def test_a_row_shows_the_fix_only_with_the_symptom_before_and_not_after() -> None:
    patch = patch_by_id("vllm#40917")
    shown = EvidenceRow(
        patch, PatchState.APPLIED, PatchState.NEEDED, (), _side(True), _side(False)
    )
    assert shown.problems == [] and shown.ratios == {"step": 2.0}
    same = EvidenceRow(
        patch, PatchState.APPLIED, PatchState.NEEDED, (), _side(True), _side(True)
    )
    assert same.problems == ["the patched tree shows the symptom"]
    failed = {"status": "error", "error": "NameError: x"}
    broken = EvidenceRow(
        patch, PatchState.NEEDED, PatchState.NEEDED, (), failed, _side(False)
    )
    assert broken.problems == [
        "pristine: NameError: x",
        "the tree's state is needed, not applied",
    ]
    report = EvidenceReport(
        _fake_tree(),
        None,
        "cpu",
        "measured",
        environment={"kind": "cpu", "name": "test CPU", "threads": 2,
                     "torch": "2.13.0+cpu", "cuda": None, "python": "3.11"},
        rows=[shown, same],
    )  # fmt: skip
    assert report.exit_code == 1
    table = evidence_markdown(report)
    assert "CPU (test CPU, 2 threads), torch 2.13.0+cpu, no CUDA" in table
    assert "| vllm#40917 |" in table and "step 2.0x" in table
    assert evidence_json(report)["patches"][1]["ok"] is False


def _fake_tree() -> Any:
    import types

    return types.SimpleNamespace(
        root=Path("/nowhere"), version="0.20.2", version_source="PKG-INFO"
    )

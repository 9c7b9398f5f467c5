"""`deepstack-patch verify`: selection, command lines, parsing, and real proofs.

The unit tests need no torch. The tests marked ``verify`` run in verify's own
managed environment, which the ``proof_env`` fixture builds through the
product's code on first use (about 1.5 minutes and 1.3 GB, in the user cache)
and reuses later; they are skipped only when DEEPSTACK_PATCH_SKIP_VERIFY=1 is
set explicitly.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import Finding, Patch, PatchState
from deepstack_patch.engine.targets import PatchTargets, Targets, load_targets
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.output import documents
from deepstack_patch.output.junit import junit_xml
from deepstack_patch.patches import SERIES
from deepstack_patch.proof import (
    baselines as baselines_module,
)
from deepstack_patch.proof import (
    envs,
    gpu,
    proofs,
    results,
    tree_tests,
    verdicts,
    verify,
)
from deepstack_patch.proof.platform_plugin import ENV_VAR, cpu_platform

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TARGETS = load_targets()


def make_tree(root: Path, files: list[str]) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    for relpath in files:
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text("")
    return root


def fake_targets(cpu: list[str], gpu: list[str] | None = None) -> Targets:
    rows = PatchTargets(expected={}, cpu_tests=cpu, gpu_tests=gpu or [])
    return Targets(releases=[], patches={"a#1": rows, "b#2": PatchTargets({}, cpu)})


# -- selection, command lines, parsing ------------------------------------------


def test_select_tests_keeps_present_files_and_reports_absent(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", ["tests/v1/sample/test_ops.py"])
    listed = ["tests/v1/sample/test_ops.py::test_count", "tests/v1/later/test_new.py"]
    selected, absent = tree_tests.select_tests(
        tree, fake_targets(listed), ["a#1", "b#2"], "cpu"
    )
    assert selected == {"tests/v1/sample/test_ops.py::test_count": ["a#1", "b#2"]}
    assert absent == ["tests/v1/later/test_new.py: not in this release"]
    assert tree_tests.select_tests(tree, fake_targets(listed), ["zz"], "cpu") == (
        {},
        [],
    )


def test_tests_limited_to_releases(tmp_path: Path) -> None:
    toml = tmp_path / "targets.toml"
    toml.write_text(
        '[patches."a#1"]\ncpu_tests = ["tests/a.py", {test = "tests/b.py", '
        'releases = ">=0.20.0", why = "0.19 cannot collect it"}]\n'
    )
    targets = load_targets(toml)
    tree = make_tree(tmp_path / "t", ["tests/a.py", "tests/b.py"])
    old = tree_tests.select_tests(tree, targets, ["a#1"], "cpu", "0.19.1")
    assert old == (
        {"tests/a.py": ["a#1"]},
        ["tests/b.py: only on vLLM >=0.20.0: 0.19 cannot collect it"],
    )
    new = tree_tests.select_tests(tree, targets, ["a#1"], "cpu", "0.20.0")
    assert sorted(new[0]) == ["tests/a.py", "tests/b.py"] and new[1] == []
    toml.write_text('[patches."a#1"]\ncpu_tests = [3]\n')
    with pytest.raises(DeepstackError, match="neither a pytest node id"):
        load_targets(toml)


def test_pytest_command_cpu_and_gpu(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    cpu = tree_tests.pytest_command(Path("/py"), tmp_path, ["tests/a.py"], results)
    assert cpu[:3] == ["/py", "-m", "pytest"]
    assert "--noconftest" in cpu and f"--deepstack-results={results}" in cpu
    assert "deepstack_patch_results" in cpu
    assert cpu[cpu.index("--rootdir") + 1] == str(tmp_path)
    assert cpu[-1] == "tests/a.py" and "no:cacheprovider" in cpu
    gpu = tree_tests.pytest_command(
        Path("/py"), tmp_path, ["tests/a.py"], results, gpu=True
    )
    assert "--noconftest" not in gpu


TREE_TESTS = """\
import pytest

def test_count():
    assert 1 + 1 == 2

class TestGpu:
    def test_big(self):
        pytest.skip("needs CUDA")

def test_bad():
    assert 1 == 2

@pytest.fixture
def exploding():
    raise RuntimeError("fixture exploded")

def test_boom(exploding):
    pass
"""


def test_results_plugin_outcomes_nodeids_and_messages(tmp_path: Path) -> None:
    """pytest's own reports, through the plugin, in a real pytest run."""
    tree = make_tree(tmp_path / "t", ["tests/v1/sample/test_ops.py"])
    (tree / "tests/v1/sample/test_ops.py").write_text(TREE_TESTS)
    (tree / "tests/v1/broken").mkdir()
    (tree / "tests/v1/broken/test_gone.py").write_text("import no_such_module\n")
    selected = {
        "tests/v1/sample/test_ops.py::test_count": ["a#1"],
        "tests/v1/sample/test_ops.py::TestGpu": ["a#1"],
        "tests/v1/sample/test_ops.py::test_bad": ["b#2"],
        "tests/v1/sample/test_ops.py::test_boom": ["b#2"],
    }
    run = tree_tests.run_pytest(
        Path(sys.executable), tree, selected, [], env=dict(os.environ)
    )
    outcomes = sorted((c.nodeid, c.outcome) for c in run.cases)
    assert outcomes == [
        ("tests/v1/sample/test_ops.py::TestGpu::test_big", "skipped"),
        ("tests/v1/sample/test_ops.py::test_bad", "failed"),
        ("tests/v1/sample/test_ops.py::test_boom", "error"),
        ("tests/v1/sample/test_ops.py::test_count", "passed"),
    ], run.json()
    by_id = {c.nodeid: c for c in run.cases}
    assert by_id["tests/v1/sample/test_ops.py::TestGpu::test_big"].message == (
        "needs CUDA"
    )
    assert "assert 1 == 2" in by_id["tests/v1/sample/test_ops.py::test_bad"].message
    assert "fixture exploded" in by_id["tests/v1/sample/test_ops.py::test_boom"].message
    big = by_id["tests/v1/sample/test_ops.py::TestGpu::test_big"]
    assert (big.classname, big.name) == ("tests.v1.sample.test_ops.TestGpu", "test_big")
    assert [c.name for c in run.cases_of("a#1")] == ["test_big", "test_count"]
    assert len(run.cases_of("b#2")) == 2
    assert not run.ok and run.json()["failed"] == 1 and run.json()["skipped"] == 1
    assert run.json()["errors"] == 1 and not run.error
    # A module that does not import stops pytest (exit code 2): an error case
    # that belongs to the patches selecting that file, and the run's error.
    broken = {"tests/v1/broken/test_gone.py": ["b#2"]}
    run = tree_tests.run_pytest(
        Path(sys.executable), tree, broken, [], env=dict(os.environ)
    )
    [case] = run.cases_of("b#2")
    assert case.outcome == "error" and "no_such_module" in case.message
    assert "exit code 2" in run.error
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(DeepstackError, match="bad.json"):
        results.read_results(tmp_path / "bad.json")


def test_detect_gpu_without_driver_and_with_fake_smi(tmp_path: Path) -> None:
    present, reason = gpu.detect_gpu(lambda name: None)
    assert not present and "nvidia-smi is not on PATH" in reason
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    present, reason = gpu.detect_gpu(lambda name: str(smi))
    assert not present and "No devices were found" in reason
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\n")
    assert gpu.detect_gpu(lambda name: str(smi)) == (
        True,
        "GPU 0: NVIDIA H100 (UUID: GPU-1)",
    )


def test_gpu_stage_without_gpu_is_skipped_with_reason(tmp_path: Path) -> None:
    tree = VllmTree.open(make_tree(tmp_path / "t", ["tests/kernels/test_k.py"]))
    targets = fake_targets([], gpu=["tests/kernels/test_k.py::test_cuda"])
    stage = gpu.gpu_stage(
        tree, targets, ["a#1"], print, detect=lambda: (False, "no NVIDIA GPU: x")
    )
    assert stage.status == "skipped" and stage.reason == "no NVIDIA GPU: x"
    assert stage.run is not None
    assert list(stage.run.selected) == ["tests/kernels/test_k.py::test_cuda"]
    assert not stage.ok  # asked for and not run: not a pass
    assert gpu.GpuStage(requested=False).ok
    none_listed = gpu.gpu_stage(tree, fake_targets([]), ["a#1"], print)
    assert none_listed.status == "skipped" and "no gpu_tests" in none_listed.reason


def test_precompiled_files_and_overlay(tmp_path: Path) -> None:
    record = "\n".join(
        [
            "vllm/_C.abi3.so,sha256=x,1",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so,sha256=x,1",
            "vllm/libcuda_helper.so.12,sha256=x,1",
            "vllm/model_executor/models/qwen3_vl.py,sha256=x,1",
            "vllm-0.20.2.dist-info/RECORD,,",
            "torch/lib/libtorch.so,sha256=x,1",
        ]
    )
    files = gpu.precompiled_files(record)
    assert files == [
        "vllm/_C.abi3.so",
        "vllm/libcuda_helper.so.12",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    ]
    tree = make_tree(tmp_path / "t", ["vllm/model_executor/models/qwen3_vl.py"])
    site = tmp_path / "site"
    for relpath in files:
        (site / relpath).parent.mkdir(parents=True, exist_ok=True)
        (site / relpath).write_bytes(b"\x7fELF")
    overlay = gpu.overlay_tree(tree, site, files, tmp_path / "overlay")
    assert (overlay / "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so").read_bytes() == (
        b"\x7fELF"
    )
    assert (overlay / "vllm/model_executor/models/qwen3_vl.py").is_file()
    assert not (tree / "vllm/_C.abi3.so").exists()  # the tree is never written
    gpu.check_wheel_version("0.20.2", "0.20.2")
    with pytest.raises(DeepstackError, match="wheel is 0.20.1, the tree is 0.20.2"):
        gpu.check_wheel_version("0.20.1", "0.20.2")


def test_platform_plugin_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert cpu_platform() is None
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert (
        cpu_platform() == "deepstack_patch.proof.platform_plugin.SourceTreeCpuPlatform"
    )
    from importlib.metadata import entry_points

    registered = {e.name: e.value for e in entry_points(group="vllm.platform_plugins")}
    assert registered.get("deepstack_patch_cpu") == (
        "deepstack_patch.proof.platform_plugin:cpu_platform"
    )


@pytest.mark.verify
def test_generated_plugin_dist_is_found_by_entry_points(tmp_path: Path) -> None:
    """pip builds the plugin project (its isolated build fetches setuptools from
    the package index, hence the verify marker) into a venv like verify's."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = envs.venv_python(venv)
    envs.install_platform_plugin(python)
    probe = (
        "from importlib.metadata import entry_points;"
        "[e] = entry_points(group='vllm.platform_plugins'); print(e.load()())"
    )
    shim = f"{envs.PLUGIN_DIST}.SourceTreeCpuPlatform"
    for value, expected in (("cpu", shim), ("", "None")):
        env = dict(os.environ, **{ENV_VAR: value})
        out = subprocess.run(
            [python, "-c", probe], env=env, capture_output=True, text=True, cwd=venv
        )
        assert out.stdout.strip() == expected, out.stderr


def test_requirements_equal_the_verify_extra_and_key_is_stable() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["verify"] == list(envs.CPU_REQUIREMENTS)
    assert envs.TORCH_PIN in envs.CPU_REQUIREMENTS
    key = envs.env_key(envs.CPU_REQUIREMENTS, "3.11")
    assert key == envs.env_key(list(reversed(envs.CPU_REQUIREMENTS)), "3.11")
    assert key != envs.env_key([*envs.CPU_REQUIREMENTS, "x"], "3.11")
    assert key != envs.env_key(envs.CPU_REQUIREMENTS, "3.12")
    command = envs.pip_install_command(Path("/v/bin/python"), ["torch==2.13.0"])
    assert "--isolated" not in command and command[-1] == "torch==2.13.0"


def test_python_without_torch_says_what_to_install(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    with pytest.raises(DeepstackError) as raised:
        envs.check_python(envs.venv_python(venv))
    assert "cannot import torch, pytest" in raised.value.message
    assert "pip install 'deepstack-patch[verify]'" in raised.value.hint
    tree = make_tree(tmp_path / "t", [])
    code, output = _cli("--vllm-src", str(tree), "--python", str(tmp_path / "nope"))
    assert code == 2 and "no such interpreter" in " ".join(output.split())
    assert "deepstack-patch[verify]" in output.replace("\n", " ")


def test_runner_crash_is_an_error_with_the_log(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", [])
    results = proofs.run_proofs(envs.ProofEnv(Path(sys.executable)), tree, ["nope#0"])
    assert results["nope#0"].status == "error"
    assert "KeyError" in results["nope#0"].message


def test_report_json_junit_and_exit_semantics(tmp_path: Path) -> None:
    tree = VllmTree.open(make_tree(tmp_path / "t", []))
    patch = SERIES[0]
    good = verdicts.PatchVerdict(patch, PatchState.APPLIED, "")
    good.proof = proofs.ProofResult(patch.id, "passed", seconds=1.0)
    good.pristine_state = PatchState.NEEDED
    good.pristine_proof = proofs.ProofResult(patch.id, "failed", "buggy")
    assert good.fail_to_pass == "proven" and not good.problems
    bad = verdicts.PatchVerdict(SERIES[1], PatchState.NEEDED, "")
    bad.proof = proofs.ProofResult(SERIES[1].id, "failed", "bug is here")
    assert bad.problems[0].startswith("not applied")
    report = verify.VerifyReport(
        tree=tree,
        env=envs.ProofEnv(Path("/py")),
        verdicts=[good, bad],
        cpu_tests=tree_tests.TestRun(command=[]),
        gpu=gpu.GpuStage(True, "skipped", "no NVIDIA GPU: x"),
    )
    assert not report.ok
    document = report_json = documents.verify_json(report)
    assert document["schema"] == 1 and document["command"] == "verify"
    assert document["patches"][0]["fail_to_pass"] == "proven"
    assert document["patches"][1]["ok"] is False
    assert report_json["gpu"]["status"] == "skipped"
    suite = ET.fromstring(junit_xml(report))
    assert suite.get("failures") == "1" and suite.get("skipped") == "1"
    names = [(c.get("classname"), c.get("name")) for c in suite.iter("testcase")]
    assert ("fail-to-pass.0.20.2", patch.id) in names


def test_pristine_option_needs_against_pristine(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", [])
    code, output = _cli("--vllm-src", str(tree), "--pristine", str(tree))
    assert code == 2 and "--pristine goes with --against-pristine" in output


def _cli(*args: str, stdout: bool = False) -> tuple[int, str]:
    """verify's exit code and output (with ``stdout``: stdout alone, for JSON)."""
    result = CliRunner().invoke(main, ["verify", *args])
    return result.exit_code, result.stdout if stdout else result.output


# -- real proofs and tree tests in the managed environment ------------------------


def _needed_by_release() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for patch in SERIES:
        rows = TARGETS.patches.get(patch.id)
        for release, state in (rows.expected if rows else {}).items():
            if state is PatchState.NEEDED:
                found.setdefault(release, []).append(patch.id)
    return dict(sorted(found.items()))


NEEDED = _needed_by_release()


def _apply(tree: Path) -> None:
    result = CliRunner().invoke(main, ["apply", "--vllm-src", str(tree)])
    assert result.exit_code == 0, result.output


@pytest.mark.verify
@pytest.mark.release
@pytest.mark.parametrize("release", list(NEEDED))
def test_fail_to_pass(
    release: str,
    proof_env: envs.ProofEnv,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
) -> None:
    """Every needed patch's proof fails on the pristine release, passes patched;
    the tree tests listed for the applicable patches pass on the patched tree."""
    pristine = release_tree(release)
    tree = patched_copy(release)
    _apply(tree)
    # Releases where only vllm#49397 is needed (0.23.0 on) are verified for
    # it alone: the other patches' proofs and the tree tests were written for
    # the releases that need them and do not all fit those later shapes.
    selected = (
        set(NEEDED[release])
        if NEEDED[release] == ["vllm#49397"]
        else {p.id for p in SERIES}
    )
    report = verify.verify_tree(
        VllmTree.open(tree),
        SERIES,
        selected,
        proof_env,
        TARGETS,
        pristine=VllmTree.open(pristine),
        # The release's tests of what the fixes change, on every release,
        # would take minutes each: they run on 0.20.2 below.
        test_budget=0,
    )
    lines = []
    for verdict in report.verdicts:
        if verdict.patch.id not in NEEDED[release]:
            continue
        before, after = verdict.pristine_proof, verdict.proof
        lines.append(
            f"{verdict.patch.id}: before {before.status if before else None}, "
            f"after {after.status if after else None} -> {verdict.fail_to_pass}"
            + (f"\n  before: {before.message}" if before else "")
            + (f"\n  after: {after.message}" if after and after.message else "")
        )
    print("\n".join(lines))
    for verdict in report.verdicts:
        if verdict.patch.id in NEEDED[release]:
            assert verdict.state is PatchState.APPLIED
            assert verdict.fail_to_pass == "proven", "\n".join(lines)
    assert report.cpu_tests.ok, report.cpu_tests.json()
    assert report.ok, json.dumps(documents.verify_json(report), indent=1)[:4000]


@pytest.mark.verify
@pytest.mark.release
def test_tree_tests_run_on_cpu_through_the_plugin(
    proof_env: envs.ProofEnv, release_tree: Callable[[str], Path]
) -> None:
    """The pytest machinery on a real in-tree test: passes with the plugin, and
    fails without it (UnspecifiedPlatform), so the plugin is what makes it run."""
    tree = release_tree("0.20.2")
    nodeid = "tests/v1/sample/test_batched_count_greater_than.py"
    with_plugin = tree_tests.run_pytest(
        proof_env.python, tree, {nodeid: ["x"]}, [], env=envs.subprocess_env(tree)
    )
    assert with_plugin.ok and with_plugin.count("passed") > 0, with_plugin.json()
    without = dict(envs.subprocess_env(tree))
    without.pop(ENV_VAR)
    no_plugin = tree_tests.run_pytest(
        proof_env.python, tree, {nodeid: ["x"]}, [], env=without
    )
    assert not no_plugin.ok
    assert any("Device string must not be empty" in c.message for c in no_plugin.cases)


@pytest.mark.verify
@pytest.mark.release
def test_the_built_in_fixes_keep_their_proofs_beside_the_release_tests(
    proof_env: envs.ProofEnv,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
) -> None:
    """Issue 42 item 4: on 0.20.2 the built-in fixes' own proofs say what
    they said, and the release's tests of the functions they change run on
    both trees beside them: some pass before and after, none regresses."""
    pristine = release_tree("0.20.2")
    tree = patched_copy("0.20.2")
    _apply(tree)
    report = verify.verify_tree(
        VllmTree.open(tree),
        SERIES,
        {p.id for p in SERIES},
        proof_env,
        TARGETS,
        pristine=VllmTree.open(pristine),
    )
    needed = [v for v in report.verdicts if v.patch.id in NEEDED["0.20.2"]]
    assert needed
    for verdict in needed:
        assert verdict.fail_to_pass == "proven", verdict.patch.id
        assert verdict.verdict.word == "proven", verdict.verdict.text
        assert verdict.release_tests is not None, verdict.patch.id
        assert verdict.release_tests.pass_to_fail == [], verdict.release_tests.problem
    assert any(v.unit_tests and v.unit_tests.pass_to_pass for v in needed), [
        (v.patch.id, v.release_tests.json() if v.release_tests else None)
        for v in needed
    ]
    assert report.ok, json.dumps(documents.verify_json(report), indent=1)[:4000]


@pytest.mark.verify
@pytest.mark.release
def test_verify_command_end_to_end(
    proof_env: envs.ProofEnv,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    release = next(iter(NEEDED), "0.20.2")
    tree = patched_copy(release)
    args = ["--vllm-src", str(tree), "--against-pristine"]
    args += ["--pristine", str(release_tree(release)), "--format", "json"]
    junit = tmp_path / "verify.xml"
    code, output = _cli(*args, "--junit-xml", str(junit), stdout=True)
    assert code == 1  # not applied yet: the needed patches fail verify
    document = json.loads(output)
    assert {p["state"] for p in document["patches"]} >= {"needed"}
    _apply(tree)
    code, output = _cli(*args, "--junit-xml", str(junit), stdout=True)
    document = json.loads(output)
    assert code == 0, output
    assert document["ok"] and document["environment"]["managed"]
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0" and suite.get("errors") == "0"


def _without_timing(document: object) -> object:
    """A verify document without its seconds and scratch paths."""
    match document:
        case dict():
            return {
                key: _without_timing(value)
                for key, value in document.items()
                if key != "seconds"
            }
        case list():
            return [_without_timing(item) for item in document]
        case str() if document.startswith("--deepstack-results="):
            return "--deepstack-results=..."
    return document


@pytest.mark.verify
@pytest.mark.release
def test_the_fork_servers_preload_changes_no_result(
    proof_env: envs.ProofEnv,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second run preloads what the first run's jobs imported
    (forkserver.py); its report is the first's, seconds apart."""
    release = "0.20.2" if "0.20.2" in NEEDED else next(iter(NEEDED))
    pristine = VllmTree.open(release_tree(release))
    tree = patched_copy(release)
    _apply(tree)
    learned = tmp_path / "learned.json"
    monkeypatch.setattr(verify, "learned_preload", lambda env, version: learned)
    reports = []
    for _ in range(2):
        report = verify.verify_tree(
            VllmTree.open(tree),
            SERIES,
            {p.id for p in SERIES},
            proof_env,
            TARGETS,
            pristine=pristine,
            # Not the release's tests of the built-in fixes (minutes twice
            # over): their stage runs through the same fork server in
            # test_the_built_in_fixes_keep_their_proofs_beside_the_release_tests.
            test_budget=0,
        )
        reports.append(_without_timing(documents.verify_json(report)))
        preloaded = json.loads(learned.read_text())
        assert "transformers" in preloaded["modules"]
        assert "vllm" in preloaded["foreign"] and "vllm" not in preloaded["modules"]
    first, second = reports
    assert isinstance(first, dict) and first["patches"] and first["tree_tests"]["cases"]
    assert second == first


def test_what_the_fork_server_learned_is_kept_per_interpreter_and_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path))
    one = envs.ProofEnv(Path("/envs/one/bin/python"))
    other = envs.ProofEnv(Path("/envs/other/bin/python"))
    path = verify.learned_preload(one, "0.20.2")
    assert path is not None and path.parent == tmp_path / "preload"
    assert path == verify.learned_preload(one, "0.20.2")
    assert path != verify.learned_preload(one, "0.20.1")
    assert path != verify.learned_preload(other, "0.20.2")


class _ReturnsOne(Patch):
    """A toy fix: ``def NAME(): return 0`` becomes ``return 1``."""

    title = symptom = "toy"
    upstream_url = "https://example.invalid"
    fixed_in = "9.9.9"
    paths = ("vllm/toy.py",)
    markers = (b"def ",)
    parts = {"toy": "toy function"}

    def __init__(
        self, patch_id: str, requires: tuple[str, ...] = (), companions=()
    ) -> None:
        self.id = patch_id
        self.requires = requires
        self.companions = companions
        self.function = patch_id.replace("#", "_")

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        for node in tree.body:
            match node:
                case ast.FunctionDef(
                    name=self.function, body=[ast.Return(ast.Constant(value))]
                ):
                    state = PatchState.APPLIED if value == 1 else PatchState.NEEDED
                    lines = (node.lineno, node.end_lineno or node.lineno)
                    return [
                        Finding(state, self.function, node.lineno, lines, part="toy")
                    ]
        return []

    def rewrite(self, module, needed):  # type: ignore[no-untyped-def]
        import libcst

        old = f"def {self.function}():\n    return 0\n"
        new = f"def {self.function}():\n    return 1\n"
        return libcst.parse_module(module.code.replace(old, new))


def test_companion_pristine_proof_runs_with_its_fix_applied_alone(
    tmp_path: Path,
) -> None:
    """The baseline of a companion's pristine proof is the pristine tree with
    the fix naming it (and the fix's needed requirement) applied, not the
    companion; a patch that is no companion keeps the pristine tree."""
    root = make_tree(tmp_path / "pristine", [])
    source = "".join(
        f"def {name}():\n    return 0\n\n\n"
        for name in ("base", "fix", "repair", "other")
    )
    (root / "vllm" / "toy.py").write_text(source)
    base = _ReturnsOne("base")
    fix = _ReturnsOne("fix", requires=("base",), companions=("repair",))
    repair = _ReturnsOne("repair")
    other = _ReturnsOne("other")
    series = [base, fix, repair, other]
    pristine = VllmTree.open(root)
    found = verify._verdicts(pristine, series, {p.id for p in series}, pristine)
    assert [v.pristine_state for v in found] == [PatchState.NEEDED] * 4

    baselines = baselines_module.companion_baselines(
        pristine, series, found, tmp_path / "scratch", ["base", "fix", "repair"]
    )

    assert [(b.applied, b.proves) for b in baselines] == [(("base", "fix"), ["repair"])]
    patched = (baselines[0].tree.root / "vllm" / "toy.py").read_text()
    assert "def fix():\n    return 1" in patched
    assert "def base():\n    return 1" in patched
    assert "def repair():\n    return 0" in patched
    assert "def other():\n    return 0" in patched
    assert (root / "vllm" / "toy.py").read_text() == source, "pristine changed"


def test_no_baseline_where_the_fix_is_not_needed_on_the_pristine_tree(
    tmp_path: Path,
) -> None:
    """Where upstream shipped the fix, the companion's bug shows natively."""
    root = make_tree(tmp_path / "pristine", [])
    (root / "vllm" / "toy.py").write_text(
        "def fix():\n    return 1\n\n\ndef repair():\n    return 0\n"
    )
    series = [_ReturnsOne("fix", companions=("repair",)), _ReturnsOne("repair")]
    pristine = VllmTree.open(root)
    found = verify._verdicts(pristine, series, {"fix", "repair"}, pristine)
    assert [v.pristine_state for v in found] == [
        PatchState.APPLIED,
        PatchState.NEEDED,
    ]
    assert (
        baselines_module.companion_baselines(
            pristine, series, found, tmp_path / "scratch", ["fix", "repair"]
        )
        == []
    )

"""``verify --installed``: proofs and the release's tests in the install's Python.

The unmarked tests use small fake installs and this interpreter (no
download). The ``release``+``verify`` test installs the official 0.20.2
wheel (``--no-deps``) into a venv layered on verify's managed environment:
torch, pytest and vLLM's dependencies come from it, vllm from the wheel.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from deepstack_patch.cli import main
from deepstack_patch.engine.installed import InstalledVllm
from deepstack_patch.liveness import installed_check
from deepstack_patch.patches import SERIES
from deepstack_patch.proof import installed_tests
from deepstack_patch.proof.installed_tests import (
    installed_gpu_stage,
    missing_hint,
    release_tests,
    run_release_tests,
)

from tests.support import TARGETS
from tests.support.installed import (
    WHEEL_VERSION,
    dist_info,
    layered_venv,
    site_packages,
    snapshot,
)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def fake_site(folder: Path, init: str = "", requires: str = "") -> Path:
    """A site-packages-like folder: vllm/ and its dist-info."""
    (folder / "vllm").mkdir(parents=True)
    (folder / "vllm/__init__.py").write_text(init)
    info = folder / "vllm-0.1.0.dist-info"
    info.mkdir()
    metadata = "Metadata-Version: 2.1\nName: vllm\nVersion: 0.1.0\n" + requires
    (info / "METADATA").write_text(metadata)
    (info / "RECORD").write_text("")
    return folder


def installed_at(site: Path) -> InstalledVllm:
    return InstalledVllm(
        python=Path(sys.executable),
        site_packages=site,
        dist_info=site / "vllm-0.1.0.dist-info",
        version="0.1.0",
        editable=False,
        source_root=None,
    )


# --- the check plugin -------------------------------------------------------


def run_with_check(
    cwd: Path, expected: Path, pythonpath: Path
) -> subprocess.CompletedProcess:
    plugin_dir = cwd.parent / "plugin"
    plugin_dir.mkdir(exist_ok=True)
    shutil.copyfile(
        installed_check.__file__, plugin_dir / f"{installed_check.MODULE}.py"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(pythonpath), str(plugin_dir)]),
        PYTEST_PLUGINS=installed_check.MODULE,
        **{installed_check.ENV_VAR: str(expected / "vllm/__init__.py")},
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "."],
        cwd=cwd, env=env, capture_output=True, text=True,
    )  # fmt: skip


def test_check_plugin_passes_with_the_installed_vllm(tmp_path: Path) -> None:
    site = fake_site(tmp_path / "site", "WHERE = 'installed'\n")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        "import vllm\ndef test_a():\n    assert vllm.WHERE == 'installed'\n"
    )
    done = run_with_check(tests, site, site)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_check_plugin_stops_a_run_with_a_vllm_beside_the_tests(tmp_path: Path) -> None:
    site = fake_site(tmp_path / "site")
    tests = tmp_path / "sdist"
    (tests / "vllm").mkdir(parents=True)
    (tests / "vllm/__init__.py").write_text("")
    (tests / "test_a.py").write_text("def test_a():\n    pass\n")
    done = run_with_check(tests, site, site)
    assert done.returncode == 4, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert f"the tests import vllm from {tests / 'vllm/__init__.py'}" in output
    assert "not the installed" in output


def test_check_plugin_fails_a_run_that_imported_another_vllm(tmp_path: Path) -> None:
    site = fake_site(tmp_path / "site")
    other = fake_site(tmp_path / "other")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        f"import sys\nsys.path.insert(0, {str(other)!r})\nimport vllm\n"
        "def test_a():\n    pass\n"
    )
    done = run_with_check(tests, site, site)
    assert done.returncode == installed_check.WRONG_VLLM_EXIT, done.stdout
    assert f"vllm from {other / 'vllm/__init__.py'}" in done.stderr


# --- running the release's tests against an install ------------------------------


def test_release_tests_run_against_the_install_not_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = fake_site(tmp_path / "site", "FIXED = True\n")
    # The interpreter imports the install from its path (here: PYTHONPATH).
    monkeypatch.setenv("PYTHONPATH", str(site))
    root = tmp_path / "release-tests"
    (root / "tests").mkdir(parents=True)
    (root / "tests/test_fix.py").write_text(
        "import vllm\ndef test_fixed():\n    assert vllm.FIXED\n"
    )
    selected = {"tests/test_fix.py": ["vllm#1"]}
    done = run_release_tests(installed_at(site), root, selected, [])
    assert done.ok, done.error
    assert [(c.nodeid, c.outcome) for c in done.cases] == [
        ("tests/test_fix.py::test_fixed", "passed")
    ]
    assert done.command[done.command.index("--rootdir") + 1] == str(root)

    # A vllm/ beside the tests would be tested instead: the run fails loudly.
    (root / "vllm").mkdir()
    (root / "vllm/__init__.py").write_text("FIXED = True\n")
    shadowed = run_release_tests(installed_at(site), root, selected, [])
    assert not shadowed.ok
    assert "not the installed" in shadowed.error


def make_sdist(path: Path, version: str) -> Path:
    files = {
        "vllm/__init__.py": "",
        "tests/__init__.py": "",
        "tests/v1/test_a.py": "def test_a():\n    pass\n",
        "pyproject.toml": "[tool.pytest.ini_options]\n",
        "setup.py": "",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_release_tests_are_extracted_once_without_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepstack_patch.fetch import releases

    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    archive = make_sdist(tmp_path / "vllm-9.9.9.tar.gz", "9.9.9")
    asked: list[str] = []

    def fake_archive(version: str, progress=None, note=None) -> Path:
        asked.append(version)
        return archive

    monkeypatch.setattr(releases, "release_archive", fake_archive)
    root = release_tests("9.9.9")
    assert root == tmp_path / "cache/release-tests/vllm-9.9.9"
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    assert found == [
        "pyproject.toml", "tests", "tests/__init__.py", "tests/v1", "tests/v1/test_a.py"
    ]  # fmt: skip
    assert release_tests("9.9.9") == root
    assert asked == ["9.9.9"]  # the second call reused the extraction

    (root / "vllm").mkdir()
    with pytest.raises(Exception, match="holds a vllm/ folder"):
        release_tests("9.9.9")


def test_gpu_stage_without_gpu_says_so(tmp_path: Path) -> None:
    root = tmp_path / "release-tests"
    test_file = root / "tests/v1/cudagraph/test_encoder_cudagraph.py"
    test_file.parent.mkdir(parents=True)
    test_file.write_text("")
    installed = installed_at(fake_site(tmp_path / "site"))
    installed = InstalledVllm(**{**installed.__dict__, "version": "0.20.2"})
    stage = installed_gpu_stage(
        installed, root, TARGETS, ["vllm#38040"], lambda line: None,
        detect=lambda: (False, "no NVIDIA GPU: nvidia-smi is not on PATH"),
    )  # fmt: skip
    assert (stage.status, stage.ok) == ("skipped", False)
    assert stage.reason == "no NVIDIA GPU: nvidia-smi is not on PATH"
    assert stage.run is not None and len(stage.run.selected) == 2


# --- the command line ---------------------------------------------------------------


def bare_venv(tmp_path: Path, requires: str = "") -> Path:
    """A venv without torch and pytest, holding a fake vllm 0.1.0."""
    root = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True
    )
    python = root / "bin/python"
    fake_site(site_packages(python), requires=requires)
    return python


def test_missing_pytest_and_torch_name_what_to_install(tmp_path: Path) -> None:
    python = bare_venv(tmp_path, "Requires-Dist: torch==2.11.0\n")
    before = sorted(p.name for p in site_packages(python).iterdir())
    result = run("verify", "--installed", "--python", str(python))
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "cannot import torch, pytest" in output
    assert f"{python} -m pip install pytest 'torch==2.11.0'" in output
    # Nothing was installed into the user's interpreter.
    assert sorted(p.name for p in site_packages(python).iterdir()) == before


def test_missing_hint_without_a_torch_requirement() -> None:
    python = Path("/opt/venv/bin/python")
    assert missing_hint(python, ["pytest"], [], "0.20.2") == (
        "/opt/venv/bin/python -m pip install pytest"
    )
    assert missing_hint(python, ["torch"], [], "0.20.2") == (
        "/opt/venv/bin/python -m pip install torch"
    )


def test_against_pristine_is_refused_for_an_install(tmp_path: Path) -> None:
    python = bare_venv(tmp_path)
    result = run("verify", "--installed", "--python", str(python), "--against-pristine")
    assert result.exit_code == 2, result.output
    assert "--against-pristine compares two source trees" in result.output


def test_wants_tests_only_for_patches_that_list_them() -> None:
    assert installed_tests.wants_tests(TARGETS, ["vllm#38040"], "gpu")
    assert not installed_tests.wants_tests(TARGETS, ["vllm#40917"], "cpu")
    assert not installed_tests.wants_tests(TARGETS, ["no-such-patch"], "cpu")


# --- the official wheel, layered on the managed environment -------------------------


def needed_on(version: str) -> list[str]:
    return sorted(
        patch_id
        for patch_id, rows in TARGETS.patches.items()
        if rows.expected.get(version) == "needed"
    )


def verify_json(python: Path, *extra: str) -> tuple[int, dict]:
    result = run(
        "verify", "--installed", "--python", str(python), "--format", "json", *extra
    )
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.release
@pytest.mark.verify
def test_official_wheel_proofs_fail_before_apply_and_verify_passes_after(
    proof_env, official_venv: Path, tmp_path: Path
) -> None:
    """verify --installed on the official wheel in a venv layered on the
    proof environment: the proofs fail before apply, verify passes after it
    with the release's own tests, and --gpu says what it did: the one test of
    verify against a real install."""
    python = layered_venv(proof_env.python, tmp_path / "venv", official_venv)
    site = site_packages(python)
    needed = needed_on(WHEEL_VERSION)
    assert needed, f"targets.toml lists no patch needed on {WHEEL_VERSION}"

    pristine = snapshot(site)
    code, before = verify_json(python)
    assert code == 1
    assert before["environment"]["python"] == str(python)
    assert before["environment"]["managed"] is False
    proofs = {p["id"]: p["proof"]["status"] for p in before["patches"]}
    # A companion's bug is latent until the fix it accompanies is applied
    # (0.20.2 returns None while nothing is stored): its proof passes here.
    companions = {c for p in SERIES for c in p.companions}
    assert {proofs[i] for i in needed if i not in companions} == {"failed"}, proofs
    assert {proofs[i] for i in needed if i in companions} <= {"passed"}, proofs
    fix = f"run `deepstack-patch apply --installed --python {python}` first"
    problems = {p["id"]: p["problems"] for p in before["patches"]}
    assert all(any(fix in why for why in problems[i]) for i in needed), problems
    # verify writes nothing into the install (no bytecode either).
    assert snapshot(site) == pristine

    applied = run("apply", "--installed", "--python", str(python))
    assert applied.exit_code == 0, applied.output

    code, after = verify_json(python)
    assert code == 0, json.dumps(after, indent=1)[:3000]
    assert all(p["proof"]["status"] == "passed" for p in after["patches"])
    tests = after["tree_tests"]
    assert tests["passed"] > 0 and tests["failed"] == tests["errors"] == 0, tests
    rootdir = tests["command"][tests["command"].index("--rootdir") + 1]
    assert rootdir.endswith(f"release-tests/vllm-{WHEEL_VERSION}")
    assert not (Path(rootdir) / "vllm").exists()
    assert (dist_info(site) / "deepstack_patch.json").is_file()

    # --gpu: the release's GPU tests, or (on a machine without one) a clear skip.
    from deepstack_patch.proof.gpu import detect_gpu

    gpu_here, why = detect_gpu()
    code, with_gpu = verify_json(python, "--gpu", "--only", "vllm#38040")
    if gpu_here:
        assert with_gpu["gpu"]["status"] == "ran"
    else:
        assert code == 1
        assert with_gpu["gpu"]["status"] == "skipped"
        assert with_gpu["gpu"]["reason"] == why and "no NVIDIA GPU" in why


def test_environment_for_tests_keeps_the_user_path_and_adds_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepstack_patch.proof.platform_plugin import ENV_VAR as PLATFORM

    monkeypatch.setenv("PYTHONPATH", "/user/path")
    site = fake_site(tmp_path / "site")
    plugin_dir = tmp_path / "plugin"
    env = installed_tests.environment_for_tests(
        installed_at(site), plugin_dir, gpu=False
    )
    assert env["PYTHONPATH"] == os.pathsep.join(["/user/path", str(plugin_dir)])
    assert env["PYTEST_PLUGINS"] == installed_check.MODULE
    assert env[installed_check.ENV_VAR] == str(site / "vllm/__init__.py")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env[PLATFORM] == "cpu"
    # On a GPU, vLLM detects its platform itself.
    gpu_env = installed_tests.environment_for_tests(
        installed_at(site), plugin_dir, gpu=True
    )
    assert PLATFORM not in gpu_env

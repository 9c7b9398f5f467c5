"""`deepstack-patch doctor`: is the fix live in the vLLM a Python imports?

Fast tests use a small vllm package of our own (its granite4_vision.py is the
patch's own example) on PYTHONPATH of this interpreter; the `release` test
installs the official 0.20.2 wheel into a throwaway venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import subprocess
import sys
from importlib.util import cache_from_source
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

MODEL = "vllm/model_executor/models/granite4_vision.py"
GRANITE = "vllm#40917"


def make_site(folder: Path, model: str, *, dist: bool = True) -> Path:
    """A folder holding a vllm package (and, with ``dist``, its dist-info)."""
    for package in ("vllm", "vllm/model_executor", "vllm/model_executor/models"):
        (folder / package).mkdir(parents=True, exist_ok=True)
        (folder / package / "__init__.py").write_text("")
    (folder / "vllm/_version.py").write_text("__version__ = version = '0.1.0'\n")
    (folder / MODEL).write_text(model)
    if dist:
        info = folder / "vllm-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: vllm\nVersion: 0.1.0\n"
        )
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return folder


def doctor(
    *pythonpath: Path, args: tuple[str, ...] = (), error_document: bool = False
) -> tuple[int, dict]:
    """Exit code and JSON document; on exit 2 the words printed, unless
    ``error_document`` (doctor still prints its document, with ``error``)."""
    env = {
        "PYTHONPATH": ":".join(map(str, pythonpath)),
        # doctor warms the live check's cache: keep it out of the user's.
        "DEEPSTACK_PATCH_CACHE": str(pythonpath[0].parent / "cache"),
    }
    result = CliRunner(env=env).invoke(main, ["doctor", "--format", "json", *args])
    if result.exit_code == 2 and not error_document:
        return 2, {"output": " ".join(result.output.split())}
    return result.exit_code, json.loads(result.stdout)


def granite_verdict(document: dict) -> dict:
    return next(p for p in document["patches"] if p["id"] == GRANITE)


def write_record(site: Path, *, applied=(GRANITE,), skipped=()) -> None:
    after = hashlib.sha256(granite.AFTER.encode()).hexdigest()
    record = {
        "schema": 1, "tool_version": "0.1.0", "date": "2026-11-23T06:00:00Z",
        "distribution": {"name": "vllm", "version": "0.1.0"},
        "applied": list(applied), "skipped": list(skipped),
        "files": [{"path": MODEL, "sha256_before": "", "sha256_after": after,
                   "size_before": 0, "original": "x"}],
        "bytecode": [],
    }  # fmt: skip
    (site / "vllm-0.1.0.dist-info/deepstack_patch.json").write_text(json.dumps(record))


def test_needed_fix_is_not_live(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.BEFORE)
    code, document = doctor(site)
    assert code == 1
    verdict = granite_verdict(document)
    assert (verdict["state"], verdict["live"]) == ("needed", False)
    assert MODEL in verdict["reasons"][0]
    assert document["vllm"]["version"] == "0.1.0"
    assert "installed from a wheel by pip" in document["vllm"]["installed_as"]
    assert "apply --installed" in document["fix_command"]


def test_applied_fix_is_live(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    code, document = doctor(site)
    assert code == 0, document
    assert granite_verdict(document)["live"] is True
    assert document["live"] is True
    assert document["modules"][MODEL]["loads"] == str(site / MODEL)


def test_a_checkout_on_pythonpath_shadows_the_distribution(tmp_path: Path) -> None:
    checkout = make_site(tmp_path / "checkout", granite.BEFORE, dist=False)
    site = make_site(tmp_path / "site", granite.AFTER)
    code, document = doctor(checkout, site)
    assert code == 1
    assert document["vllm"]["path"] == str(checkout / "vllm")
    assert "shadows the installed vllm 0.1.0" in document["vllm"]["installed_as"]
    assert "PYTHONPATH" in document["vllm"]["installed_as"]
    assert document["vllm"]["shadowing"] == [f"{site}/vllm (PYTHONPATH)"]
    assert any("shadows" in r for r in granite_verdict(document)["reasons"])
    assert "apply --vllm-src" in document["fix_command"]


def test_a_checkout_in_the_working_folder_is_named_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = make_site(tmp_path / "checkout", granite.BEFORE, dist=False)
    site = make_site(tmp_path / "site", granite.AFTER)
    monkeypatch.chdir(checkout)
    code, document = doctor(site)
    assert code == 0, document
    assert document["vllm"]["path"] == str(site / "vllm")
    assert document["vllm"]["shadowing"] == [
        f"{checkout}/vllm (working folder (python -m / python -c only))"
    ]


def plant_bytecode(site: Path, old: str, mode: py_compile.PycInvalidationMode) -> Path:
    """Bytecode of ``old`` where the import system looks for the model's."""
    source = site / MODEL
    current = source.read_text()
    source.write_text(old)
    pyc = Path(cache_from_source(str(source)))
    py_compile.compile(str(source), cfile=str(pyc), invalidation_mode=mode)
    source.write_text(current)
    return pyc


def test_stale_unchecked_hash_bytecode_is_not_live(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    pyc = plant_bytecode(
        site, granite.BEFORE, py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    code, document = doctor(site)
    assert code == 1
    assert document["modules"][MODEL]["bytecode"] == "stale"
    reasons = granite_verdict(document)["reasons"]
    assert any(r.startswith(f"stale bytecode: {pyc}") for r in reasons), reasons


@pytest.mark.parametrize(
    "mode",
    [
        py_compile.PycInvalidationMode.CHECKED_HASH,
        py_compile.PycInvalidationMode.TIMESTAMP,
    ],
)
def test_outdated_bytecode_that_the_interpreter_checks_is_live(
    tmp_path: Path, mode: py_compile.PycInvalidationMode
) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    plant_bytecode(site, granite.BEFORE + "\n# other size\n", mode)
    code, document = doctor(site)
    assert code == 0, document
    assert document["modules"][MODEL]["bytecode"] == "recompiled"


def test_fresh_unchecked_hash_bytecode_is_live(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    plant_bytecode(site, granite.AFTER, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    code, document = doctor(site)
    assert code == 0, document
    assert document["modules"][MODEL]["bytecode"] == "fresh"


def test_a_file_changed_since_apply_is_named(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.BEFORE)
    write_record(site)
    code, document = doctor(site)
    assert code == 1
    assert document["record"]["changed_since"] == [MODEL]
    assert any("changed since" in r for r in granite_verdict(document)["reasons"])


def test_a_patch_skipped_on_purpose_does_not_fail(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.BEFORE)
    write_record(site, applied=(), skipped=(GRANITE,))
    code, document = doctor(site)
    assert code == 0, document
    verdict = granite_verdict(document)
    assert (verdict["live"], verdict["counts"]) == (False, False)
    assert "skipped on purpose" in verdict["reasons"][0]


def test_import_check_compares_the_live_functions(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    # The example module names nn, IntermediateTensors, ...: give it stand-ins
    # so that importing it works without torch.
    model = site / MODEL
    model.write_text("nn = type('nn', (), {'Module': object})\n" + granite.AFTER)
    code, document = doctor(site, args=("--import",))
    assert code == 0, document
    imported = document["imported"]
    assert imported and all(entry["live"] for entry in imported), imported


#: A stand-in for torch: a dependency vLLM imports that this Python lacks.
ABSENT_DEPENDENCY = "deepstack_test_absent_dependency"


def test_an_interpreter_that_cannot_import_vllm_is_told_apart_from_not_live(
    tmp_path: Path,
) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    model = site / MODEL
    model.write_text(f"import {ABSENT_DEPENDENCY}\n" + granite.AFTER)
    code, document = doctor(site, args=("--import",), error_document=True)
    assert code == 2, document
    assert document["fix_command"] is None, document["fix_command"]
    error = document["error"]
    assert "files are patched" in error["message"], error
    assert f"No module named '{ABSENT_DEPENDENCY}'" in error["message"], error
    assert "install vLLM's dependencies" in error["hint"], error
    assert "apply" not in error["hint"], error
    verdict = granite_verdict(document)
    assert verdict["state"] == "applied"
    assert verdict["import_failed"] is True, verdict
    assert not any("and live" in reason for reason in verdict["reasons"]), verdict


def test_cannot_import_vllm_in_text(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    (site / MODEL).write_text(f"import {ABSENT_DEPENDENCY}\n" + granite.AFTER)
    env = {
        "PYTHONPATH": str(site),
        "DEEPSTACK_PATCH_CACHE": str(tmp_path / "cache"),
    }
    result = CliRunner(env=env).invoke(main, ["doctor", "--import"])
    assert result.exit_code == 2, result.output
    stderr = " ".join(result.stderr.split())
    assert "error: the files are patched" in stderr, stderr
    assert f"No module named '{ABSENT_DEPENDENCY}'" in stderr, stderr
    assert "hint: install vLLM's dependencies" in stderr, stderr
    assert "apply" not in result.output, result.output


def test_a_fix_that_is_needed_still_says_apply_when_imports_fail(
    tmp_path: Path,
) -> None:
    """A needed fix is not live whatever the import says: apply is the advice."""
    site = make_site(
        tmp_path / "site", f"import {ABSENT_DEPENDENCY}\n" + granite.BEFORE
    )
    code, document = doctor(site, args=("--import",))
    assert code == 1, document
    assert "apply --installed" in document["fix_command"]


def test_no_vllm_is_an_error(tmp_path: Path) -> None:
    code, document = doctor(tmp_path)
    assert code == 2
    assert "has no vllm to import" in document["output"]


def test_a_python_that_is_not_one_is_an_error(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    code, document = doctor(tmp_path, args=("--python", str(fake)))
    assert code == 2
    assert "not a Python interpreter" in document["output"]


@pytest.mark.parametrize("program", ["/bin/ls", "/bin/echo", "/bin/true"])
def test_a_program_that_is_no_python_is_named_in_one_line(
    program: str, tmp_path: Path
) -> None:
    """/bin/ls echoed the whole probe back: an 11.9 KB error (issue 25)."""
    for command in (["doctor"], ["status", "--installed"]):
        result = CliRunner().invoke(main, [*command, "--python", program])
        assert result.exit_code == 2
        error, hint = result.stderr.splitlines()
        assert error == f"error: --python {program}: not a Python interpreter " + (
            "(it did not run a one-line Python program)"
        )
        assert hint.startswith("hint: give the Python that runs vLLM")


# --- the official wheel ---------------------------------------------------------


@pytest.mark.release
def test_official_wheel_doctor_before_and_after_apply(
    official_venv: Path, tmp_path: Path
) -> None:
    """doctor on the official wheel as pip installed it (its bytecode
    compiled, as in a real image): fixes not live, then live after ``apply
    --installed``, the change record read back; ``--import`` without torch
    is an error about the environment. The doctor facts on a real install
    are this test's alone."""
    from tests.support.installed import link_copy_venv, official_wheel

    wheel = official_wheel("0.20.2")
    python = link_copy_venv(official_venv, tmp_path / "venv")
    env = python.parent.parent
    site = next((env / "lib").glob("python3*/site-packages"))
    before = CliRunner().invoke(main, ["doctor", "--python", str(python)])
    assert before.exit_code == 1, before.output
    # The way an image is patched: in place, RECORD, bytecode and the
    # change record kept true.
    applied = CliRunner().invoke(
        main, ["apply", "--installed", "--python", str(python)]
    )
    assert applied.exit_code == 0, applied.output
    record = json.loads(
        (site / "vllm-0.20.2.dist-info/deepstack_patch.json").read_text()
    )
    code, after = doctor_json(python)
    assert code == 0, after
    assert after["record"]["applied"] == record["applied"]
    assert {GRANITE, "vllm#43617"} <= set(after["record"]["applied"])
    assert after["record"]["changed_since"] == []

    # The wheel went in with --no-deps: this Python cannot import vLLM (no
    # torch). --import says so, as an error about the environment, not as
    # fixes that are not live to apply again.
    imported = CliRunner().invoke(
        main, ["doctor", "--python", str(python), "--import", "--format", "json"]
    )
    assert imported.exit_code == 2, imported.output
    document = json.loads(imported.stdout)
    assert document["fix_command"] is None, document
    assert "No module named 'torch'" in document["error"]["message"], document
    assert "install vLLM's dependencies" in document["error"]["hint"], document
    checked = [p for p in document["patches"] if p["counts"]]
    assert checked and all(p["import_failed"] for p in checked), checked
    text = CliRunner().invoke(main, ["doctor", "--python", str(python), "--import"])
    assert text.exit_code == 2, text.output
    stderr = " ".join(text.stderr.split())
    assert "error: the files are patched" in stderr, stderr
    assert "torch is missing" in stderr, stderr
    assert "apply --installed" not in text.output, text.output

    # A later layer puts the official qwen3_vl.py back: doctor names it.
    qwen = "vllm/model_executor/models/qwen3_vl.py"
    assert qwen in [entry["path"] for entry in record["files"]]
    (site / qwen).write_bytes(zip_member(wheel, qwen))
    code, changed = doctor_json(python)
    assert code == 1, changed
    assert changed["record"]["changed_since"] == [qwen]
    reasons = [r for p in changed["patches"] if not p["live"] for r in p["reasons"]]
    assert any(f"{qwen} changed since" in reason for reason in reasons), reasons
    text = CliRunner().invoke(main, ["doctor", "--python", str(python)])
    assert text.exit_code == 1 and "changed since" in text.output, text.output


def doctor_json(python: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(
        main, ["doctor", "--python", str(python), "--format", "json"]
    )
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def zip_member(wheel: Path, name: str) -> bytes:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name)


# --- the check in every vLLM process, through vLLM's own plugin loader -------------

LOAD_PLUGINS = "from vllm.plugins import load_general_plugins; load_general_plugins()"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deepstack-patch importable, and its entry point declared, from a folder
    put on PYTHONPATH: the managed environment is shared and never modified."""
    import deepstack_patch
    import deepstack_patch.patches
    from deepstack_patch import __version__

    folder = tmp_path_factory.mktemp("plugin")
    package = folder / "deepstack_patch"
    package.mkdir()
    for child in Path(deepstack_patch.__file__).parent.iterdir():
        (package / child.name).symlink_to(child)
    (package / "patches").symlink_to(Path(deepstack_patch.patches.__file__).parent)
    info = folder / f"deepstack_patch_live-{__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: deepstack-patch-live\nVersion: {__version__}\n"
    )
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n"
        "deepstack_patch_live = deepstack_patch.liveness.live_plugin:check_live\n"
    )
    return folder


def load_plugins(proof_env, tree: Path, plugin_path: Path, cache: Path, **env: str):
    from deepstack_patch.proof import envs

    environment = envs.subprocess_env(tree)
    environment["PYTHONPATH"] = f"{tree}{os.pathsep}{plugin_path}"
    environment["DEEPSTACK_PATCH_CACHE"] = str(cache)
    environment.update(env)
    done = subprocess.run(
        [str(proof_env.python), "-c", LOAD_PLUGINS],
        env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if "deepstack-patch:" in line
    ]
    return done.returncode, lines, done.stderr


@pytest.mark.verify
@pytest.mark.release
def test_plugin_in_vllms_loader_on_pristine_and_patched_trees(
    proof_env, release_tree, patched_copy, plugin_path: Path, tmp_path: Path
) -> None:
    pristine = release_tree("0.20.2")
    code, lines, _ = load_plugins(proof_env, pristine, plugin_path, tmp_path / "c1")
    assert code == 0 and len(lines) == 1, lines
    assert "fixes NOT live" in lines[0] and "vllm#40917" in lines[0], lines
    assert "deepstack-patch apply --installed" in lines[0]
    print("pristine, full check:", lines[0].rsplit("(", 1)[-1])

    code, lines, stderr = load_plugins(
        proof_env, pristine, plugin_path, tmp_path / "c1", DEEPSTACK_PATCH_REQUIRE="1"
    )
    assert code != 0 and "FixesNotLive" in stderr, stderr[-2000:]
    print("pristine, cached:", stderr.strip().splitlines()[-1][-40:])

    for switched_off in ({"DEEPSTACK_PATCH_CHECK": "0"}, {"VLLM_PLUGINS": "other"}):
        code, lines, _ = load_plugins(
            proof_env, pristine, plugin_path, tmp_path / "c1", **switched_off
        )
        assert code == 0 and lines == [], (switched_off, lines)

    patched = patched_copy("0.20.2")
    applied = CliRunner().invoke(main, ["apply", "--vllm-src", str(patched)])
    assert applied.exit_code == 0, applied.output
    for run in ("full check", "cached"):
        code, lines, _ = load_plugins(proof_env, patched, plugin_path, tmp_path / "c2")
        assert code == 0 and len(lines) == 1, lines
        assert "fixes live: vllm#38933, vllm#38040, vllm#40932, vllm#40917, " \
            "vllm#43617" in lines[0], lines  # fmt: skip
        print(f"patched, {run}:", lines[0].rsplit("(", 1)[-1])


# --- the live check, without vLLM: a small package with a logger of its own ---------

CHECK = (
    "import vllm\n"
    "from deepstack_patch.liveness.live_plugin import check_live\n"
    "check_live()\n"
)


def run_check(site: Path, **env: str) -> subprocess.CompletedProcess:
    (site / "vllm/logger.py").write_text(
        "import logging\nlogging.basicConfig(level=logging.INFO)\n"
        "init_logger = logging.getLogger\n"
    )
    environment = dict(
        os.environ, PYTHONPATH=str(site), DEEPSTACK_PATCH_CACHE=str(site / "c"), **env
    )
    return subprocess.run(
        [sys.executable, "-c", CHECK], env=environment, capture_output=True, text=True
    )


def test_live_check_warns_raises_or_stays_quiet(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.BEFORE)
    warned = run_check(site)
    assert warned.returncode == 0
    assert "WARNING" in warned.stderr and "fixes NOT live" in warned.stderr
    assert f"{GRANITE}: needed in {MODEL}" in warned.stderr
    required = run_check(site, DEEPSTACK_PATCH_REQUIRE="1")
    assert required.returncode != 0 and "FixesNotLive" in required.stderr
    quiet = run_check(site, DEEPSTACK_PATCH_CHECK="0")
    assert quiet.returncode == 0 and "deepstack-patch" not in quiet.stderr


def test_live_check_cache_follows_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepstack_patch.liveness.live_plugin import _cache_file

    site = make_site(tmp_path / "site", granite.AFTER)
    assert f"fixes live: {GRANITE}" in run_check(site).stderr
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(site / "c"))
    cache = _cache_file(site)
    assert json.loads(cache.read_text())["live"] == [GRANITE]
    # Rewritten in place with another size: the cache must not answer.
    (site / MODEL).write_text(granite.BEFORE)
    assert "fixes NOT live" in run_check(site).stderr
    assert json.loads(cache.read_text())["missing"] == {GRANITE: f"needed in {MODEL}"}


def test_live_check_trusts_an_unchanged_record_and_its_skips(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    write_record(site)
    assert f"fixes live: {GRANITE}" in run_check(site).stderr
    assert not (site / "c").exists()  # answered by the record, no full check
    (site / MODEL).write_text(granite.BEFORE)  # changed since: the full check
    write_record(site, applied=(), skipped=(GRANITE,))
    checked = run_check(site)
    assert "WARNING" not in checked.stderr
    assert f"skipped on purpose: {GRANITE}" in checked.stderr


def test_live_check_finds_stale_bytecode(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", granite.AFTER)
    pyc = plant_bytecode(
        site, granite.BEFORE, py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    checked = run_check(site)
    assert f"{GRANITE}: stale bytecode {pyc}" in checked.stderr


def test_doctor_names_the_open_follow_ups_of_the_fixes_it_reports(
    tmp_path: Path,
) -> None:
    """One line that counts the follow-ups of the fixes that matter here and
    says how to read them (text), the follow-ups in JSON; they never change
    the exit code."""
    site = make_site(tmp_path / "site", granite.AFTER)
    code, document = doctor(site)
    assert code == 0
    assert [f["reference"] for f in granite_verdict(document)["follow_ups"]] == [
        "vllm#49094"
    ]
    env = {
        "PYTHONPATH": str(site),
        "DEEPSTACK_PATCH_CACHE": str(tmp_path / "cache"),
    }
    text = CliRunner(env=env).invoke(main, ["doctor"])
    assert text.exit_code == 0, text.output
    lines = [line for line in text.output.splitlines() if "follow-up" in line]
    assert lines == [
        "1 upstream follow-up: `deepstack-patch status --verbose` or `list` shows it"
    ]

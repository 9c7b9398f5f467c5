"""An installed vLLM as a target: ``--installed``, in-place writes, ``revert``.

The ``release`` tests use the official vLLM 0.20.2 wheel from the package
index, installed with ``pip install --no-deps`` into a throwaway venv (see
``tests.support.installed``). The unmarked tests build a tiny fake install in
``tmp_path`` and need no download.
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from deepstack_patch.cli import main
from deepstack_patch.engine import transaction
from deepstack_patch.engine.bytecode import invalidation_mode
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.inplace import apply_in_place, revert_in_place
from deepstack_patch.engine.installed import (
    RECORD_NAME,
    find_installed,
    installed_in_folder,
)
from deepstack_patch.engine.plan import FileEdit
from deepstack_patch.engine.record import record_hash, updated_record

from tests.support.installed import (
    GRANITE,
    QWEN3_VL,
    bytecode_report,
    dist_info,
    install_wheel,
    link_copy_venv,
    make_venv,
    official_wheel,
    other_python,
    own_copy,
    plant_unchecked_bytecode,
    record_mismatches,
    site_packages,
    snapshot,
)

release = pytest.mark.release


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_refused(result: Result, *fragments: str) -> None:
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "error:" in output, result.output
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in:\n{result.output}"


# --- the official wheel in a venv ------------------------------------------


@pytest.fixture
def venv(official_venv: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A hard-link copy of the run's pristine venv with the official wheel
    (tests/conftest.py): (its python, its site-packages)."""
    python = link_copy_venv(official_venv, tmp_path / "venv")
    yield python, site_packages(python)
    # Thousands of links per copy: gone now rather than in a later session's
    # clean-up of old temporary folders.
    for folder, _, _ in os.walk(tmp_path):
        os.chmod(folder, 0o755)
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


def apply_installed(python: Path, *extra: str) -> Result:
    return run("apply", "--installed", "--python", str(python), *extra)


def changed_modules(site: Path) -> list[str]:
    document = json.loads((dist_info(site) / RECORD_NAME).read_bytes())
    modules = [entry["path"] for entry in document["files"]]
    assert modules, "the change record lists no file"
    return modules


@release
def test_apply_keeps_every_record_hash_and_a_second_apply_is_a_noop(venv) -> None:
    python, site = venv
    target = site / GRANITE
    own_copy(target)
    target.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(target, 1234, 4321)
    result = apply_installed(python)
    assert result.exit_code == 0, result.output
    assert "installed in" in result.output and GRANITE in result.output
    checked, wrong = record_mismatches(site)
    assert checked > 3000 and wrong == []
    info = target.stat()
    assert stat.S_IMODE(info.st_mode) == 0o640
    if os.geteuid() == 0:
        assert (info.st_uid, info.st_gid) == (1234, 4321)
    document = json.loads((dist_info(site) / RECORD_NAME).read_bytes())
    assert document["distribution"] == {"name": "vllm", "version": "0.20.2"}
    assert {"vllm#40917", "vllm#43617"} <= set(document["applied"])
    for entry in document["files"]:
        original = dist_info(site) / entry["original"]
        assert original.is_file(), entry
    # pip compiled timestamp bytecode at install: rebuilt for the new sources.
    report = bytecode_report(python, site, [e["path"] for e in document["files"]])
    assert len(report) == len(document["files"])
    assert {r["mode"] for r in report} == {"timestamp"}
    assert all(r["fresh"] and r["same_code"] for r in report), report

    before = snapshot(site)
    again = apply_installed(python)
    assert again.exit_code == 0, again.output
    assert "nothing to do" in again.output
    assert snapshot(site) == before


@release
def test_no_stale_bytecode_after_apply_over_unchecked_hash_pycs(venv) -> None:
    python, site = venv
    modules = [GRANITE, QWEN3_VL]
    plant_unchecked_bytecode(python, site, modules)
    planted = bytecode_report(python, site, modules)
    # -O0 replaces pip's timestamp pyc; -O1 adds an .opt-1.pyc.
    assert [r["mode"] for r in planted] == ["unchecked-hash"] * 4
    assert all(r["fresh"] and r["same_code"] for r in planted)

    assert apply_installed(python).exit_code == 0
    modules = changed_modules(site)
    assert set(modules) >= {GRANITE, QWEN3_VL}
    after = bytecode_report(python, site, modules)
    assert len(after) == len(planted) + len(modules) - 2  # nothing lost silently
    stale = [r for r in after if not (r["fresh"] and r["same_code"])]
    assert stale == []
    # Each pyc kept the invalidation mode it had before the apply.
    modes_before = {r["pyc"]: r["mode"] for r in planted}
    for report in after:
        if report["pyc"] in modes_before:
            assert report["mode"] == modes_before[report["pyc"]], report


@release
def test_revert_gives_back_every_file_byte_for_byte(venv) -> None:
    python, site = venv
    plant_unchecked_bytecode(python, site, [QWEN3_VL])
    before = snapshot(site)
    assert apply_installed(python).exit_code == 0
    assert snapshot(site) != before
    result = run("revert", "--installed", "--python", str(python))
    assert result.exit_code == 0, result.output
    assert "reverted" in result.output
    assert snapshot(site) == before
    assert not (dist_info(site) / "deepstack_patch").exists()
    again = run("revert", "--installed", "--python", str(python))
    assert again.exit_code == 0 and "nothing to revert" in again.output


@release
def test_applies_accumulate_in_one_record_and_revert_undoes_both(venv) -> None:
    python, site = venv
    before = snapshot(site)
    first = apply_installed(python, "--skip", "vllm#43617")
    assert first.exit_code == 0, first.output
    document = json.loads((dist_info(site) / RECORD_NAME).read_bytes())
    assert document["skipped"] == ["vllm#43617"]
    assert "vllm#43617" not in document["applied"]
    assert apply_installed(python).exit_code == 0  # rewrites qwen3_vl.py again
    document = json.loads((dist_info(site) / RECORD_NAME).read_bytes())
    assert "vllm#43617" in document["applied"] and document["skipped"] == []
    paths = [entry["path"] for entry in document["files"]]
    assert len(paths) == len(set(paths)) and QWEN3_VL in paths
    checked, wrong = record_mismatches(site)
    assert checked > 0 and wrong == []
    assert run("revert", "--installed", "--python", str(python)).exit_code == 0
    assert snapshot(site) == before


@release
def test_bytecode_is_built_by_the_target_interpreter(tmp_path) -> None:
    """A vLLM in another Python: its bytecode is rebuilt by that Python, and
    bytecode of this one (a foreign tag) is removed, never left stale."""
    base = other_python()
    if base is None:
        pytest.skip("no CPython of another minor version on this machine")
    venv_root = tmp_path / "other"
    subprocess.run([str(base), "-m", "venv", str(venv_root)], check=True)
    python = venv_root / "bin" / "python"
    install_wheel(python, official_wheel())
    site = site_packages(python)
    # This interpreter's bytecode beside the other one's (a foreign tag).
    py_compile.compile(str(site / QWEN3_VL), doraise=True)
    assert apply_installed(python).exit_code == 0
    document = json.loads((dist_info(site) / RECORD_NAME).read_bytes())
    removed = [b["path"] for b in document["bytecode"] if b["action"] == "removed"]
    assert len(removed) == 1 and sys.implementation.cache_tag in removed[0]
    assert not (site / removed[0]).exists()
    report = bytecode_report(python, site, changed_modules(site))
    assert len(report) == len(document["files"])
    assert all(r["fresh"] and r["same_code"] for r in report), report


@release
def test_pip_uninstall_after_apply_leaves_no_file(venv) -> None:
    python, site = venv
    assert apply_installed(python).exit_code == 0
    folder = dist_info(site)
    subprocess.run(
        [str(python), "-m", "pip", "uninstall", "-y", "-q", "vllm"], check=True
    )
    assert not (site / "vllm").exists()
    assert not folder.exists()


@release
def test_a_site_packages_folder_is_an_installed_target(venv, tmp_path) -> None:
    python, site = venv
    before = snapshot(site)
    status = run("status", "--vllm-src", str(site), "--format", "json")
    assert status.exit_code == 0, status.output
    assert "working on it as an installed distribution" in status.output
    series = tmp_path / "series"
    export = run(
        "export", "--installed", "--python", str(python), "--series", str(series)
    )
    assert export.exit_code == 0, export.output
    lines = (series / "series").read_text().splitlines()
    names = [line for line in lines if line.strip() and not line.startswith("#")]
    assert len(names) >= 2 and all((series / name).is_file() for name in names)
    result = run("apply", "--vllm-src", str(site))
    assert result.exit_code == 0, result.output
    checked, wrong = record_mismatches(site)
    assert checked > 0 and wrong == []
    assert (dist_info(site) / RECORD_NAME).is_file()
    reverted = run("revert", "--vllm-src", str(site))
    assert reverted.exit_code == 0, reverted.output
    assert snapshot(site) == before


# --- faults: clear error, exit 2, nothing changed ---------------------------


@release
def test_read_only_site_packages_is_refused_unchanged(venv) -> None:
    python, site = venv
    before = snapshot(site)
    folders = [site, *(Path(d) for d, _, _ in os.walk(site / "vllm"))]
    folders += [Path(d) for d, _, _ in os.walk(dist_info(site))]
    modes = {folder: folder.stat().st_mode for folder in folders}
    for folder in folders:
        folder.chmod(stat.S_IMODE(modes[folder]) & ~0o222)
    try:
        assert_refused(apply_installed(python), "read-only")
    finally:
        for folder, mode in modes.items():
            folder.chmod(stat.S_IMODE(mode))
    assert snapshot(site) == before


@release
def test_record_without_the_targets_row_is_refused_unchanged(venv) -> None:
    python, site = venv
    record = dist_info(site) / "RECORD"
    own_copy(record)
    lines = record.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(GRANITE.encode() + b",")]
    assert len(kept) == len(lines) - 1
    record.write_bytes(b"".join(kept))
    before = snapshot(site)
    assert_refused(apply_installed(python), "RECORD", f"no row for {GRANITE}")
    assert snapshot(site) == before


@release
def test_revert_refuses_a_file_changed_after_apply(venv) -> None:
    python, site = venv
    assert apply_installed(python).exit_code == 0
    target = site / QWEN3_VL
    target.write_bytes(target.read_bytes() + b"\n# a local hotfix\n")
    before = snapshot(site)
    result = run("revert", "--installed", "--python", str(python))
    assert_refused(result, QWEN3_VL, "changed after deepstack-patch wrote it")
    assert snapshot(site) == before


@release
def test_two_concurrent_applies_on_one_install(venv) -> None:
    python, site = venv
    command = [
        sys.executable, "-m", "deepstack_patch", "apply", "--installed",
        "--python", str(python),
    ]  # fmt: skip
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [(p.wait(timeout=600), p.stdout.read().decode()) for p in runs]
    codes = sorted(code for code, _ in outputs)
    assert codes in ([0, 0], [0, 2]), outputs
    for code, output in outputs:
        if code == 2:
            assert "another deepstack-patch run is writing" in output, output
    assert sum("applied" in output for _, output in outputs) >= 1
    checked, wrong = record_mismatches(site)
    assert checked > 0 and wrong == []
    assert len(changed_modules(site)) >= 2
    after = apply_installed(python)
    assert after.exit_code == 0 and "nothing to do" in after.output


@release
def test_python_that_is_not_a_python_is_refused(venv, tmp_path) -> None:
    _, site = venv
    before = snapshot(site)
    script = tmp_path / "not-python"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    text = tmp_path / "text-file"
    text.write_text("not a program\n")
    text.chmod(0o755)
    for fake in (script, text, tmp_path / "missing"):
        assert_refused(apply_installed(fake), f"--python {fake}")
    assert snapshot(site) == before


def test_python_without_vllm_is_refused(tmp_path) -> None:
    python = make_venv(tmp_path / "empty", with_pip=False)
    assert_refused(apply_installed(python), "has no vllm")


def test_python_option_needs_installed() -> None:
    assert_refused(
        run("status", "--release", "0.20.2", "--python", sys.executable),
        "--python goes with --installed",
    )


# --- fast tier: a tiny fake install in tmp_path -----------------------------

MODULE = "vllm/tiny.py"
OLD_SOURCE = b"def answer():\n    return 41\n"
NEW_SOURCE = b"def answer():\n    return 42\n"


def fake_install(root: Path) -> Path:
    """site-packages with vllm/tiny.py, its bytecode (3 modes) and a dist-info."""
    site = root / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_bytes(b"")
    (site / MODULE).write_bytes(OLD_SOURCE)
    modes = py_compile.PycInvalidationMode
    for level, mode in [
        (0, modes.UNCHECKED_HASH),
        (1, modes.CHECKED_HASH),
        (2, modes.TIMESTAMP),
    ]:
        py_compile.compile(
            str(site / MODULE), optimize=level, invalidation_mode=mode, doraise=True
        )
    dist = site / "vllm-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n"
    )
    rows = [
        f"vllm/__init__.py,{record_hash(b'')},0",
        f"{MODULE},{record_hash(OLD_SOURCE)},{len(OLD_SOURCE)}",
        "vllm-9.9.9.dist-info/METADATA,,",
        "vllm-9.9.9.dist-info/RECORD,,",
    ]
    (dist / "RECORD").write_bytes(("\r\n".join(rows) + "\r\n").encode())
    return site


def test_updated_record_keeps_format_and_rows_without_hash() -> None:
    raw = b"a.py,sha256=x,1\r\nb.pyc,,\r\nd/RECORD,,\r\n"
    new = updated_record(raw, {"a.py": b"new", "b.pyc": b"x", "c": b"yz"}, "d/RECORD")
    assert (
        new
        == (
            f"a.py,{record_hash(b'new')},3\r\nb.pyc,,\r\nd/RECORD,,\r\n"
            f"c,{record_hash(b'yz')},2\r\n"
        ).encode()
    )
    assert updated_record(b"a.py,sha256=x,1\n", {}, "RECORD") == b"a.py,sha256=x,1\n"


def test_apply_and_revert_in_place_on_a_fake_install(tmp_path) -> None:
    site = fake_install(tmp_path)
    installed = installed_in_folder(site, site / "vllm-9.9.9.dist-info")
    before = snapshot(site)
    cache = site / "vllm" / "__pycache__"
    pycs = sorted(p.name for p in cache.glob("tiny.*.pyc"))
    assert len(pycs) == 3
    modes = {name: invalidation_mode((cache / name).read_bytes()) for name in pycs}
    assert sorted(modes.values()) == ["checked-hash", "timestamp", "unchecked-hash"]

    edit = FileEdit(MODULE, OLD_SOURCE, NEW_SOURCE, ["vllm#1"])
    written = apply_in_place(installed, [edit], skipped=["vllm#2"])
    assert MODULE in written and "vllm-9.9.9.dist-info/RECORD" in written
    checked, wrong = record_mismatches(site)
    assert checked >= 4 and wrong == []  # the module, the record, its originals
    report = bytecode_report(Path(sys.executable), site, [MODULE])
    assert len(report) == 3
    assert all(r["fresh"] and r["same_code"] for r in report), report
    assert {r["pyc"]: r["mode"] for r in report} == modes
    document = json.loads((site / "vllm-9.9.9.dist-info" / RECORD_NAME).read_bytes())
    assert document["applied"] == ["vllm#1"] and document["skipped"] == ["vllm#2"]
    assert len(document["bytecode"]) == 3

    result = revert_in_place(installed)
    assert result.files == [MODULE] and not result.nothing
    assert snapshot(site) == before


def test_bytecode_of_another_interpreter_is_removed_and_given_back(tmp_path) -> None:
    site = fake_install(tmp_path)
    cache = site / "vllm" / "__pycache__"
    foreign = cache / "tiny.cpython-299.pyc"
    shutil.copy(next(cache.glob("tiny.*.opt-1.pyc")), foreign)
    installed = installed_in_folder(site, site / "vllm-9.9.9.dist-info")
    before = snapshot(site)
    apply_in_place(installed, [FileEdit(MODULE, OLD_SOURCE, NEW_SOURCE, ["x"])], [])
    assert not foreign.exists()
    document = json.loads((site / "vllm-9.9.9.dist-info" / RECORD_NAME).read_bytes())
    removed = [b for b in document["bytecode"] if b["action"] == "removed"]
    assert [b["path"] for b in removed] == ["vllm/__pycache__/tiny.cpython-299.pyc"]
    revert_in_place(installed)
    assert snapshot(site) == before


def test_a_failed_rename_restores_the_whole_install(tmp_path, monkeypatch) -> None:
    site = fake_install(tmp_path)
    installed = installed_in_folder(site, site / "vllm-9.9.9.dist-info")
    before = snapshot(site)

    def fail_on_record(target: Path) -> None:
        if target.name == RECORD_NAME:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(transaction, "_before_replace", fail_on_record)
    with pytest.raises(DeepstackError, match="every file was restored"):
        apply_in_place(installed, [FileEdit(MODULE, OLD_SOURCE, NEW_SOURCE, ["x"])], [])
    assert snapshot(site) == before
    leftovers = [p for p in site.rglob("*") if "deepstack" in p.name]
    assert leftovers == []


def test_a_changed_file_blocks_revert(tmp_path) -> None:
    site = fake_install(tmp_path)
    installed = installed_in_folder(site, site / "vllm-9.9.9.dist-info")
    apply_in_place(installed, [FileEdit(MODULE, OLD_SOURCE, NEW_SOURCE, ["x"])], [])
    (site / MODULE).write_bytes(b"def answer():\n    return 43\n")
    before = snapshot(site)
    with pytest.raises(DeepstackError, match="tiny.py: changed after"):
        revert_in_place(installed)
    assert snapshot(site) == before


def test_revert_hint_names_the_installed_version(tmp_path) -> None:
    """The hint said ``vllm==VERSION`` literally (issue 25)."""
    site = fake_install(tmp_path)
    installed = installed_in_folder(site, site / "vllm-9.9.9.dist-info")
    apply_in_place(installed, [FileEdit(MODULE, OLD_SOURCE, NEW_SOURCE, ["x"])], [])
    (site / MODULE).write_bytes(b"def answer():\n    return 43\n")
    before = snapshot(site)
    result = run("revert", "--vllm-src", str(site))
    assert_refused(result, "changed after deepstack-patch wrote it")
    assert "hint: reinstall vllm (pip install --force-reinstall --no-deps " in (
        result.stderr
    )
    assert "vllm==9.9.9)" in result.stderr and "VERSION" not in result.stderr
    assert snapshot(site) == before


def test_an_editable_install_is_its_checkout(tmp_path, monkeypatch) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "vllm").mkdir(parents=True)
    (checkout / "vllm" / "__init__.py").write_text("")
    site = tmp_path / "site"
    dist = site / "vllm-1.0.dev0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 1.0.dev0\n"
    )
    (dist / "RECORD").write_text("")
    url = {"url": checkout.as_uri(), "dir_info": {"editable": True}}
    (dist / "direct_url.json").write_text(json.dumps(url))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(checkout)]))
    found = find_installed(Path(sys.executable))
    assert found.editable and found.source_root == checkout.resolve()
    assert found.version == "1.0.dev0"
    result = run("status", "--installed", "--format", "json")
    assert "is an editable install of" in " ".join(result.output.split())


KILLED_RUN = r"""
import os, sys
from pathlib import Path
from deepstack_patch.engine import transaction
from deepstack_patch.engine.inplace import apply_in_place
from deepstack_patch.engine.installed import installed_in_folder
from deepstack_patch.engine.plan import FileEdit

site = Path(sys.argv[1])
def die(target):
    if target.relative_to(site).as_posix() == sys.argv[4]:
        os._exit(9)  # killed: no rollback, no cleanup
transaction._before_replace = die
installed = installed_in_folder(site, site / "vllm-9.9.9.dist-info")
edit = FileEdit("vllm/tiny.py", sys.argv[2].encode(), sys.argv[3].encode(), ["x"])
apply_in_place(installed, [edit], [])
"""


@pytest.mark.parametrize(
    "killed_at",
    [MODULE, f"vllm-9.9.9.dist-info/{RECORD_NAME}"],
    ids=["module", "record"],
)
def test_a_rerun_completes_a_killed_apply_and_revert_still_works(
    tmp_path, killed_at
) -> None:
    site = fake_install(tmp_path)
    before = snapshot(site)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(site)]
        + [OLD_SOURCE.decode(), NEW_SOURCE.decode(), killed_at]
    )
    assert killed.returncode == 9
    # New files land before any module is replaced: the module is untouched.
    assert (site / MODULE).read_bytes() == OLD_SOURCE
    assert list(site.rglob("*.deepstack-tmp")) != []

    installed = installed_in_folder(site, site / "vllm-9.9.9.dist-info")
    apply_in_place(installed, [FileEdit(MODULE, OLD_SOURCE, NEW_SOURCE, ["x"])], [])
    checked, wrong = record_mismatches(site)
    assert checked >= 4 and wrong == []
    assert [p for p in site.rglob("*.deepstack-tmp")] == []
    revert_in_place(installed)
    assert snapshot(site) == before

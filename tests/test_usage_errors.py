"""What a new user meets at the edges of the command line (issue 31, items 5-7).

Each test runs the installed command in a subprocess, as a user would, on a
small synthetic tree or a tiny release in a private cache (no network): a
mistake gets the tool's own ``error:``/``hint:`` saying what to do, a
``--dry-run`` keeps stdout a diff, and ``--help`` says what each option is
for the command at hand. The tests that need a mount run as root only.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

from tests.support import tiny_sdist
from tests.test_cli import make_tree
from tests.test_index import LocalIndex, clean_env
from tests.test_series import make_tree as make_toy_tree
from tests.test_series import toy_module

ROOT = Path(__file__).resolve().parent.parent


def cli(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2 with the tool's ``error:``/``hint:`` (not click's), each fragment
    said (whitespace folded); returns stderr."""
    assert result.returncode == 2, result.stdout + result.stderr
    stderr = result.stderr
    assert stderr.startswith("error:") and "\nhint: " in stderr, stderr
    for noise in ("Traceback", "Invalid value", "Usage:"):
        assert noise not in stderr, stderr
    folded = " ".join(stderr.split())
    for fragment in fragments:
        assert fragment in folded, f"{fragment!r} not in:\n{stderr}"
    return stderr


def error_line(stderr: str) -> str:
    return stderr.splitlines()[0]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree", granite.BEFORE)


def private_release(tmp_path: Path) -> dict[str, str]:
    """An environment whose cache holds a tiny verified 0.20.2; no index."""
    sdists = tmp_path / "cache" / "sdists"
    sdists.mkdir(parents=True)
    content = tiny_sdist("0.20.2")
    (sdists / "vllm-0.20.2.tar.gz").write_bytes(content)
    (sdists / "vllm-0.20.2.tar.gz.sha256").write_text(
        hashlib.sha256(content).hexdigest()
    )
    return {
        **os.environ,
        "DEEPSTACK_PATCH_CACHE": str(tmp_path / "cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",
    }


# -- --patches ---------------------------------------------------------------


def test_patches_that_do_not_exist(tree: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    stderr = refused(
        cli("status", "--vllm-src", tree, "--patches", missing), "no such folder"
    )
    assert error_line(stderr).count(str(missing)) == 1, stderr


def test_patches_given_a_file_says_give_its_folder(tree: Path, tmp_path: Path) -> None:
    data_file = tmp_path / "acme#1.toml"
    data_file.write_text("")
    stderr = refused(
        cli("status", "--vllm-src", tree, "--patches", data_file),
        "not a folder",
        f"give the folder that holds it: --patches {tmp_path}",
    )
    assert error_line(stderr).count(str(data_file)) == 1, stderr


def test_an_empty_patches_folder_is_named_once(tree: Path, tmp_path: Path) -> None:
    empty = tmp_path / "p-empty"
    empty.mkdir()
    stderr = refused(
        cli("status", "--vllm-src", tree, "--patches", "p-empty", cwd=tmp_path),
        "holds no patch",
    )
    assert error_line(stderr).count("p-empty") == 1, stderr


def test_one_folder_given_twice_joins_once(tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    toy_module(vendor, "acme12.py", "acme#12")
    toy = make_toy_tree(tmp_path / "toy")
    again = tmp_path / "vendor" / ".." / "vendor"
    result = cli("apply", "--vllm-src", toy, "--patches", vendor, "--patches", again)
    assert result.returncode == 0, result.stderr
    assert "acme#12" in result.stdout and "already in the series" not in result.stderr


# -- --only / --skip -----------------------------------------------------------


def test_a_derived_id_without_patches_says_patches_is_missing(tree: Path) -> None:
    refused(
        cli("status", "--vllm-src", tree, "--only", "acme#12"),
        "unknown patch id 'acme#12'",
        "--patches DIR",
    )


@pytest.mark.parametrize(
    ("selection", "said", "unsaid"),
    [
        (("--only", "acme#2"), "add --only acme#1", "drop --skip"),
        (("--skip", "acme#1"), "drop --skip acme#1", "add --only"),
    ],
)
def test_a_left_out_requirement_names_only_the_options_given(
    tmp_path: Path, selection: tuple[str, str], said: str, unsaid: str
) -> None:
    vendor = tmp_path / "vendor"
    toy_module(vendor, "a.py", "acme#1")
    toy_module(vendor, "b.py", "acme#2", requires="acme#1")
    toy = make_toy_tree(tmp_path / "toy")
    stderr = refused(
        cli("apply", "--vllm-src", toy, "--patches", vendor, *selection),
        "nothing was written",
        said,
    )
    assert unsaid not in stderr, stderr
    status = cli("status", "--vllm-src", toy, "--patches", vendor, *selection)
    assert said in status.stdout and unsaid not in status.stdout, status.stdout


# -- --release and --out ---------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "said", "unsaid"),
    [
        ("banana", "give a release's version number, such as 0.0.7", "did you mean"),
        ("O.0.7", "did you mean 0.0.7?", "such as"),
    ],
)
def test_a_release_like_no_version_says_what_a_version_looks_like(
    tmp_path: Path, asked: str, said: str, unsaid: str
) -> None:
    env = {k: v for k, v in {**os.environ, **clean_env(tmp_path)}.items() if v}
    with LocalIndex() as index:
        env["PIP_INDEX_URL"] = index.url
        stderr = refused(cli("status", "--release", asked, env=env, cwd=tmp_path), said)
    assert unsaid not in stderr, stderr


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_out_in_proc_says_it_takes_no_folders(tmp_path: Path) -> None:
    env = private_release(tmp_path)
    stderr = refused(
        cli("apply", "--release", "0.20.2", "--out", "/proc/nope", env=env),
        "/proc takes no new folders",
        "choose a folder on a disk",
    )
    assert "another program" not in stderr, stderr


@pytest.fixture
def mount_point(tmp_path: Path) -> Iterator[Path]:
    """An empty tmpfs: another file system than the folder that holds it."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs (root only)")
    folder = tmp_path / "mnt"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_out_on_an_empty_mount_point(tmp_path: Path, mount_point: Path) -> None:
    assert os.stat(mount_point).st_dev != os.stat(tmp_path).st_dev
    env = private_release(tmp_path)
    result = cli("status", "--release", "0.20.2", "--out", mount_point, env=env)
    assert result.returncode == 0, result.stderr
    assert "cross-device" not in result.stderr
    assert sorted(p.name for p in mount_point.iterdir()) == ["PKG-INFO", "vllm"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "mnt"]


def test_an_empty_out_left_staged_by_a_killed_run_is_still_empty(
    tmp_path: Path,
) -> None:
    """A run killed while staging inside ``--out`` leaves its hidden folder
    there: the next run takes the folder as empty, and removes what it left."""
    out = tmp_path / "out"
    (out / ".deepstack-extract.k1lled_").mkdir(parents=True)
    (out / ".deepstack-extract.k1lled_" / "PKG-INFO").write_text("half\n")
    env = private_release(tmp_path)
    result = cli("status", "--release", "0.20.2", "--out", out, env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["PKG-INFO", "vllm"]


@pytest.fixture
def read_only_tree(tree: Path) -> Iterator[Path]:
    """``tree`` on a read-only bind mount: not writable, even for root."""
    if os.geteuid() != 0:
        pytest.skip("mounts a read-only folder (root only)")
    if subprocess.run(["mount", "--bind", str(tree), str(tree)]).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(tree)], check=True)
        yield tree
    finally:
        subprocess.run(["umount", str(tree)], check=True)


def test_a_read_only_mount_under_vllm_src(read_only_tree: Path) -> None:
    stderr = refused(
        cli("apply", "--vllm-src", read_only_tree),
        "is on a read-only file system; nothing was written",
        "hint: remount it writable, or patch a copy of the tree",
    )
    assert "chmod" not in stderr and "for this user" not in stderr, stderr


def test_a_read_only_mount_mocked(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no mount can be made: the kernel's answers, as a ro mount gives."""
    from click.testing import CliRunner
    from deepstack_patch.cli import main
    from deepstack_patch.engine import transaction

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(transaction.os, "statvfs", lambda path: ReadOnly())
    access = os.access

    def no_writes(path: object, mode: int, *args: object, **kwargs: object) -> bool:
        return not mode & os.W_OK and access(path, mode, *args, **kwargs)

    monkeypatch.setattr(transaction.os, "access", no_writes)
    result = CliRunner().invoke(main, ["apply", "--vllm-src", str(tree)])
    assert result.exit_code == 2, result.output
    assert "read-only file system" in result.stderr, result.stderr
    assert "remount it writable" in result.stderr and "chmod" not in result.stderr


# -- apply --dry-run -------------------------------------------------------------


def test_dry_run_on_a_drifted_tree_keeps_stdout_a_diff(tmp_path: Path) -> None:
    drifted = make_tree(tmp_path / "drifted", granite.SLICED_OTHERWISE)
    result = cli("apply", "--dry-run", "--vllm-src", drifted)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # an empty diff: nothing would change
    # The plan (its table, with the drifted place), then error: and hint:.
    assert "vllm#40917  drifted" in result.stderr, result.stderr
    assert "error: vllm/model_executor/models/granite4_vision.py:5:" in result.stderr
    assert "nothing was written" in result.stderr and "\nhint: " in result.stderr


# -- --help --------------------------------------------------------------------


def option_help(command: str, option: str) -> str:
    """The help text of ``option`` in ``command --help``, whitespace folded."""
    result = cli(command, "--help")
    assert result.returncode == 0, result.stderr
    options = result.stdout.partition("\nOptions:\n")[2]
    match = re.search(rf"^  {re.escape(option)}\b(.*?)(?=^  -)", options, re.S | re.M)
    assert match, f"{option} not in {command} --help"
    # Folded, and a word click broke after its hyphen made whole again.
    return re.sub(r"(?<=\w-) (?=\w)", "", " ".join(match.group(1).split()))


@pytest.mark.parametrize("command", ["derive", "doctor", "list", "watch"])
def test_patches_help_names_no_option_the_command_lacks(command: str) -> None:
    assert "--only" not in option_help(command, "--patches")


def test_verify_help_says_the_proof_environments_size_as_testing_md() -> None:
    """verify --help and docs/testing.md (where README's tiers moved) give
    the proof environment the same size."""
    testing = (ROOT / "docs" / "testing.md").read_text()
    sizes = {
        "verify --help": re.findall(r"about ([\d.]+ GB)", option_help_text("verify")),
        "docs/testing.md": re.findall(r"about ([\d.]+ GB)", testing),
    }
    assert (
        sizes["verify --help"] and sizes["verify --help"] == sizes["docs/testing.md"]
    ), sizes


def option_help_text(command: str) -> str:
    return " ".join(cli(command, "--help").stdout.split())


@pytest.mark.parametrize(
    ("command", "meaning"),
    [
        ("apply", "extracted into and patched there"),
        # Issue 36 item 2: without --out status reads the release as released.
        ("status", "read the release's whole source in this folder"),
        ("export", "The series goes to --series"),
        ("verify", "The GPU evidence goes to --evidence-out"),
        # Issue 36 item 5: all six outputs.
        (
            "backport",
            "the patched tree, the series, the tarball, report.json, the SBOM "
            "and the provenance",
        ),
        ("wheel", "the patched wheel"),
        ("derive", "give it to apply, status or verify with --patches"),
    ],
)
def test_out_says_what_it_is_for_each_command(command: str, meaning: str) -> None:
    assert meaning in option_help(command, "--out")

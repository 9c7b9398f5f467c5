"""Permission errors say whose folder it is and what that user can do.

``chmod u+w`` is advice only for the folder's owner (and root, who may chmod
anything); anyone else is told the owner, to run as that user, or to patch in
the image build. The hint builder is tested on made-up stat results; one real
run as ``nobody`` (privileges dropped in the child) on a root-owned install
checks the whole command line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from deepstack_patch.engine import transaction
from deepstack_patch.engine.errors import IMAGE_BUILD, permission_hint
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

FOLDER = Path("/opt/venv/lib/python3.12/site-packages/vllm/config")
#: A uid no passwd entry names (the hint falls back to the number).
UNNAMED_UID = 4_242_424


def fake_status(uid: int, mode: int = stat.S_IFDIR | 0o755) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 2, uid, uid, 4096, 0, 0, 0))


def test_the_owner_is_told_to_chmod() -> None:
    hint = permission_hint(
        FOLDER, "patch a copy", status=fake_status(1000, 0o40555), euid=1000
    )
    assert f"chmod u+w {FOLDER}" in hint, hint


def test_root_may_chmod_what_it_does_not_own() -> None:
    hint = permission_hint(
        FOLDER, "patch a copy", status=fake_status(1000, 0o40555), euid=0
    )
    assert f"chmod u+w {FOLDER}" in hint, hint


def test_a_user_who_is_not_the_owner_is_told_who_is() -> None:
    hint = permission_hint(FOLDER, IMAGE_BUILD, status=fake_status(0), euid=UNNAMED_UID)
    assert "chmod" not in hint, hint
    assert f"{FOLDER} belongs to root" in hint, hint
    assert f"deepstack-patch runs as uid {UNNAMED_UID}" in hint, hint
    assert "sudo deepstack-patch" in hint, hint
    assert hint.endswith(
        "or run it in the image build instead (e.g. RUN deepstack-patch apply "
        "--installed in the Dockerfile)"
    ), hint


def test_an_owner_without_a_name_is_named_by_uid() -> None:
    hint = permission_hint(
        FOLDER, "patch a copy", status=fake_status(UNNAMED_UID), euid=1000
    )
    assert "chmod" not in hint, hint
    assert f"belongs to uid {UNNAMED_UID}" in hint, hint
    assert f"sudo -u '#{UNNAMED_UID}' deepstack-patch" in hint, hint


def test_an_install_is_patched_in_the_image_build_a_tree_as_a_copy(
    tmp_path: Path,
) -> None:
    tree, site = tmp_path / "tree", tmp_path / "site"
    tree.mkdir()
    (site / "vllm-0.1.0.dist-info").mkdir(parents=True)
    assert transaction._way_round(site) == IMAGE_BUILD
    assert transaction._way_round(tree) == "patch a copy of the tree"


def test_a_folder_that_cannot_be_looked_at_gets_the_general_advice(
    tmp_path: Path,
) -> None:
    hint = permission_hint(tmp_path / "absent", "choose another folder")
    assert "chmod" not in hint, hint
    assert "choose another folder" in hint, hint


# -- a real run as nobody ---------------------------------------------------------


def _drop_to_nobody() -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)


#: Runs the command line from this environment's packages (its .pth files
#: included, so an editable install works) in an interpreter nobody can run.
LAUNCH = (
    "import site, sys; site.addsitedir(sys.argv.pop(1)); "
    "sys.argv[0] = 'deepstack-patch'; "
    "from deepstack_patch.cli import main; main()"
)


def as_nobody(python: str, *args: str, cache: Path) -> subprocess.CompletedProcess:
    site_packages = sysconfig.get_paths()["purelib"]
    return subprocess.run(
        [python, "-c", LAUNCH, site_packages, *args],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(cache),
            "DEEPSTACK_PATCH_CACHE": str(cache),
        },
        preexec_fn=_drop_to_nobody,
        capture_output=True,
        text=True,
        timeout=300,
    )


def python_nobody_runs(cache: Path) -> str | None:
    """An interpreter of this Python's version that nobody may run, and that
    imports the command line from here (this one may sit under /root)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [
        sys.executable,
        os.path.realpath(sys.executable),
        getattr(sys, "_base_executable", ""),
        f"/usr/bin/python{version}",
        f"/usr/local/bin/python{version}",
        shutil.which(f"python{version}") or "",
    ]
    for candidate in dict.fromkeys(filter(None, candidates)):
        if not os.path.isfile(candidate):
            continue
        try:
            done = as_nobody(candidate, "--version", cache=cache)
        except PermissionError:  # under a folder nobody may not enter
            continue
        if done.returncode == 0 and "deepstack-patch" in done.stdout:
            return candidate
    return None


@pytest.fixture
def world_readable_folder() -> Iterator[Path]:
    """pytest's tmp_path sits in a root-only folder: this one nobody can reach."""
    folder = Path(tempfile.mkdtemp(prefix="deepstack-permissions-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def fake_vllm(site: Path) -> None:
    """A vllm distribution of our own: one model file the series patches."""
    models = site / "vllm/model_executor/models"
    models.mkdir(parents=True)
    for package in (site / "vllm", models.parent, models):
        (package / "__init__.py").write_text("")
    (site / "vllm/_version.py").write_text("__version__ = version = '0.1.0'\n")
    (models / "granite4_vision.py").write_text(granite.BEFORE)
    info = site / "vllm-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.1.0\n"
    )
    (info / "INSTALLER").write_text("pip\n")
    rows = [
        f"{path.relative_to(site).as_posix()},sha256={digest(path)},{path.stat().st_size}"
        for path in sorted([*(site / "vllm").rglob("*.py"), *info.iterdir()])
    ]
    rows.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def digest(path: Path) -> str:
    raw = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="dropping to nobody needs root",
)
def test_apply_installed_as_a_user_who_does_not_own_site_packages(
    world_readable_folder: Path,
) -> None:
    cache = world_readable_folder / "cache"
    cache.mkdir()
    shutil.chown(cache, "nobody")
    python = python_nobody_runs(cache)
    if python is None:
        pytest.skip("no Python here that nobody may run with these packages")
    venv = world_readable_folder / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    fake_vllm(site)
    model = site / "vllm/model_executor/models/granite4_vision.py"
    before = model.read_bytes()

    args = ("apply", "--installed", "--python", str(venv / "bin/python"))
    text = as_nobody(python, *args, cache=cache)
    stderr = " ".join(text.stderr.split())
    assert text.returncode == 2, text.stderr
    assert "Traceback" not in stderr, text.stderr
    assert "belong to root" in stderr, stderr
    assert "sudo deepstack-patch" in stderr, stderr
    assert "RUN deepstack-patch apply --installed" in stderr, stderr
    assert "chmod" not in stderr, stderr

    document = as_nobody(python, *args, "--format", "json", cache=cache)
    assert document.returncode == 2, document.stderr
    error = json.loads(document.stdout)["error"]
    assert "belong to root" in error["hint"], error
    assert "chmod" not in error["hint"], error
    assert model.read_bytes() == before

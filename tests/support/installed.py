"""Helpers for the installed-vLLM tests: the official wheel, venvs, snapshots.

The official vLLM wheel is fetched once into the cache by the tool's own
``deepstack_patch.fetch.wheels`` (pip's configuration: index, proxy,
certificates; sha256 checked; under a file lock), and installed with
``pip install --no-deps`` into one pristine venv per session (the
``official_venv`` fixture of tests/conftest.py), for every file that needs it.
Tests that write get a copy of that venv made of hard links (``cp -al``): the
tool only ever replaces files (a new file, then a rename) and pip uninstall
only unlinks them, so the pristine venv keeps its bytes. A test that changes a
file itself breaks the link first (:func:`own_copy`).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

WHEEL_VERSION = "0.20.2"
#: Where the 0.20.2 wheel's patches land (every module the series rewrites).
GRANITE = "vllm/model_executor/models/granite4_vision.py"
QWEN3_VL = "vllm/model_executor/models/qwen3_vl.py"


def official_wheel(version: str = WHEEL_VERSION) -> Path:
    """The official vLLM wheel for ``version`` in the cache, downloading it once.

    The tool's own download path (``deepstack_patch.fetch.wheels``): the
    index pip is configured for, the sha256 checked, one copy in the cache's
    ``wheels`` folder shared with ``wheel --release``. A verified copy there
    is used without asking the index.
    """
    from deepstack_patch.fetch.wheels import cached_wheels, download_wheel, find_wheel

    found = cached_wheels(version) or [download_wheel(find_wheel(version))]
    assert found[0].is_file(), f"no vllm-{version} wheel at {found[0]}"
    return found[0]


def make_venv(path: Path, with_pip: bool = True) -> Path:
    """A fresh venv at ``path``; returns its python."""
    args = [sys.executable, "-m", "venv", str(path)]
    if not with_pip:
        args.append("--without-pip")
    subprocess.run(args, check=True)
    return path / "bin" / "python"


def install_wheel(python: Path, wheel: Path) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps"]
        + ["--disable-pip-version-check", str(wheel)],
        check=True,
    )


def layered_venv(base_python: Path, path: Path, pristine: Path) -> Path:
    """A venv whose packages come from ``base_python``'s environment, with
    the official wheel on top; returns its python.

    ``venv --system-site-packages`` would reach the base interpreter's
    packages, not a venv's, so a ``.pth`` file adds the base environment's
    site-packages (and runs its own ``.pth`` files) after the new venv's own:
    vllm comes from the wheel, torch, pytest and the rest from the base.
    Where the base is a venv of the same Python as the ``pristine`` venv (the
    official wheel installed once a run), the venv is a hard-link copy of
    that one; otherwise the wheel is installed (``--no-deps``) afresh.
    """
    if python_version(base_python) == python_version(pristine / "bin" / "python"):
        python = link_copy_venv(pristine, path)
    else:
        subprocess.run(
            [str(base_python), "-m", "venv", "--without-pip", str(path)], check=True
        )
        python = path / "bin" / "python"
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
            + ["--no-deps", "--disable-pip-version-check", str(official_wheel())],
            check=True,
        )
    base_site = site_packages(base_python)
    (site_packages(python) / "deepstack_test_layer.pth").write_text(
        f"import site; site.addsitedir({str(base_site)!r})\n"
    )
    return python


def python_version(python: Path) -> str:
    """The interpreter's ``sys.version`` (bytecode is only shared between equals)."""
    done = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def site_packages(python: Path) -> Path:
    done = subprocess.run(
        [
            str(python),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


def link_copy_venv(source: Path, destination: Path) -> Path:
    """A copy of a venv whose files are hard links (``cp -al``); returns its python."""
    subprocess.run(["cp", "-al", str(source), str(destination)], check=True)
    return destination / "bin" / "python"


def own_copy(path: Path) -> None:
    """Break ``path``'s hard link to the pristine venv before changing it."""
    content = path.read_bytes()
    mode = path.stat().st_mode
    path.unlink()
    path.write_bytes(content)
    path.chmod(stat.S_IMODE(mode))


def dist_info(site: Path) -> Path:
    (found,) = site.glob("vllm-*.dist-info")
    return found


Snapshot = dict[str, tuple[str, int]]


def snapshot(site: Path) -> Snapshot:
    """sha256 and mode of every file under ``vllm/`` and the dist-info folder."""
    found: Snapshot = {}
    for top in (site / "vllm", dist_info(site)):
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                path = Path(dirpath, name)
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[path.relative_to(site).as_posix()] = (
                    digest,
                    stat.S_IMODE(path.lstat().st_mode),
                )
    assert found, f"nothing to snapshot under {site}"
    return found


def record_mismatches(site: Path) -> tuple[int, list[str]]:
    """How many RECORD rows carry a hash, and those whose file does not match."""
    checked, wrong = 0, []
    record = dist_info(site) / "RECORD"
    for row in csv.reader(record.read_text(encoding="utf-8").splitlines()):
        if len(row) < 3 or not row[1]:
            continue
        checked += 1
        path = site / row[0]
        if not path.is_file():
            wrong.append(f"{row[0]}: missing")
            continue
        data = path.read_bytes()
        digest = hashlib.sha256(data).digest()
        expected = "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        if row[1] != expected or int(row[2]) != len(data):
            wrong.append(row[0])
    return checked, wrong


#: Runs in the venv: for every pyc of the given modules, whether the import
#: system would accept it for the current source, and whether its code is the
#: code of the current source (compiled at the pyc's optimisation level).
BYTECODE_CHECK = r"""
import importlib._bootstrap_external as bx, importlib.util, json, marshal, os, re
import sys
site, modules = sys.argv[1], json.loads(sys.argv[2])
report = []
for module in modules:
    source_path = os.path.join(site, module)
    source = open(source_path, "rb").read()
    folder, name = os.path.split(source_path)
    cache = os.path.join(folder, "__pycache__")
    stem = name[:-3]
    for pyc in sorted(os.listdir(cache)) if os.path.isdir(cache) else []:
        if not pyc.startswith(stem + ".") or not pyc.endswith(".pyc"):
            continue
        data = open(os.path.join(cache, pyc), "rb").read()
        flags = int.from_bytes(data[4:8], "little")
        if flags & 1:
            fresh = data[8:16] == importlib.util.source_hash(source)
            mode = "checked-hash" if flags & 2 else "unchecked-hash"
        else:
            st = os.stat(source_path)
            fresh = (int.from_bytes(data[8:12], "little") == int(st.st_mtime)
                     and int.from_bytes(data[12:16], "little") == st.st_size)
            mode = "timestamp"
        opt = re.search(r"\.opt-(\d)\.pyc$", pyc)
        expected = compile(source, source_path, "exec", dont_inherit=True,
                           optimize=int(opt.group(1)) if opt else 0)
        same_code = marshal.loads(data[16:]) == expected
        report.append({"pyc": pyc, "module": module, "mode": mode,
                       "fresh": fresh, "same_code": same_code})
print(json.dumps(report))
"""


def bytecode_report(python: Path, site: Path, modules: list[str]) -> list[dict]:
    import json

    done = subprocess.run(
        [str(python), "-I", "-c", BYTECODE_CHECK, str(site), json.dumps(modules)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


#: Runs in the venv: compile modules to unchecked-hash bytecode at -O0 and -O1.
PLANT_UNCHECKED = r"""
import json, py_compile, sys
for path in json.loads(sys.argv[1]):
    for level in (0, 1):
        py_compile.compile(path, doraise=True, optimize=level,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
"""


def plant_unchecked_bytecode(python: Path, site: Path, modules: list[str]) -> None:
    import json

    paths = [str(site / module) for module in modules]
    subprocess.run(
        [str(python), "-I", "-c", PLANT_UNCHECKED, json.dumps(paths)], check=True
    )


def other_python() -> Path | None:
    """A CPython of another minor version than this one, if the machine has one."""
    import glob
    import shutil

    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [shutil.which(f"python3.{minor}") for minor in range(10, 15)]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(f"{pyenv}/versions/3.1[0-9]*/bin/python3"))
    for candidate in filter(None, candidates):
        done = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0 and done.stdout.strip() not in ("", mine):
            return Path(candidate)
    return None

"""An installed vLLM: which one an interpreter imports, and its distribution.

The interpreter is asked in a subprocess, without importing vllm (importing it
pulls torch and takes seconds, and needs its dependencies): the import system
finds the package (``importlib.util.find_spec``) and the distribution
metadata names its version and its ``dist-info`` folder. Installed trees are
planned like source trees whose root is site-packages; writing to them keeps
RECORD, bytecode and a change record true (``engine/inplace.py``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError, reinstall_hint
from deepstack_patch.engine.tree import VllmTree

#: The change record, in the dist-info folder, listed in RECORD.
RECORD_NAME = "deepstack_patch.json"
#: Original bytes of every changed file, under the dist-info folder.
ORIGINALS_DIR = "deepstack_patch/orig"


@dataclass(frozen=True)
class InstalledVllm:
    python: Path  # the interpreter asked
    site_packages: Path  # folder holding vllm/ and vllm-X.dist-info/
    dist_info: Path  # site_packages / "vllm-X.dist-info"
    version: str  # from the distribution metadata
    editable: bool  # direct_url.json says editable: a source tree
    source_root: Path | None  # for editable: the checkout root


@dataclass(frozen=True)
class InstalledTree(VllmTree):
    """A tree whose root is site-packages; writes go through ``inplace``."""

    installed: InstalledVllm | None = None


# Runs in the target interpreter. sys.path[0] is the working folder for -c: a
# vllm checkout there would be found instead of what the interpreter imports
# when it serves, so it is dropped.
_FIND_SCRIPT = r"""
import importlib.metadata, importlib.util, json, os, sys
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]
answer = {"executable": sys.executable, "origin": None, "dist_info": None,
          "version": None, "direct_url": None}
spec = importlib.util.find_spec("vllm")
if spec is not None:
    answer["origin"] = spec.origin
try:
    dist = importlib.metadata.distribution("vllm")
except importlib.metadata.PackageNotFoundError:
    dist = None
if dist is not None:
    path = getattr(dist, "_path", None)
    answer["dist_info"] = os.path.abspath(str(path)) if path else None
    answer["version"] = dist.version
    answer["direct_url"] = dist.read_text("direct_url.json")
print("DEEPSTACK-FIND " + json.dumps(answer))
"""


def find_installed(python: Path | None = None) -> InstalledVllm:
    """The vLLM ``python`` imports (default: this interpreter)."""
    python = _interpreter(python)
    answer = _ask(python)
    origin, dist_info = answer.get("origin"), answer.get("dist_info")
    if origin is None and dist_info is None:
        raise DeepstackError(
            f"--python {python}: this Python has no vllm (import finds none, "
            "and no vllm distribution is installed)",
            "pass the interpreter that runs vLLM (--python /path/to/venv/bin/python), "
            "or install vllm there",
        )
    if dist_info is None:
        raise DeepstackError(
            f"--python {python}: imports vllm from {origin}, which is not an "
            "installed distribution (no vllm-*.dist-info)",
            f"patch that folder as a source tree: --vllm-src {_package_root(origin)}",
        )
    if origin is None:
        raise DeepstackError(
            f"--python {python}: the vllm distribution at {dist_info} has no "
            "importable vllm package",
            reinstall_hint(answer.get("version")),
        )
    dist_path = Path(dist_info)
    editable = _editable(answer.get("direct_url"))
    package_root = _package_root(origin)
    if not editable and package_root != dist_path.parent.resolve():
        raise DeepstackError(
            f"--python {python}: imports vllm from {origin}, but its installed "
            f"distribution is at {dist_path.parent} (a checkout or PYTHONPATH "
            "entry shadows the install)",
            "remove the shadowing folder from sys.path, or patch it as a source "
            f"tree with --vllm-src {package_root}",
        )
    return InstalledVllm(
        python=python,
        site_packages=dist_path.parent.resolve(),
        dist_info=dist_path.resolve(),
        version=str(answer.get("version")),
        editable=editable,
        source_root=package_root if editable else None,
    )


def _interpreter(python: Path | None) -> Path:
    """``python`` as a path: a bare name (``python3.11``) is looked up on PATH."""
    if python is None:
        return Path(sys.executable)
    if not python.exists() and len(python.parts) == 1:
        found = shutil.which(str(python))
        return Path(found) if found else python
    return python.absolute()


def _ask(python: Path) -> dict[str, object]:
    hint = "pass a Python interpreter, e.g. --python /opt/venv/bin/python"
    try:
        done = subprocess.run(
            [str(python), "-c", _FIND_SCRIPT],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        raise DeepstackError(f"--python {python}: no such file", hint) from None
    except (OSError, subprocess.SubprocessError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise DeepstackError(
            f"--python {python}: cannot run it: {reason}", hint
        ) from None
    for line in done.stdout.splitlines():
        if line.startswith("DEEPSTACK-FIND "):
            try:
                return json.loads(line.removeprefix("DEEPSTACK-FIND "))
            except ValueError:
                break
    raise interpreter_error(python, done.returncode, done.stderr)


#: What to pass instead of an interpreter that did not answer.
PYTHON_HINT = (
    "give the Python that runs vLLM, e.g. --python /opt/venv/bin/python "
    "(in that environment, python -c 'import sys; print(sys.executable)' "
    "names it)"
)


def interpreter_error(
    python: str | Path, returncode: int, stderr: str
) -> DeepstackError:
    """Why ``python`` gave no answer to a script run with ``-c``, in one line:
    it is not a Python, it is too old, or the last line of its error."""
    version = python_version(python)
    if version is None:
        return DeepstackError(
            f"--python {python}: not a Python interpreter (it did not run a "
            "one-line Python program)",
            PYTHON_HINT,
        )
    shown = ".".join(map(str, version))
    if version < (3, 8):
        return DeepstackError(
            f"--python {python}: Python {shown}; deepstack-patch needs 3.8 or "
            "newer there (vLLM needs newer still)",
            PYTHON_HINT,
        )
    detail = (stderr.strip().splitlines() or ["no output"])[-1]
    if len(detail) > 160:  # a program that echoes our script back at us
        detail = detail[:160] + "..."
    return DeepstackError(
        f"--python {python}: Python {shown} failed (exit {returncode}): {detail}",
        "check that interpreter's environment (the last line of its error is "
        "above), or " + PYTHON_HINT,
    )


def python_version(python: str | Path) -> tuple[int, int] | None:
    """``python``'s version (major, minor), or None if it is not a Python."""
    probe = "import sys; print('DEEPSTACK-PY %d.%d' % sys.version_info[:2])"
    try:
        done = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    found = re.search(r"^DEEPSTACK-PY (\d+)\.(\d+)$", done.stdout, re.MULTILINE)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _package_root(origin: str) -> Path:
    """The folder holding ``vllm/`` for ``.../vllm/__init__.py``."""
    return Path(origin).resolve().parent.parent


def _editable(direct_url: object) -> bool:
    if not isinstance(direct_url, str):
        return False
    try:
        info = json.loads(direct_url)
    except ValueError:
        return False
    return bool(info.get("dir_info", {}).get("editable"))


def installed_in_folder(root: Path, dist_info: Path) -> InstalledVllm:
    """A ``--vllm-src`` folder that is a site-packages holding vllm."""
    version = _metadata_version(dist_info)
    return InstalledVllm(
        python=_interpreter_for(root),
        site_packages=root.resolve(),
        dist_info=dist_info.resolve(),
        version=version,
        editable=False,
        source_root=None,
    )


def _metadata_version(dist_info: Path) -> str:
    for line in (dist_info / "METADATA").read_text(errors="replace").splitlines():
        if line.startswith("Version:"):
            return line.partition(":")[2].strip()
        if not line.strip():
            break
    raise DeepstackError(
        f"{dist_info / 'METADATA'}: no Version field",
        "reinstall vllm: the distribution metadata is damaged",
    )


_LIB_PYTHON = re.compile(r"python(\d+\.\d+)t?$")


def _interpreter_for(site_packages: Path) -> Path:
    """The interpreter of ``<prefix>/lib/pythonX.Y/site-packages``, else ours.

    Only used to compile bytecode; bytecode of another interpreter is removed
    rather than rewritten (see ``inplace``).
    """
    lib = site_packages.resolve().parent
    match = _LIB_PYTHON.search(lib.name)
    if site_packages.name == "site-packages" and match:
        for candidate in (f"python{match.group(1)}", "python3", "python"):
            path = lib.parent.parent / "bin" / candidate
            if path.exists():
                return path
    return Path(sys.executable)


def open_installed(installed: InstalledVllm) -> VllmTree:
    """The tree to plan on: site-packages, or the checkout of an editable install."""
    if installed.editable and installed.source_root is not None:
        return VllmTree.open(installed.source_root)
    return InstalledTree(
        root=installed.site_packages,
        version=installed.version,
        version_source=f"{installed.dist_info.name}/METADATA",
        installed=installed,
    )

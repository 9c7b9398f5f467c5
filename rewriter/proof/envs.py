"""Managed Python environments for `deepstack-patch verify`.

Proofs and the tree's tests need torch and a handful of vLLM's dependencies,
but not vLLM's compiled code, and they must not disturb the user's own
environment. verify therefore builds a venv of its own in the user cache
(``<cache>/envs/<kind>-<key>``), keyed by a hash of the interpreter version
and the requirement set, so a changed set gets a new venv and an unchanged
one is reused. It is created with ``python -m venv`` and filled by that venv's
pip, run as a normal pip so the user's pip configuration (``PIP_INDEX_URL``,
pip.conf, constraints, find-links) applies. A file lock keeps two verify runs
from building the same venv; a venv is used only once a ``complete`` marker
says its install finished, and a half-built one is removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.cache import cache_dir
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.proof.code_cache import ENV_VAR as CODE_CACHE_ENV_VAR
from deepstack_patch.proof.platform_plugin import ENV_VAR as PLATFORM_ENV_VAR

#: Bump when the layout of a managed venv changes, so old ones are not reused.
ENV_FORMAT = 1

#: torch is pinned: an unpinned torch resolves to a multi-GB CUDA build, and
#: 2.13.0's CPU build is what the proofs are measured with.
TORCH_PIN = "torch==2.13.0"

#: The smallest set with which a vLLM source tree imports its sampler, model
#: files and v1 tests on CPU (measured; see docs/verify.md, "The managed
#: environment"). transformers is pinned as vLLM's CI pins it: with 5.23.0
#: Granite4Vision's file no longer imports. Kept equal to the `verify` extra
#: in pyproject.toml (a test checks).
CPU_REQUIREMENTS: tuple[str, ...] = (
    TORCH_PIN,
    "pytest>=8",
    "numpy",
    "pydantic",
    "regex",
    "cbor2",
    "huggingface-hub",
    "safetensors",
    "tokenizers",
    "transformers==5.5.3",
    "gguf",
    "aiohttp",
    "psutil",
    "pyzmq",
    "openai-harmony",
    "openai",
    "msgspec",
    "cloudpickle",
    "pillow",
    "pybase64",
    "cachetools",
    "uvloop",
    "py-cpuinfo",
    "einops",
    # 0.17-0.18 and 0.30+ import these on the way to the sampler.
    "prometheus-client",
    "fastapi",
)

PLUGIN_DIST = "deepstack_patch_vllm_platform"

Progress = Callable[[str], None]


def gpu_requirements(version: str) -> tuple[str, ...]:
    """The official wheel of the tree's release brings its own CUDA torch."""
    return (f"vllm=={version}", "pytest>=8")


@dataclass(frozen=True)
class ProofEnv:
    """An interpreter verify runs proofs and tests with."""

    python: Path
    #: The managed venv's folder, or None for an interpreter the user gave.
    root: Path | None = None
    key: str = ""
    built_now: bool = False

    @property
    def managed(self) -> bool:
        return self.root is not None


def env_key(requirements: Sequence[str], python_version: str | None = None) -> str:
    """A short hash of what decides a venv's content."""
    python_version = python_version or "{}.{}".format(*sys.version_info[:2])
    blob = json.dumps(
        {
            "format": ENV_FORMAT,
            "python": python_version,
            "requirements": sorted(requirements),
        }
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def envs_dir() -> Path:
    from deepstack_patch.engine.cache import cache_dir

    return cache_dir() / "envs"


def venv_python(root: Path) -> Path:
    return root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def pip_install_command(python: Path, requirements: Sequence[str]) -> list[str]:
    """pip as the user configured it: no --isolated, no index of our own."""
    return [
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        *requirements,
    ]


def ensure_env(
    kind: str,
    requirements: Sequence[str],
    progress: Progress | None = None,
    *,
    base_dir: Path | None = None,
) -> ProofEnv:
    """The managed venv for ``requirements``, built on first use, then reused."""
    from filelock import FileLock

    key = env_key(requirements)
    base = base_dir or envs_dir()
    base.mkdir(parents=True, exist_ok=True)
    root = base / f"{kind}-{key}"
    marker = root / "complete"
    say = progress or (lambda line: None)
    with FileLock(str(root) + ".lock", timeout=3600):
        if marker.is_file() and venv_python(root).exists():
            return ProofEnv(venv_python(root), root, key)
        if root.exists():
            say(f"removing the incomplete environment {root}")
            shutil.rmtree(root)
        say(f"building the {kind} environment {root} (once; reused later)")
        try:
            _build(root, requirements, say)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        marker.write_text(json.dumps({"requirements": list(requirements)}) + "\n")
        return ProofEnv(venv_python(root), root, key, built_now=True)


def _build(root: Path, requirements: Sequence[str], say: Progress) -> None:
    created = subprocess.run(
        [sys.executable, "-m", "venv", str(root)],
        capture_output=True,
        text=True,
    )
    if created.returncode != 0:
        raise DeepstackError(
            f"cannot create a venv at {root} with {sys.executable} -m venv: "
            f"{created.stderr.strip() or created.stdout.strip()}",
            "install the venv module (Debian/Ubuntu: apt-get install "
            f"python3.{sys.version_info[1]}-venv), or pass --python PATH of an "
            "environment with `pip install 'deepstack-patch[verify]'`",
        )
    python = venv_python(root)
    command = pip_install_command(python, requirements)
    say("+ " + " ".join(command[2:]))
    tail: list[str] = []
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            line = line.rstrip()
            if line:
                tail = [*tail[-29:], line]
                say(line)
    if pip.returncode != 0:
        raise DeepstackError(
            f"pip could not install the verify environment at {root}:\n"
            + "\n".join(tail),
            "check that your package index (PIP_INDEX_URL / pip.conf) has: "
            + " ".join(requirements),
        )
    install_platform_plugin(python)


def install_platform_plugin(python: Path) -> None:
    """Put deepstack-patch's vLLM platform plugin into the venv of ``python``.

    pip builds and installs a tiny generated project (the plugin module and
    its ``vllm.platform_plugins`` entry point), so vLLM's entry-point lookup
    finds it without deepstack-patch or its dependencies in that venv. pip
    runs as the user configured it; its isolated build gets setuptools from
    the same index as the rest of the environment.
    """
    import tempfile

    from deepstack_patch import __version__
    from deepstack_patch.proof import platform_plugin

    with tempfile.TemporaryDirectory(prefix="deepstack-plugin-") as scratch:
        project = Path(scratch) / PLUGIN_DIST
        project.mkdir()
        (project / f"{PLUGIN_DIST}.py").write_text(
            Path(platform_plugin.__file__).read_text()
        )
        (project / "pyproject.toml").write_text(
            plugin_pyproject(PLUGIN_DIST, __version__)
        )
        command = [*pip_install_command(python, ["--no-deps", str(project)])]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise DeepstackError(
            f"pip could not install verify's platform plugin into {python}:\n"
            + "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:]),
            "check that your package index (PIP_INDEX_URL / pip.conf) has "
            "setuptools, which pip builds the plugin with",
        )


def plugin_pyproject(name: str, version: str) -> str:
    """The generated project's pyproject.toml: one module, one entry point."""
    return f"""\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
description = "deepstack-patch verify's vLLM CPU platform plugin"

[project.entry-points."vllm.platform_plugins"]
deepstack_patch_cpu = "{name}:cpu_platform"

[tool.setuptools]
py-modules = ["{name}"]
"""


def check_python(python: Path) -> ProofEnv:
    """An interpreter the user gave with --python: it must have torch and pytest."""
    if not python.exists():
        raise DeepstackError(
            f"--python {python}: no such interpreter",
            "give the python of an environment with "
            "`pip install 'deepstack-patch[verify]'`, or leave --python out to "
            "let verify build its own environment",
        )
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; "
            "print(' '.join(m for m in ('torch', 'pytest') if not u.find_spec(m)))",
        ],
        capture_output=True,
        text=True,
    )
    missing = probe.stdout.split() if probe.returncode == 0 else ["python"]
    if missing:
        raise DeepstackError(
            f"--python {python}: cannot import {', '.join(missing)}",
            f"{python} -m pip install 'deepstack-patch[verify]'  (pins "
            f"{TORCH_PIN}, the CPU build), or leave --python out to let verify "
            "build its own environment",
        )
    return ProofEnv(python)


def subprocess_env(tree: Path) -> dict[str, str]:
    """The environment proofs and tree tests run in: the tree, on the CPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env[PLATFORM_ENV_VAR] = "cpu"
    # A user's VLLM_PLUGINS list would filter our platform plugin out.
    env.pop("VLLM_PLUGINS", None)
    # Proofs must never reach for model weights; tests that would, fail fast.
    env.setdefault("HF_HUB_OFFLINE", "1")
    # No __pycache__ in the tree: a pristine tree stays byte-identical, and
    # caching bytecode per tree path would grow the user cache without bound.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Instead the tree's modules' code is cached by content (code_cache.py).
    try:
        env[CODE_CACHE_ENV_VAR] = str(cache_dir() / "code")
    except DeepstackError:
        env.pop(CODE_CACHE_ENV_VAR, None)  # no cache folder: compile each time
    return env

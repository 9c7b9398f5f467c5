"""``verify --installed``: prove the fixes in the vLLM an interpreter imports.

The environment is that interpreter itself (its torch, CUDA where there is a
GPU), never the managed venv, and nothing is installed into it: a missing
pytest or torch is an error saying what to install.

- The proofs run there as for any tree (``proofs.py``): the tree's root is
  site-packages, already on that interpreter's path.
- A wheel ships no ``tests/``, so the release's tests come from the same
  release's sdist (cached), extracted without its ``vllm/`` into
  ``<cache>/release-tests/vllm-X``: pytest runs there (its rootdir and working
  folder), so ``import vllm`` finds the installed package. A pytest plugin
  of ours (``installed_check.py``) stops the run loudly if the tests would
  import, or did import, vllm from anywhere else.
- ``--gpu`` runs the patches' ``gpu_tests`` the same way when a GPU is here
  (the release's own conftest and fixtures included), else reports them
  skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.installed import InstalledVllm
from deepstack_patch.engine.protocol import Patch
from deepstack_patch.engine.series import patch_sources
from deepstack_patch.engine.targets import Targets
from deepstack_patch.liveness import installed_check
from deepstack_patch.proof.envs import ProofEnv, subprocess_env
from deepstack_patch.proof.gpu import GpuStage, detect_gpu
from deepstack_patch.proof.proofs import has_proof, run_proofs
from deepstack_patch.proof.tree_tests import TestRun, run_pytest, select_tests
from deepstack_patch.proof.verdicts import PatchVerdict

Progress = Callable[[str], None]

#: What pytest needs of a release besides its tests: its configuration.
RELEASE_TEST_FILES = ("pyproject.toml", "setup.cfg")

#: Runs in the target interpreter: which of torch and pytest it lacks, and
#: the torch the installed vllm asks for (its Requires-Dist).
_PROBE = r"""
import importlib.metadata as m, importlib.util as u, json, re
missing = [name for name in ("torch", "pytest") if u.find_spec(name) is None]
try:
    requires = m.requires("vllm") or []
except m.PackageNotFoundError:
    requires = []
torch = [r.split(";")[0].replace(" ", "") for r in requires
         if re.match(r"torch\b", r) and "extra ==" not in r]
print("DEEPSTACK-PROBE " + json.dumps({"missing": missing, "torch": torch[:1]}))
"""


def installed_env(installed: InstalledVllm) -> ProofEnv:
    """The interpreter of the installed vLLM, if it can run proofs and tests."""
    python = installed.python
    done = subprocess.run(
        [str(python), "-I", "-c", _PROBE], capture_output=True, text=True
    )
    answer = next(
        (
            json.loads(line.removeprefix("DEEPSTACK-PROBE "))
            for line in done.stdout.splitlines()
            if line.startswith("DEEPSTACK-PROBE ")
        ),
        None,
    )
    if answer is None:
        detail = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise DeepstackError(
            f"--python {python}: is not a Python that answers ({detail})",
            "pass the interpreter that runs vLLM, e.g. --python /opt/venv/bin/python",
        )
    if answer["missing"]:
        raise DeepstackError(
            f"--python {python}: cannot import {', '.join(answer['missing'])}, "
            "which verify --installed runs the proofs and the release's tests "
            "with (it installs nothing into your environment)",
            missing_hint(python, answer["missing"], answer["torch"], installed.version),
        )
    return ProofEnv(python)


def missing_hint(
    python: Path, missing: Sequence[str], torch: Sequence[str], version: str
) -> str:
    """The pip command that gives ``python`` what verify needs."""
    wanted = []
    if "pytest" in missing:
        wanted.append("pytest")
    if "torch" in missing:
        # The torch the wheel was built against, never verify's CPU pin.
        wanted.append(f"'{torch[0]}'" if torch else "torch")
    why = (
        f" (the torch vllm {version} requires)" if "torch" in missing and torch else ""
    )
    return f"{python} -m pip install {' '.join(wanted)}{why}"


def release_tests(version: str, progress: Progress = lambda line: None) -> Path:
    """The release's ``tests/`` (and pytest's configuration), without ``vllm/``.

    Extracted once from the cached sdist into ``<cache>/release-tests``.
    """
    from deepstack_patch.engine.cache import cache_dir
    from deepstack_patch.fetch.archives import extract_part
    from deepstack_patch.fetch.releases import release_archive

    out = cache_dir() / "release-tests" / f"vllm-{version}"
    if not (out / "tests").is_dir():
        progress(
            f"the release's tests come from vllm-{version}.tar.gz (a wheel has none)"
        )
        archive = release_archive(version, note=progress)
        extract_part(archive, out, is_release_test_file)
    if (out / "vllm").exists():
        raise DeepstackError(
            f"{out} holds a vllm/ folder: the tests would import it instead of "
            "the installed vLLM",
            f"remove {out}; verify extracts the release's tests again",
        )
    progress(f"the release's tests: {out / 'tests'}")
    return out


def is_release_test_file(relpath: str) -> bool:
    return relpath.startswith("tests/") or relpath in RELEASE_TEST_FILES


def wants_tests(targets: Targets, patch_ids: Sequence[str], kind: str) -> bool:
    """Whether any of ``patch_ids`` lists ``{kind}_tests`` (else no download)."""
    rows = [targets.patches.get(patch_id) for patch_id in patch_ids]
    return any(row is not None and getattr(row, f"{kind}_tests") for row in rows)


def environment_for_tests(
    installed: InstalledVllm, plugin_dir: Path, *, gpu: bool
) -> dict[str, str]:
    """The process environment of the release's tests: no path of ours ahead
    of the interpreter's own (the user's PYTHONPATH is kept: it is part of
    what that interpreter imports), plus the check plugin and what it expects."""
    from deepstack_patch.proof.platform_plugin import ENV_VAR as PLATFORM_ENV_VAR

    env = subprocess_env(installed.site_packages)
    user_path = os.environ.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (user_path, str(plugin_dir)) if p)
    env["PYTEST_PLUGINS"] = installed_check.MODULE
    env[installed_check.ENV_VAR] = str(installed.site_packages / "vllm/__init__.py")
    if gpu:
        # The GPU run is on the platform vLLM detects, never verify's CPU one.
        env.pop(PLATFORM_ENV_VAR, None)
    return env


def run_release_tests(
    installed: InstalledVllm,
    tests_root: Path,
    selected: dict[str, list[str]],
    absent: list[str],
    *,
    gpu: bool = False,
) -> TestRun:
    """pytest in the installed vLLM's interpreter, rooted at the release's tests."""
    with tempfile.TemporaryDirectory(prefix="deepstack-installed-") as scratch:
        shutil.copyfile(
            installed_check.__file__, Path(scratch) / f"{installed_check.MODULE}.py"
        )
        return run_pytest(
            installed.python,
            tests_root,
            selected,
            absent,
            env=environment_for_tests(installed, Path(scratch), gpu=gpu),
            gpu=gpu,
        )


def installed_gpu_stage(
    installed: InstalledVllm,
    tests_root: Path | None,
    targets: Targets,
    patch_ids: Sequence[str],
    progress: Progress,
    *,
    detect: Callable[[], tuple[bool, str]] = detect_gpu,
) -> GpuStage:
    """The release's ``gpu_tests`` on the installed vLLM, or why they were not run."""
    stage = GpuStage(requested=True, status="skipped")
    selected, absent = (
        select_tests(tests_root, targets, patch_ids, "gpu", installed.version)
        if tests_root is not None
        else ({}, [])
    )
    stage.run = TestRun(command=[], selected=selected, absent=absent)
    if not selected:
        stage.reason = "no gpu_tests in targets.toml for " + (
            ", ".join(patch_ids) or "the selected patches"
        )
        return stage
    present, found = detect()
    if not present:
        stage.reason = found
        return stage
    assert tests_root is not None  # selected is not empty
    progress(f"GPU tests on {found} with {installed.python}")
    stage.run = run_release_tests(installed, tests_root, selected, absent, gpu=True)
    stage.status, stage.reason = "ran", found
    return stage


def prove_installed(
    installed: InstalledVllm,
    env: ProofEnv,
    verdicts: Sequence[PatchVerdict],
    provable: Sequence[Patch],
    targets: Targets,
    *,
    gpu: bool = False,
    jobs: int = 2,
    progress: Progress = lambda line: None,
) -> tuple[TestRun, GpuStage]:
    """The proofs of ``provable`` and the release's tests, in ``env``.

    Each verdict gets its proof and its tests; returns the test run and the
    GPU stage (``verify.py`` builds the report).
    """
    root, version = installed.site_packages, installed.version
    to_prove = [patch.id for patch in provable if has_proof(patch)]
    applicable = [patch.id for patch in provable]
    needs_tests = wants_tests(targets, applicable, "cpu") or (
        gpu and wants_tests(targets, applicable, "gpu")
    )
    tests_root = release_tests(version, progress) if needs_tests else None
    tests, absent = (
        select_tests(tests_root, targets, applicable, "cpu", version)
        if tests_root is not None
        else ({}, [])
    )
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        progress(f"proofs on {root}: {', '.join(to_prove) or 'none'}")
        proofs_future = pool.submit(
            run_proofs, env, root, to_prove, sources=patch_sources(provable)
        )
        if tests:
            progress(f"{len(tests)} release test selection(s) with pytest")
        cpu_future = pool.submit(
            run_release_tests, installed, tests_root or root, tests, absent
        )
        proofs, cpu_run = proofs_future.result(), cpu_future.result()
    for verdict in verdicts:
        verdict.proof = proofs.get(verdict.patch.id, verdict.proof)
        verdict.tests = cpu_run.cases_of(verdict.patch.id)
    stage = (
        installed_gpu_stage(installed, tests_root, targets, applicable, progress)
        if gpu
        else GpuStage(False)
    )
    return cpu_run, stage

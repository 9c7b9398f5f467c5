"""The GPU stage: the tree's ``gpu_tests`` under the official wheel's kernels.

A source tree has no compiled kernels, so the stage overlays the patched
tree's Python files with the compiled files of the ``vllm==VERSION`` wheel
(what ``VLLM_USE_PRECOMPILED=1`` does), in a GPU environment verify builds,
or skips with the reason when there is no GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.targets import Targets
from deepstack_patch.engine.tree import VllmTree, link_copy
from deepstack_patch.proof.tree_tests import TestRun, run_pytest, select_tests

Progress = Callable[[str], None]


def detect_gpu(which: Callable[[str], str | None] = shutil.which) -> tuple[bool, str]:
    """Whether a CUDA GPU is here, and what was found or why not."""
    smi = which("nvidia-smi")
    if smi is None:
        return False, "no NVIDIA GPU: nvidia-smi is not on PATH"
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"no NVIDIA GPU: {smi} -L failed: {exc}"
    gpus = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    if done.returncode != 0 or not gpus:
        detail = (done.stderr or done.stdout).strip().splitlines()[:1]
        return False, f"no NVIDIA GPU: {smi} -L found none ({' '.join(detail)})"
    return True, "; ".join(gpus)


def precompiled_files(record: str) -> list[str]:
    """The compiled files a vLLM wheel's RECORD lists under ``vllm/``.

    These are what ``VLLM_USE_PRECOMPILED=1`` takes from the wheel into a
    source tree: extension modules and shared libraries, never Python files.
    """
    files = []
    for line in record.splitlines():
        path = line.split(",", 1)[0]
        name = path.rsplit("/", 1)[-1]
        if path.startswith("vllm/") and (
            name.endswith((".so", ".pyd")) or ".so." in name
        ):
            files.append(path)
    return sorted(files)


def check_wheel_version(installed: str, tree_version: str) -> None:
    if installed != tree_version:
        raise DeepstackError(
            f"the GPU environment's vLLM wheel is {installed}, the tree is "
            f"{tree_version}: compiled extensions must come from the same release",
            "verify builds the GPU environment with vllm==<tree version>; remove "
            "the environment folder it names to rebuild it",
        )


def overlay_tree(
    tree: Path, site_packages: Path, files: Sequence[str], dest: Path
) -> Path:
    """The patched tree with the wheel's compiled files added, in ``dest``.

    Hard links where possible (the tree is never written); the compiled files
    are copied in where the wheel keeps them.
    """
    if dest.exists():
        shutil.rmtree(dest)
    link_copy(tree, dest)
    for relpath in files:
        target = dest / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(site_packages / relpath, target)
    return dest


@dataclass
class GpuStage:
    requested: bool
    status: str = "not-requested"  # not-requested, skipped, ran
    reason: str = ""
    run: TestRun | None = None

    @property
    def ok(self) -> bool:
        if not self.requested:
            return True
        return self.status == "ran" and self.run is not None and self.run.ok

    def json(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "status": self.status,
            "reason": self.reason,
            "tests": self.run.json() if self.run else None,
        }


def gpu_stage(
    tree: VllmTree,
    targets: Targets,
    patch_ids: Sequence[str],
    progress: Progress,
    *,
    detect: Callable[[], tuple[bool, str]] = detect_gpu,
) -> GpuStage:
    selected, absent = select_tests(tree.root, targets, patch_ids, "gpu", tree.version)
    stage = GpuStage(requested=True)
    if not selected:
        stage.status, stage.reason = (
            "skipped",
            "no gpu_tests in targets.toml for "
            + (", ".join(patch_ids) or "the selected patches"),
        )
        stage.run = TestRun(command=[], selected=selected, absent=absent)
        return stage
    present, found = detect()
    if not present:
        stage.status, stage.reason = "skipped", found
        stage.run = TestRun(command=[], selected=selected, absent=absent)
        return stage
    from deepstack_patch.proof.envs import ensure_env, gpu_requirements

    env = ensure_env("gpu", gpu_requirements(tree.version), progress)
    site, installed, record = _wheel_info(env.python)
    check_wheel_version(installed, tree.version)
    with tempfile.TemporaryDirectory(prefix="deepstack-gpu-") as scratch:
        overlay = overlay_tree(
            tree.root, site, precompiled_files(record), Path(scratch) / "tree"
        )
        run_env = dict(os.environ, PYTHONPATH=str(overlay), PYTHONDONTWRITEBYTECODE="1")
        progress(f"GPU tests on {found}")
        stage.run = run_pytest(
            env.python, overlay, selected, absent, env=run_env, gpu=True
        )
    stage.status, stage.reason = "ran", found
    return stage


def _wheel_info(python: Path) -> tuple[Path, str, str]:
    script = (
        "import json, importlib.metadata as m, sysconfig; d = m.distribution('vllm');"
        "print(json.dumps([sysconfig.get_paths()['purelib'], d.version,"
        " d.read_text('RECORD') or '']))"
    )
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True)
    if out.returncode != 0:
        raise DeepstackError(
            f"{python}: cannot read the installed vLLM wheel: {out.stderr.strip()}",
            "remove that environment folder so verify rebuilds it",
        )
    site, version, record = json.loads(out.stdout)
    return Path(site), version, record

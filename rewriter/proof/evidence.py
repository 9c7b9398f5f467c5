"""GPU evidence: each fix's symptom measured on a device, before and after.

``verify --gpu-evidence --against-pristine`` measures, for every selected
patch that the pristine release needs and that has an ``evidence.py`` next
to its proof, the symptom users reported (a recompilation's wall time, a
compiled step's time and the rows it sees, a compiled output's error, a
padded step rejected, a startup error) on the pristine tree and on the tree,
with the trees' own code compiled from their files (``measure.py``), in one
subprocess of an interpreter that has torch (``evidence_runner.py``). A
companion is measured on the pristine tree with the fixes that name it
applied alone, as verify proves it (``baselines.companion_baselines``).

With ``--device cuda`` and no GPU the run is skipped with the reason: it is
not a failure, the measurements need hardware this machine lacks.
``--device cpu`` runs the same measurements on the CPU, labelled CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.proof import runner
from deepstack_patch.proof.envs import ProofEnv
from deepstack_patch.proof.verdicts import PatchVerdict

Progress = Callable[[str], None]

#: The whole run's limit: the CPU run of one release takes a few minutes.
TIMEOUT_S = 1800
DEVICES = ("cuda", "cpu")


@dataclass
class EvidenceRow:
    """One patch: its measurement on the pristine tree and on the tree."""

    patch: Patch
    state: PatchState
    pristine_state: PatchState | None
    #: The fixes applied alone to the pristine tree it was measured on.
    pristine_baseline: tuple[str, ...] = ()
    pristine: dict[str, Any] | None = None
    patched: dict[str, Any] | None = None

    @property
    def problems(self) -> list[str]:
        """Why this row does not show the fix: the symptom on the pristine
        side and its absence on the patched side are both required."""
        problems = []
        for side, result, wanted in (
            ("pristine", self.pristine, True),
            ("patched", self.patched, False),
        ):
            if result is None:
                problems.append(f"no {side} measurement")
            elif result["status"] != "measured":
                problems.append(f"{side}: {result.get('error', result['status'])}")
            elif result["measurement"]["symptom"] is not wanted:
                shown = "shows" if not wanted else "does not show"
                problems.append(f"the {side} tree {shown} the symptom")
        if self.state is not PatchState.APPLIED:
            problems.append(f"the tree's state is {self.state.value}, not applied")
        return problems

    @property
    def ratios(self) -> dict[str, float]:
        """Pristine median over patched median, per timing both sides have."""
        if not (self.pristine and self.patched):
            return {}
        before = self.pristine.get("measurement", {}).get("figures", {})
        after = self.patched.get("measurement", {}).get("figures", {})
        ratios = {}
        for name, figure in before.items():
            other = after.get(name)
            if (
                isinstance(figure, dict)
                and isinstance(other, dict)
                and other.get("median_ms")
            ):
                ratios[name] = round(figure["median_ms"] / other["median_ms"], 2)
        return ratios


@dataclass
class EvidenceReport:
    tree: VllmTree
    pristine: VllmTree | None
    device: str
    #: ``measured`` or ``skipped`` (no GPU for ``--device cuda``).
    status: str
    reason: str = ""
    python: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    rows: list[EvidenceRow] = field(default_factory=list)
    log: str = ""
    seconds: float = 0.0
    measured_at: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "skipped" or all(not r.problems for r in self.rows)

    @property
    def exit_code(self) -> int:
        """0 skipped or every fix shown; 1 a row does not show it; 2 drifted."""
        if any(r.state is PatchState.DRIFTED for r in self.rows):
            return 2
        return 0 if self.ok else 1


def has_evidence(patch: Patch) -> bool:
    """Whether the patch's package has an ``evidence.py`` with ``measure``."""
    return importlib.util.find_spec(f"{type(patch).__module__}.evidence") is not None


def gpu_evidence(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    *,
    pristine: VllmTree | None,
    device: str,
    python: Path | None = None,
    progress: Progress = lambda line: None,
    building: Progress | None = None,
) -> EvidenceReport:
    """Everything ``verify --gpu-evidence`` does short of writing the output."""
    from deepstack_patch.proof.baselines import companion_baselines
    from deepstack_patch.proof.gpu import detect_gpu

    started = time.monotonic()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if pristine is None:
        raise DeepstackError(
            "--gpu-evidence measures each fix before and after: it needs the "
            "pristine tree",
            "add --against-pristine (and --pristine PATH for a tree whose "
            "version is not a release)",
        )
    if device == "cuda":
        found, reason = detect_gpu()
        if not found:
            return EvidenceReport(
                tree, pristine, device, "skipped", reason, measured_at=stamp
            )
    env = _measuring_env(python, building or progress)
    if device == "cuda":
        usable, reason = _torch_cuda(env)
        if not usable:
            raise DeepstackError(
                f"a GPU is here, but {env.python} cannot use it: {reason}",
                "give an interpreter whose torch has CUDA with --python (e.g. a "
                "venv made with --system-site-packages over the machine's torch)",
            )
    verdicts = _verdicts(tree, series, selected, pristine)
    rows = [
        EvidenceRow(v.patch, v.state, v.pristine_state)
        for v in verdicts
        if v.pristine_state is PatchState.NEEDED and has_evidence(v.patch)
    ]
    measured = [r.patch.id for r in rows]
    with tempfile.TemporaryDirectory(prefix="deepstack-evidence-") as scratch:
        baselines = companion_baselines(
            pristine, series, verdicts, Path(scratch), measured
        )
        on_baselines = {i for baseline in baselines for i in baseline.proves}
        on_pristine = [i for i in measured if i not in on_baselines]
        for row in rows:
            for baseline in baselines:
                if row.patch.id in baseline.proves:
                    row.pristine_baseline = baseline.applied
        runs = [("pristine", pristine.root, on_pristine)]
        runs += [("pristine", b.tree.root, list(b.proves)) for b in baselines]
        runs.append(("patched", tree.root, measured))
        progress(
            f"measuring on {device} with {env.python}: {', '.join(measured) or 'none'}"
        )
        output, log = _run(env, device, runs, Path(scratch), progress)
    for result in output.get("results", []):
        for row in rows:
            if row.patch.id == result["id"]:
                setattr(row, result["side"], result)
    return EvidenceReport(
        tree,
        pristine,
        device,
        "measured",
        python=str(env.python),
        environment=output.get("environment", {}),
        rows=rows,
        log=log,
        seconds=round(time.monotonic() - started, 1),
        measured_at=stamp,
    )


def _verdicts(
    tree: VllmTree, series: Sequence[Patch], selected: set[str], pristine: VllmTree
) -> list[PatchVerdict]:
    """Each selected patch's state on the tree and on the pristine tree."""
    from deepstack_patch.engine.plan import plan_tree

    after = plan_tree(tree, series, selected, rewrite=False)
    before = plan_tree(pristine, series, selected, rewrite=False)
    return [
        PatchVerdict(
            r.patch, r.state, r.reason, pristine_state=before.report(r.patch.id).state
        )
        for r in after.reports
        if r.selected
    ]


def _measuring_env(python: Path | None, building: Progress) -> ProofEnv:
    """``--python``, which needs torch only, or the managed proof environment."""
    from deepstack_patch.proof.envs import CPU_REQUIREMENTS, ensure_env

    if python is None:
        return ensure_env("cpu", CPU_REQUIREMENTS, building)
    if not python.exists():
        raise DeepstackError(
            f"--python {python}: no such interpreter",
            "give the python of an environment that has torch",
        )
    return ProofEnv(python)


def _torch_cuda(env: ProofEnv) -> tuple[bool, str]:
    probe = subprocess.run(
        [
            str(env.python),
            "-c",
            "import torch; print(torch.__version__, torch.version.cuda, "
            "torch.cuda.is_available())",
        ],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return False, f"torch does not import ({probe.stderr.strip()[-300:]})"
    version, cuda, available = probe.stdout.split()
    if available != "True":
        return False, f"torch {version} (CUDA {cuda}) sees no CUDA device"
    return True, ""


def _run(
    env: ProofEnv,
    device: str,
    runs: list[tuple[str, Path, list[str]]],
    scratch: Path,
    progress: Progress,
) -> tuple[dict[str, Any], str]:
    """One subprocess measures every run; its results and its log."""
    output = scratch / "evidence.json"
    request = {
        "device": device,
        "package_dir": str(Path(__file__).parent.parent),
        "patches_dir": str(runner.patches_dir()),
        "output": str(output),
        "runs": [
            {"side": side, "tree": str(root), "patch_ids": ids}
            for side, root, ids in runs
            if ids
        ],
    }
    request_file = scratch / "request.json"
    request_file.write_text(json.dumps(request))
    script = Path(__file__).with_name("evidence_runner.py")
    environ = dict(os.environ)
    environ.pop("PYTHONPATH", None)  # no tree on the path: nothing imports vLLM
    try:
        done = subprocess.run(
            [str(env.python), str(script), str(request_file)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=environ,
        )
        log = done.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"timed out after {TIMEOUT_S} s\n{exc.stderr or ''}"
    if not output.exists():
        raise DeepstackError(
            f"the measurements produced no results ({env.python})",
            "its log ends:\n" + log[-2000:],
        )
    return json.loads(output.read_text()), log

"""Prove the fixes in a tree: each patch's proof, the tree's own tests, GPU tests.

Every check runs in a subprocess of a proof environment (see ``envs.py``)
with the tree first on ``sys.path`` and vLLM's CPU platform selected by
deepstack-patch's platform plugin:

- the proofs of all selected patches, in one process per tree (importing
  vLLM takes seconds), through ``proof/runner.py``;
- the tree's ``cpu_tests`` from targets.toml, with pytest writing a JUnit XML
  file that is parsed here (never pytest's stdout);
- with a pristine tree, the proofs again on it: fail-to-pass;
- with ``--gpu``, the tree's ``gpu_tests`` under the official wheel's compiled
  extensions, or a skip with the reason when there is no GPU.

Independent subprocesses run in parallel. Nothing here names a fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.targets import Targets
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.proof.envs import ProofEnv, subprocess_env

Progress = Callable[[str], None]

#: Default limit for one proof process or one pytest run.
TIMEOUT_S = 1800


def has_proof(patch: Patch) -> bool:
    return type(patch).prove is not Patch.prove


# -- proofs -------------------------------------------------------------------


@dataclass
class ProofResult:
    """``passed``, ``failed`` (the proof's AssertionError: the fix's behaviour
    is absent), ``error`` (the proof could not judge), or ``missing``."""

    patch_id: str
    status: str
    message: str = ""
    seconds: float = 0.0

    def json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "seconds": self.seconds}


def runner_path() -> Path:
    return Path(__file__).with_name("runner.py")


def proof_request(tree: Path, patch_ids: Sequence[str], output: Path) -> dict:
    from deepstack_patch import patches

    return {
        "tree": str(tree),
        "patch_ids": list(patch_ids),
        "package_dir": str(Path(__file__).parent.parent),
        "patches_dir": str(Path(patches.__file__).parent),
        "output": str(output),
    }


def proof_command(env: ProofEnv, request_file: Path) -> list[str]:
    return [str(env.python), str(runner_path()), str(request_file)]


def run_proofs(
    env: ProofEnv,
    tree: Path,
    patch_ids: Sequence[str],
    *,
    timeout: float = TIMEOUT_S,
) -> dict[str, ProofResult]:
    """Run the proofs of ``patch_ids`` on ``tree`` in one subprocess."""
    if not patch_ids:
        return {}
    with tempfile.TemporaryDirectory(prefix="deepstack-proof-") as scratch:
        request_file = Path(scratch) / "request.json"
        output = Path(scratch) / "results.json"
        request_file.write_text(json.dumps(proof_request(tree, patch_ids, output)))
        try:
            done = subprocess.run(
                proof_command(env, request_file),
                env=subprocess_env(tree),
                cwd=scratch,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            log, code = done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            log, code = _text(exc.stderr) + f"\ntimed out after {timeout:.0f} s", -1
        results = json.loads(output.read_text()) if output.is_file() else []
    found = {}
    for r in results:
        # A failing proof shows its own notes (e.g. a fallback it took).
        notes = [] if r["status"] == "passed" else r.get("log", "").splitlines()
        message = "\n".join([r["message"], *notes]).strip()
        found[r["id"]] = ProofResult(r["id"], r["status"], message, r["seconds"])
    for patch_id in patch_ids:
        if patch_id not in found:
            tail = "\n".join(log.strip().splitlines()[-15:])
            found[patch_id] = ProofResult(
                patch_id,
                "error",
                f"the proof process ended (exit code {code}) before this proof "
                f"reported:\n{tail}",
            )
    return found


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


# -- the tree's tests -----------------------------------------------------------


@dataclass
class TestCase:
    """One test case from a JUnit XML file."""

    __test__ = False  # not a pytest test class

    classname: str
    name: str
    outcome: str  # passed, failed, error, skipped
    message: str = ""
    seconds: float = 0.0
    file: str = ""

    @property
    def nodeid(self) -> str:
        module = self.file or self.classname
        parts = self.classname.split(".")
        # classname is "pkg.module" or "pkg.module.Class"; keep the class part.
        klass = [p for p in parts if p[:1].isupper()]
        return "::".join([module, *klass[-1:], self.name])

    def json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "outcome": self.outcome,
            "message": self.message,
            "seconds": self.seconds,
        }


@dataclass
class TestRun:
    """One pytest run: its command, its cases, and the tests it could not run."""

    __test__ = False

    command: list[str]
    selected: dict[str, list[str]] = field(default_factory=dict)  # nodeid -> ids
    absent: list[str] = field(default_factory=list)
    cases: list[TestCase] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return sum(case.outcome == outcome for case in self.cases)

    @property
    def ok(self) -> bool:
        return not self.error and not any(
            c.outcome in ("failed", "error") for c in self.cases
        )

    def cases_of(self, patch_id: str) -> list[TestCase]:
        mine = [n for n, ids in self.selected.items() if patch_id in ids]
        return [c for c in self.cases if any(_belongs(c, n) for n in mine)]

    def json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "selected": sorted(self.selected),
            "absent": self.absent,
            "tests": len(self.cases),
            "passed": self.count("passed"),
            "failed": self.count("failed"),
            "errors": self.count("error"),
            "skipped": self.count("skipped"),
            "error": self.error,
            "seconds": self.seconds,
            "cases": [c.json() for c in self.cases],
        }


def _belongs(case: TestCase, nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    if case.file != path.split(" ")[0]:
        return False
    return not rest or case.nodeid.split("::", 1)[1].startswith(rest)


def select_tests(
    tree: Path,
    targets: Targets,
    patch_ids: Sequence[str],
    kind: str,
    version: str = "",
) -> tuple[dict[str, list[str]], list[str]]:
    """The ``{kind}_tests`` of the patches that exist in ``tree``, and the rest.

    A listed test whose file this release lacks (it came later), or that
    targets.toml limits to other releases, is returned in the second list
    with the reason: reported, never run and never counted as passed.
    """
    selected: dict[str, list[str]] = {}
    absent: list[str] = []
    for patch_id in patch_ids:
        rows = targets.patches.get(patch_id)
        if rows is None:
            continue
        for nodeid in getattr(rows, f"{kind}_tests"):
            runs, why = rows.runs_on(nodeid, version) if version else (True, "")
            if not (tree / nodeid.split("::")[0]).is_file():
                why = "not in this release"
            if not why:
                selected.setdefault(nodeid, []).append(patch_id)
            elif f"{nodeid}: {why}" not in absent:
                absent.append(f"{nodeid}: {why}")
    return selected, absent


def pytest_command(
    python: Path, tree: Path, nodeids: Sequence[str], junit: Path, *, gpu: bool = False
) -> list[str]:
    """pytest on the tree's own tests, reporting to ``junit``.

    On CPU the tree's conftest.py is not loaded (``--noconftest``): it imports
    much of vLLM's GPU stack. The GPU stage runs in an environment with the
    full wheel, so it keeps the tree's conftest and fixtures.
    """
    command = [str(python), "-m", "pytest"]
    command += ["-p", "no:cacheprovider", "-o", "addopts=", "-rs", "-q"]
    if not gpu:
        command.append("--noconftest")
    command += ["--rootdir", str(tree), f"--junit-xml={junit}", *nodeids]
    return command


def parse_junit(path: Path, tree: Path | None = None) -> list[TestCase]:
    """The test cases in a pytest JUnit XML file (xunit1 or xunit2)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise DeepstackError(f"{path}: cannot read pytest's JUnit XML: {exc}") from None
    cases = []
    for element in root.iter("testcase"):
        outcome, message = "passed", ""
        for child, label in (
            ("failure", "failed"),
            ("error", "error"),
            ("skipped", "skipped"),
        ):
            found = element.find(child)
            if found is not None:
                outcome = label
                message = found.get("message") or (found.text or "").strip()
                break
        classname = element.get("classname", "")
        cases.append(
            TestCase(
                classname=classname,
                name=element.get("name", ""),
                outcome=outcome,
                message=message,
                seconds=float(element.get("time") or 0),
                file=element.get("file") or _file_of(classname, tree),
            )
        )
    return cases


def _file_of(classname: str, tree: Path | None) -> str:
    """``tests.v1.test_x.TestY`` -> ``tests/v1/test_x.py``.

    With the tree at hand, the longest prefix that is a file; without it, the
    classname less a trailing class name (capitalised, by pytest convention).
    """
    parts = classname.split(".")
    if tree is None:
        if len(parts) > 1 and parts[-1][:1].isupper():
            parts = parts[:-1]
        return "/".join(parts) + ".py"
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (tree / candidate).is_file():
            return candidate
    return ""


def run_pytest(
    python: Path,
    tree: Path,
    selected: dict[str, list[str]],
    absent: list[str],
    *,
    env: dict[str, str],
    gpu: bool = False,
    timeout: float = TIMEOUT_S,
) -> TestRun:
    nodeids = sorted(selected)
    with tempfile.TemporaryDirectory(prefix="deepstack-pytest-") as scratch:
        junit = Path(scratch) / "junit.xml"
        command = pytest_command(python, tree, nodeids, junit, gpu=gpu)
        run = TestRun(command=command, selected=selected, absent=absent)
        if not nodeids:
            return run
        started = time.monotonic()
        try:
            done = subprocess.run(
                command,
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            output = _text(exc.stdout) + f"\ntimed out after {timeout:.0f} s"
            code = -1
        run.seconds = round(time.monotonic() - started, 1)
        if junit.is_file():
            run.cases = parse_junit(junit, tree)
        tail = "\n".join(output.strip().splitlines()[-20:])
        if not run.cases:
            run.error = f"pytest ran no test (exit code {code}):\n{tail}"
        elif code not in (0, 1):
            # 2 interrupted, 3 internal error, 4 usage error: results incomplete.
            run.error = f"pytest stopped with exit code {code}:\n{tail}"
    return run


# -- the GPU stage ---------------------------------------------------------------


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

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(
        tree,
        dest,
        copy_function=link,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", "__pycache__"),
    )
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


# -- one verify run ---------------------------------------------------------------


@dataclass
class PatchVerdict:
    patch: Patch
    state: PatchState
    reason: str
    proof: ProofResult | None = None
    pristine_state: PatchState | None = None
    pristine_proof: ProofResult | None = None
    tests: list[TestCase] = field(default_factory=list)

    @property
    def fail_to_pass(self) -> str:
        """``proven``, ``fixed-upstream``, ``not-proven`` or ``""`` (not asked)."""
        if self.pristine_state is None or self.state is PatchState.NOT_APPLICABLE:
            return ""
        after = self.proof is not None and self.proof.status == "passed"
        before = self.pristine_proof.status if self.pristine_proof else ""
        if self.pristine_state is PatchState.APPLIED and before == "passed" and after:
            return "fixed-upstream"
        if self.pristine_state is PatchState.NEEDED and before == "failed" and after:
            return "proven"
        return "not-proven"

    @property
    def problems(self) -> list[str]:
        """Why this patch's checks did not pass; empty when they all did."""
        if self.state is PatchState.NOT_APPLICABLE:
            return []
        found = []
        if self.state is PatchState.DRIFTED:
            found.append(f"drifted: {self.reason}")
        elif self.state is PatchState.NEEDED:
            found.append("not applied to this tree: run `deepstack-patch apply` first")
        if self.proof is None or self.proof.status != "passed":
            status = self.proof.status if self.proof else "not run"
            found.append(f"proof {status}")
        if self.fail_to_pass == "not-proven":
            before = self.pristine_proof.status if self.pristine_proof else "not run"
            found.append(f"fail-to-pass not shown (pristine proof {before})")
        bad = [t for t in self.tests if t.outcome in ("failed", "error")]
        if bad:
            found.append(f"{len(bad)} tree test(s) failed")
        return found

    def json(self) -> dict[str, Any]:
        return {
            "id": self.patch.id,
            "title": self.patch.title,
            "state": self.state.value,
            "reason": self.reason,
            "proof": self.proof.json() if self.proof else None,
            "pristine_state": self.pristine_state.value
            if self.pristine_state
            else None,
            "pristine_proof": self.pristine_proof.json()
            if self.pristine_proof
            else None,
            "fail_to_pass": self.fail_to_pass or None,
            "tree_tests": [t.nodeid for t in self.tests],
            "ok": not self.problems,
            "problems": self.problems,
        }


@dataclass
class VerifyReport:
    tree: VllmTree
    env: ProofEnv
    verdicts: list[PatchVerdict]
    cpu_tests: TestRun
    gpu: GpuStage
    pristine: VllmTree | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            all(not v.problems for v in self.verdicts)
            and self.cpu_tests.ok
            and self.gpu.ok
        )

    @property
    def drifted(self) -> bool:
        return any(v.state is PatchState.DRIFTED for v in self.verdicts)


def verify_tree(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    env: ProofEnv,
    targets: Targets,
    *,
    pristine: VllmTree | None = None,
    gpu: bool = False,
    jobs: int = 2,
    progress: Progress = lambda line: None,
) -> VerifyReport:
    """Run every selected check on ``tree`` (and its pristine release)."""
    started = time.monotonic()
    plan = plan_tree(tree, series, selected, rewrite=False)
    verdicts = [
        PatchVerdict(r.patch, r.state, r.reason) for r in plan.reports if r.selected
    ]
    if pristine is not None:
        before = plan_tree(pristine, series, selected, rewrite=False)
        for verdict in verdicts:
            verdict.pristine_state = before.report(verdict.patch.id).state

    def provable(state: PatchState | None) -> bool:
        return state in (PatchState.NEEDED, PatchState.APPLIED)

    for verdict in verdicts:
        if provable(verdict.state) and not has_proof(verdict.patch):
            verdict.proof = ProofResult(
                verdict.patch.id,
                "missing",
                f"{type(verdict.patch).__name__} has no prove() method",
            )
    to_prove = [
        v.patch.id for v in verdicts if provable(v.state) and has_proof(v.patch)
    ]
    before_ids = [
        v.patch.id
        for v in verdicts
        if provable(v.pristine_state) and has_proof(v.patch)
    ]
    applicable = [v.patch.id for v in verdicts if provable(v.state)]
    tests, absent = select_tests(tree.root, targets, applicable, "cpu", tree.version)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        progress(f"proofs on {tree.root}: {', '.join(to_prove) or 'none'}")
        after = pool.submit(run_proofs, env, tree.root, to_prove)
        if pristine is not None:
            progress(f"proofs on pristine {pristine.root}: {', '.join(before_ids)}")
        before_future = (
            pool.submit(run_proofs, env, pristine.root, before_ids)
            if pristine is not None
            else None
        )
        if tests:
            progress(f"{len(tests)} tree test selection(s) with pytest")
        test_future = pool.submit(
            run_pytest,
            env.python,
            tree.root,
            tests,
            absent,
            env=subprocess_env(tree.root),
        )
        proofs = after.result()
        proofs_before = before_future.result() if before_future else {}
        cpu_run = test_future.result()

    for verdict in verdicts:
        verdict.proof = proofs.get(verdict.patch.id, verdict.proof)
        verdict.pristine_proof = proofs_before.get(verdict.patch.id)
        verdict.tests = cpu_run.cases_of(verdict.patch.id)

    stage = gpu_stage(tree, targets, applicable, progress) if gpu else GpuStage(False)
    return VerifyReport(
        tree=tree,
        env=env,
        verdicts=verdicts,
        cpu_tests=cpu_run,
        gpu=stage,
        pristine=pristine,
        seconds=round(time.monotonic() - started, 1),
    )


def report_json(report: VerifyReport) -> dict[str, Any]:
    from deepstack_patch.output.report import SCHEMA_VERSION, tree_json

    return {
        "schema": SCHEMA_VERSION,
        "command": "verify",
        "tree": tree_json(report.tree),
        "pristine": tree_json(report.pristine) if report.pristine else None,
        "environment": {
            "python": str(report.env.python),
            "managed": report.env.managed,
            "path": str(report.env.root) if report.env.root else None,
            "key": report.env.key or None,
        },
        "patches": [v.json() for v in report.verdicts],
        "tree_tests": report.cpu_tests.json(),
        "gpu": report.gpu.json(),
        "seconds": report.seconds,
        "ok": report.ok,
    }


def junit_xml(report: VerifyReport) -> str:
    """Every check as a JUnit test case, for CI dashboards."""
    suite = ET.Element("testsuite", name="deepstack-patch verify")
    version = report.tree.version

    def case(classname: str, name: str, seconds: float = 0.0) -> ET.Element:
        return ET.SubElement(
            suite, "testcase", classname=classname, name=name, time=f"{seconds:.2f}"
        )

    for verdict in report.verdicts:
        pid = verdict.patch.id
        if verdict.state is PatchState.NOT_APPLICABLE:
            element = case(f"proof.{version}", pid)
            ET.SubElement(
                element, "skipped", message=f"not-applicable: {verdict.reason}"
            )
            continue
        proof = verdict.proof
        element = case(f"proof.{version}", pid, proof.seconds if proof else 0.0)
        # Fail-to-pass and tree tests have test cases of their own below.
        own = [
            p
            for p in verdict.problems
            if not p.startswith("fail-to-pass") and "tree test(s)" not in p
        ]
        if own:
            failed = proof is not None and proof.status in ("failed", "passed")
            sub = ET.SubElement(
                element, "failure" if failed else "error", message="; ".join(own)
            )
            sub.text = proof.message if proof else ""
        if verdict.pristine_state is not None and verdict.fail_to_pass:
            element = case(f"fail-to-pass.{version}", pid)
            if verdict.fail_to_pass == "not-proven":
                before = verdict.pristine_proof
                sub = ET.SubElement(
                    element,
                    "failure",
                    message=f"pristine proof {before.status if before else 'not run'}",
                )
                sub.text = before.message if before else ""
    for label, run in (("tree", report.cpu_tests), ("gpu", report.gpu.run)):
        if run is None:
            continue
        for test in run.cases:
            element = case(f"{label}.{test.classname}", test.name, test.seconds)
            if test.outcome in ("failed", "error", "skipped"):
                tag = {"failed": "failure"}.get(test.outcome, test.outcome)
                ET.SubElement(element, tag, message=test.message[:2000])
        if run.error:
            element = case(f"{label}.pytest", "run")
            ET.SubElement(element, "error", message=run.error[:2000])
    if report.gpu.requested and report.gpu.status == "skipped":
        element = case("gpu", "stage")
        ET.SubElement(element, "skipped", message=report.gpu.reason)
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    for tag, attr in (
        ("failure", "failures"),
        ("error", "errors"),
        ("skipped", "skipped"),
    ):
        suite.set(attr, str(sum(c.find(tag) is not None for c in cases)))
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        + ET.tostring(suite, encoding="unicode")
        + "\n"
    )

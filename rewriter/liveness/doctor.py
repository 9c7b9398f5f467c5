"""Is the fix live where vLLM runs? The plumbing of ``deepstack-patch doctor``.

Everything about the interpreter is asked of the interpreter itself, in a
subprocess running :mod:`.probe` (which vllm ``find_spec`` resolves, its
distribution, the file each target module loads from, its bytecode), without
importing vLLM unless ``import_check`` is set. The patches' states are read
here, from the source that interpreter resolves, by the same plan ``status``
runs. A fix is live when its code is in that source, the module loads from
that source, and the bytecode the interpreter would use is that source's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.installed import PYTHON_HINT, interpreter_error
from deepstack_patch.engine.protocol import Patch, PatchReport, PatchState
from deepstack_patch.engine.tree import VllmTree, detect_version
from deepstack_patch.liveness import probe
from deepstack_patch.liveness.change_record import (
    ChangeRecord,
    UnreadableRecord,
    read_record,
)


@dataclass
class Verdict:
    """One patch in the vLLM that interpreter runs."""

    report: PatchReport
    live: bool
    #: False where a patch not being live is no failure (not needed, skipped).
    counts: bool
    reasons: list[str] = field(default_factory=list)
    #: ``--import`` could not import a module holding the fix in that
    #: interpreter: the files are patched, whether the code runs is unknown.
    import_failed: bool = False


@dataclass
class Diagnosis:
    python: str
    python_version: str
    package: Path  # the vllm/ folder the import system resolves
    version: str
    installed_as: str
    distribution: dict[str, Any] | None
    shadowing: list[str]
    modules: dict[str, dict[str, Any]]
    verdicts: list[Verdict]
    record: ChangeRecord | None
    changed_since: list[str]
    notes: list[str]
    fix_command: str
    imported: list[dict[str, Any]] | None = None
    #: The tree the patches were judged in (the folder holding vllm/).
    tree: VllmTree | None = None

    @property
    def live(self) -> bool:
        return all(v.live or not v.counts for v in self.verdicts)

    @property
    def outcome(self) -> str:
        """``live``; ``not-live`` (applying helps); or ``cannot-import``: every
        fix that is not shown live is in the files, but that interpreter cannot
        import vLLM, so only its environment can be fixed, not the files."""
        failing = [v for v in self.verdicts if v.counts and not v.live]
        if not failing:
            return "live"
        if all(v.import_failed for v in failing):
            return "cannot-import"
        return "not-live"

    @property
    def import_error(self) -> DeepstackError | None:
        """Why the outcome is ``cannot-import``, with the environment to fix."""
        if self.outcome != "cannot-import":
            return None
        first = next(a for a in self.imported or [] if not a.get("imported", True))
        return DeepstackError(
            f"the files are patched, but {self.python} cannot import vLLM "
            f"(here: {first['why']}), so whether the fixes run is unknown",
            _environment_hint(first, self.python),
        )


def diagnose(
    python: Path | None, series: Sequence[Patch], import_check: bool = False
) -> Diagnosis:
    """Ask ``python`` (default: this interpreter) where its vLLM is, then judge
    every patch of ``series`` there."""
    from deepstack_patch.engine.plan import plan_tree

    interpreter = str(python or sys.executable)
    where = run_probe(interpreter, {"ask": "where"})
    package, installed_as, shadowing = _resolve(where, interpreter)
    root = package.parent
    dist = where["distribution"]
    owned = dist is not None and _same(dist["package"], package)
    version = dist["version"] if owned else detect_version(root)[0]
    tree = VllmTree(root, version, "distribution" if owned else "source")
    plan = plan_tree(tree, series, rewrite=False)
    files = sorted({f for r in plan.reports for f in r.files})
    modules = run_probe(
        interpreter, {"ask": "modules", "root": str(root), "files": files}
    )
    notes: list[str] = []
    record = None
    if owned and dist.get("dist_info"):
        try:
            record = read_record(Path(dist["dist_info"]))
        except UnreadableRecord as exc:
            notes.append(f"the change record is unreadable: {exc}")
    changed = record.changed_since(root) if record else []
    if owned and not dist["editable"]:
        fix = f"deepstack-patch apply --installed --python {interpreter}"
    else:
        fix = f"deepstack-patch apply --vllm-src {root}"
    diagnosis = Diagnosis(
        python=where["python"],
        python_version=where["python_version"],
        package=package,
        version=version,
        installed_as=installed_as,
        distribution=dist,
        shadowing=shadowing,
        modules=modules,
        verdicts=[],
        record=record,
        changed_since=changed,
        notes=notes,
        fix_command=fix,
        tree=tree,
    )
    diagnosis.verdicts = [_verdict(r, diagnosis) for r in plan.reports]
    if import_check:
        _check_imports(interpreter, root, diagnosis)
    _warm_live_check(root)
    return diagnosis


def _warm_live_check(root: Path) -> None:
    """Leave the full check's result where the check in every vLLM process
    looks first (the user cache), so that the server's first process does
    not pay for it: run doctor as the user that runs vLLM, e.g. in the image
    build."""
    from deepstack_patch.liveness.live_plugin import live_state

    # A cache left cold costs the server time, never the truth of this report.
    with contextlib.suppress(Exception):
        live_state(root)


def run_probe(python: str, request: dict[str, Any]) -> Any:
    """Run :mod:`.probe` in ``python`` with ``request``; its JSON answer."""
    timeout = 900 if request["ask"] == "import" else 120
    try:
        done = subprocess.run(
            [python, "-c", Path(probe.__file__).read_text(encoding="utf-8")],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except FileNotFoundError:
        raise DeepstackError(f"--python {python}: no such file", PYTHON_HINT) from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise DeepstackError(
            f"--python {python}: cannot run it: {exc}",
            "give the path of the Python that runs vLLM, e.g. /opt/venv/bin/python",
        ) from None
    try:
        if done.returncode == 0:
            return json.loads(done.stdout)
    except ValueError:
        pass
    raise interpreter_error(python, done.returncode, done.stderr)


def _same(left: str | os.PathLike[str], right: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(left, right)
    except OSError:
        return False


def _resolve(where: dict[str, Any], python: str) -> tuple[Path, str, list[str]]:
    """The vllm/ folder imported, how it got there, and what it shadows."""
    spec = where["spec"]
    if spec is None:
        raise DeepstackError(
            f"{python} has no vllm to import",
            "give the Python that runs vLLM with --python, or install vllm",
        )
    if not spec["origin"] or not spec["origin"].endswith("__init__.py"):
        raise DeepstackError(
            f"{python}: vllm resolves to {spec['origin'] or spec['locations']}, "
            "not a package folder with __init__.py",
            "remove the stray vllm module or namespace folder from the path",
        )
    package = Path(spec["origin"]).parent
    dist = where["distribution"]
    shadowing = [
        f"{c['entry']}/vllm ({c['via']})"
        for c in where["candidates"]
        if not _same(Path(c["entry"]) / "vllm", package)
    ]
    if dist is None:
        return package, "a plain folder on sys.path (no vllm distribution)", shadowing
    if _same(dist["package"], package):
        by = dist["installer"] or "an unknown installer"
        how = "an editable install" if dist["editable"] else "installed from a wheel"
        return package, f"{how} by {by} (vllm {dist['version']})", shadowing
    if dist["editable"] and not Path(dist["package"]).exists():
        return package, f"editable install of {dist['url']}", shadowing
    via = next(
        (
            c["via"]
            for c in where["candidates"]
            if _same(Path(c["entry"]) / "vllm", package)
        ),
        "sys.path",
    )
    return (
        package,
        f"a folder on {via} that shadows the installed vllm {dist['version']} "
        f"at {dist['package']}",
        shadowing,
    )


def _verdict(report: PatchReport, diagnosis: Diagnosis) -> Verdict:
    record = diagnosis.record
    patch_id = report.patch.id
    skipped = record is not None and patch_id in record.skipped
    needed_in = {
        loc.path for loc in report.locations if loc.state is not PatchState.APPLIED
    }
    where = ", ".join(sorted(needed_in)) or "this vLLM"
    match report.state:
        case PatchState.NOT_APPLICABLE:
            return Verdict(report, True, False, [f"not needed: {report.reason}"])
        case PatchState.NEEDED if skipped:
            return Verdict(
                report, False, False, ["needed, skipped on purpose at apply"]
            )
        case PatchState.NEEDED:
            reasons = [f"needed: the fix is not in {where}"]
            changed = [f for f in diagnosis.changed_since if f in report.files]
            if record is not None and patch_id in record.applied and changed:
                reasons.append(
                    f"deepstack-patch applied it ({record.date}), but "
                    f"{', '.join(changed)} changed since"
                )
            if "shadows" in diagnosis.installed_as:
                reasons.append(f"vllm is imported from {diagnosis.installed_as}")
            return Verdict(report, False, True, reasons)
        case PatchState.DRIFTED:
            return Verdict(report, False, True, [f"drifted: {report.reason}"])
    reasons = []
    for relpath in report.files:
        module = diagnosis.modules.get(relpath, {})
        if module.get("loads") != module.get("source"):
            reasons.append(
                f"shadowed: the import system loads {module.get('loads')} "
                f"instead of {relpath}"
            )
        elif module.get("bytecode") == probe.STALE:
            reasons.append(f"stale bytecode: {module['pyc']}: {module['why']}")
    return Verdict(report, not reasons, True, reasons or ["applied, and live"])


def _environment_hint(failure: dict[str, Any], python: str) -> str:
    """What makes ``python`` import vLLM: never applying again (the files are
    patched already)."""
    missing = failure.get("missing") or ""
    without_import = (
        "doctor without --import checks the files and bytecode without importing"
    )
    if missing and missing.partition(".")[0] != "vllm":
        return (
            f"install vLLM's dependencies in that environment ({missing} is "
            "missing there), or give the interpreter that runs vLLM with "
            f"--python; {without_import}"
        )
    return (
        f"run {python} -c 'import {failure['module']}' to see the whole error, "
        "and fix that environment, or give the interpreter that runs vLLM with "
        f"--python; {without_import}"
    )


def _check_imports(python: str, root: Path, diagnosis: Diagnosis) -> None:
    functions = [
        [loc.path, loc.finding.symbol]
        for v in diagnosis.verdicts
        if v.live and v.counts
        for loc in v.report.locations
        if loc.state is PatchState.APPLIED
    ]
    answer = run_probe(
        python, {"ask": "import", "root": str(root), "functions": functions}
    )
    diagnosis.imported = answer
    failing = {(a["path"], a["symbol"]): a for a in answer if not a["live"]}
    for verdict in diagnosis.verdicts:
        found = [
            failing[loc.path, loc.finding.symbol]
            for loc in verdict.report.locations
            if loc.state is PatchState.APPLIED
            and (loc.path, loc.finding.symbol) in failing
        ]
        if not found:
            continue
        # "applied, and live" no longer holds.
        verdict.live, verdict.reasons = False, []
        for failure in found:
            if failure.get("imported", True):
                verdict.reasons.append(
                    f"imported {failure['symbol']}: {failure['why']}"
                )
            else:
                verdict.reasons.append(
                    f"applied in the files; cannot import {failure['module']} "
                    f"here: {failure['why']}"
                )
        # One line per module (its functions fail alike when it cannot import).
        verdict.reasons = list(dict.fromkeys(verdict.reasons))
        # Only when nothing that did import was found to differ.
        verdict.import_failed = all(not f.get("imported", True) for f in found)


def diagnosis_json(diagnosis: Diagnosis) -> dict[str, Any]:
    """The ``doctor --format json`` document (schema 1)."""
    from deepstack_patch.output.documents import error_json, patch_json, tree_json

    record = diagnosis.record
    error = diagnosis.import_error
    document: dict[str, Any] = {
        "schema": 1,
        "command": "doctor",
        "live": diagnosis.live,
        "tree": tree_json(diagnosis.tree) if diagnosis.tree else None,
        "python": {"path": diagnosis.python, "version": diagnosis.python_version},
        "vllm": {
            "path": str(diagnosis.package),
            "version": diagnosis.version,
            "installed_as": diagnosis.installed_as,
            "distribution": diagnosis.distribution,
            "shadowing": diagnosis.shadowing,
        },
        "modules": diagnosis.modules,
        "record": None
        if record is None
        else {
            "path": str(record.path),
            "tool_version": record.tool_version,
            "date": record.date,
            "applied": list(record.applied),
            "skipped": list(record.skipped),
            "changed_since": diagnosis.changed_since,
        },
        # The patch's state as every command shows it, and whether it runs:
        # ``reasons`` says why it is (not) live; ``reason`` is the state's.
        "patches": [
            {
                **patch_json(v.report),
                "live": v.live,
                "counts": v.counts,
                "import_failed": v.import_failed,
                "reasons": v.reasons,
            }
            for v in diagnosis.verdicts
        ],
        "imported": diagnosis.imported,
        "notes": diagnosis.notes,
        "fix_command": diagnosis.fix_command
        if diagnosis.outcome == "not-live"
        else None,
    }
    if error is not None:  # the error document's shape, beside the diagnosis
        document["error"] = error_json(error)
    return document

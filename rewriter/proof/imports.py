"""The import stage of a patch without a proof of its own (a derived patch).

A derived patch carries upstream's statements as they are, and a statement
can need what the release lacks: vllm#48429 imports
``_all_gather_hidden_and_residual`` from ``qwen3_next``, which no release
before 0.26.0 defines, so after ``apply`` on 0.20.2 ``qwen3_next_mtp`` no
longer imports. Static checks cannot see everything (a module-level
statement that raises, an attribute a module makes at run time), so before
its recorded tests, verify imports every module the patch changes in the
proof environment, on the tree and on the pristine tree:

- ``imported``: it imports on the tree (and on the pristine tree, where
  there is one);
- ``broken``: it imported on the pristine tree and fails on the tree: the
  patch broke it, and the stage fails, naming the error;
- ``not-provable``: it fails on the tree, and on the pristine tree too (or
  there is no pristine tree to tell): its import proves nothing either way,
  which is no pass.

All modules of one tree are imported in one process (``runner.py``, with a
``modules`` request), one after another. Nothing here names a fix.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.proof.envs import ProofEnv, subprocess_env
from deepstack_patch.proof.forkserver import Spawn, run_subprocess
from deepstack_patch.proof.proofs import TIMEOUT_S, output_text, runner_path


def module_name(path: str) -> str | None:
    """``vllm/a/b.py`` -> ``vllm.a.b``, ``vllm/a/__init__.py`` -> ``vllm.a``;
    None for a file outside the ``vllm`` package."""
    if not path.startswith("vllm/") or not path.endswith(".py"):
        return None
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass
class ModuleImport:
    """One module the patch changes, imported on the tree and the pristine one."""

    module: str
    path: str
    #: The error on the tree verified; ``""``: it imported.
    error: str = ""
    #: The error on the pristine tree; ``""`` it imported; None: not tried.
    pristine_error: str | None = None

    @property
    def outcome(self) -> str:
        """``imported``, ``broken`` or ``not-provable`` (the module's docstring)."""
        if not self.error:
            return "imported"
        return "broken" if self.pristine_error == "" else "not-provable"

    @property
    def explanation(self) -> str:
        match self.outcome:
            case "imported":
                return f"{self.module} imports"
            case "broken":
                return (
                    f"{self.module} imports on the pristine tree and fails after "
                    f"the fix: {self.error}"
                )
        why = (
            "no pristine tree to tell whether the fix broke it (--against-pristine)"
            if self.pristine_error is None
            else f"it fails on the pristine tree too: {self.pristine_error}"
        )
        return f"{self.module} does not import here: {self.error}; {why}"

    def json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "path": self.path,
            "outcome": self.outcome,
            "error": self.error,
            "pristine_error": self.pristine_error,
        }


@dataclass
class ImportStage:
    """The import stage of one patch: ``passed``, ``failed`` (a module the
    patch broke) or ``not-provable`` (a module that imports on neither)."""

    modules: list[ModuleImport] = field(default_factory=list)

    @property
    def status(self) -> str:
        outcomes = {m.outcome for m in self.modules}
        if "broken" in outcomes:
            return "failed"
        if "not-provable" in outcomes or not self.modules:
            return "not-provable"
        return "passed"

    @property
    def message(self) -> str:
        if not self.modules:
            return "no module of the vllm package to import"
        return "; ".join(
            m.explanation
            for m in self.modules
            if m.outcome != "imported" or self.status == "passed"
        )

    @property
    def problem(self) -> str:
        """What fails the patch's verdict; ``""`` when the stage passed."""
        match self.status:
            case "passed":
                return ""
            case "failed":
                return f"import stage failed: {self.message}"
        return f"import stage not provable: {self.message}"

    def json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "message": self.message,
            "modules": [m.json() for m in self.modules],
        }


def changed_modules(paths: Sequence[str]) -> list[tuple[str, str]]:
    """(module, path) for each file of the ``vllm`` package in ``paths``."""
    found = []
    for path in paths:
        name = module_name(path)
        if name is not None and (name, path) not in found:
            found.append((name, path))
    return found


def import_stage(
    modules: Sequence[tuple[str, str]],
    after: dict[str, str],
    before: dict[str, str] | None,
) -> ImportStage:
    """One patch's stage from the errors of every module on the tree
    (``after``) and on the pristine tree (``before``; None: no pristine)."""
    return ImportStage(
        [
            ModuleImport(
                module,
                path,
                after.get(module, "not imported: the import process ended first"),
                None if before is None else before.get(module),
            )
            for module, path in modules
        ]
    )


def run_imports(
    env: ProofEnv,
    tree: Path,
    modules: Sequence[str],
    *,
    timeout: float = TIMEOUT_S,
    spawn: Spawn = run_subprocess,
) -> dict[str, str]:
    """Import ``modules`` from ``tree`` in one subprocess of ``env``: each
    module's error, ``""`` where it imported. A module the process did not
    reach (it crashed, it timed out) has the process's end as its error."""
    if not modules:
        return {}
    with tempfile.TemporaryDirectory(prefix="deepstack-imports-") as scratch:
        request_file = Path(scratch) / "request.json"
        output = Path(scratch) / "results.json"
        request = {"tree": str(tree), "modules": list(modules), "output": str(output)}
        request_file.write_text(json.dumps(request))
        command = [str(env.python), str(runner_path()), str(request_file)]
        try:
            done = spawn(
                command, env=subprocess_env(tree), cwd=scratch, timeout=timeout
            )
            log, code = done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            log = output_text(exc.stderr) + f"\ntimed out after {timeout:.0f} s"
            code = -1
        results = json.loads(output.read_text()) if output.is_file() else []
    found = {r["module"]: r["error"] for r in results}
    tail = "\n".join(output_text(log).strip().splitlines()[-5:])
    for module in modules:
        found.setdefault(
            module,
            f"the import process ended (exit code {code}) before it reached "
            f"this module: {tail}",
        )
    return found

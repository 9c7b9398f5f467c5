"""Each patch's proof, run on a tree in a subprocess of a proof environment.

All proofs of one tree share one process (importing vLLM takes seconds),
started as ``python runner.py REQUEST.json`` with the tree first on
``sys.path``; the runner writes each verdict as soon as it has it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.protocol import Patch
from deepstack_patch.proof import runner
from deepstack_patch.proof.envs import ProofEnv, subprocess_env
from deepstack_patch.proof.forkserver import Spawn, run_subprocess
from deepstack_patch.proof.results import TestCase

#: Default limit for one proof process or one pytest run.
TIMEOUT_S = 1800


def has_proof(patch: Patch) -> bool:
    """The patch's class has a ``prove`` of its own: a proof of its fix.

    The engine names no fix, so a ``prove`` an engine class defines (a
    derived patch's, which says "proved by its recorded tests") is never one:
    such a patch is proven by its recorded tests (``recorded_tests.py``).
    """
    owner = next(cls for cls in type(patch).__mro__ if "prove" in vars(cls))
    return owner is not Patch and not owner.__module__.startswith(ENGINE)


ENGINE = "deepstack_patch.engine."


#: The status of a proof that could not run here: recorded tests whose
#: environment lacks what they need (network, a package, a GPU) or that all
#: skipped. No pass, and no failure of the fix either.
COULD_NOT_RUN = "could-not-run"


@dataclass
class ProofResult:
    """``passed``, ``failed`` (the proof's AssertionError: the fix's behaviour
    is absent), ``error`` (the proof could not judge), ``could-not-run``
    (:data:`COULD_NOT_RUN`), or ``missing`` (the patch has no proof)."""

    patch_id: str
    status: str
    message: str = ""
    seconds: float = 0.0
    #: The test cases the proof ran, where it is a patch's recorded tests:
    #: what its verdict counts (a ``prove`` of the patch's own has none).
    cases: list[TestCase] = field(default_factory=list)
    #: The changed units whose lines the run watched (``executed.py``): a
    #: case's ``reached`` says which of them it ran.
    watched: frozenset[str] = frozenset()

    def json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "seconds": self.seconds}


def runner_path() -> Path:
    return Path(__file__).with_name("runner.py")


def proof_request(
    tree: Path,
    patch_ids: Sequence[str],
    output: Path,
    sources: Sequence[dict[str, str]] = (),
) -> dict:
    """What the runner reads; ``sources`` says where the patches from elsewhere
    are (``engine.series.patch_sources``): the runner loads them itself."""
    return {
        "tree": str(tree),
        "patch_ids": list(patch_ids),
        "package_dir": str(Path(__file__).parent.parent),
        "patches_dir": str(runner.patches_dir()),
        "sources": list(sources),
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
    spawn: Spawn = run_subprocess,
    sources: Sequence[dict[str, str]] = (),
) -> dict[str, ProofResult]:
    """Run the proofs of ``patch_ids`` on ``tree`` in one subprocess
    (``spawn``: a new interpreter, or a fork of verify's fork server);
    ``sources``: where the patches from elsewhere among them are."""
    if not patch_ids:
        return {}
    with tempfile.TemporaryDirectory(prefix="deepstack-proof-") as scratch:
        request_file = Path(scratch) / "request.json"
        output = Path(scratch) / "results.json"
        request_file.write_text(
            json.dumps(proof_request(tree, patch_ids, output, sources))
        )
        try:
            done = spawn(
                proof_command(env, request_file),
                env=subprocess_env(tree),
                cwd=scratch,
                timeout=timeout,
            )
            log, code = done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            log, code = (
                output_text(exc.stderr) + f"\ntimed out after {timeout:.0f} s",
                -1,
            )
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


def output_text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""

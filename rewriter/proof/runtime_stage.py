"""The runtime-names stage of a derived patch (issue 34, item 2).

A derived patch is proven by its recorded tests, upstream's own; a test
that passes a stub in place of the object the fix reads (a config without
the release's fields) passes on a tree where the real object lacks what the
fix reads: vllm#45468 reads ``model_config.is_diffusion``, which 0.20.2's
``ModelConfig`` has not, and its test passes a stub that has it. So before
the tests are believed, the checks ``status`` and ``apply`` run on a needed
unit (``engine/derived/runtime.py``, and the declared names of
``engine/derived/names.py``) run once more: the patch is recognised on the
release as it was before the fix, where it is needed and the checks apply:

- the pristine tree, with ``--against-pristine``;
- else, for a tree that is a release (its version from ``PKG-INFO`` or
  ``vllm/_version.py``), that release's ``vllm`` package from the cache;
- else nothing: ``not-run``, said, and no verdict of its own (verify.py
  finds the tree, :func:`runtime_stages` judges there).

``failed`` (the fix reads what that release lacks) is a problem of the
patch: never ``ok``, never ``proven``, whatever its tests say. Nothing here
names a fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deepstack_patch.engine.derived.runtime import RUNTIME, UNCHECKED
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.tree import VllmTree


@dataclass
class RuntimeStage:
    """``passed``, ``failed`` or ``not-run``, and why."""

    status: str
    message: str

    @property
    def problem(self) -> str:
        """What fails the patch's verdict; ``""`` unless the stage failed."""
        return f"runtime names: {self.message}" if self.status == "failed" else ""

    def json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message}


def runtime_stages(
    base: VllmTree | str,
    series: Sequence[Patch],
    patches: Sequence[Patch],
) -> dict[str, RuntimeStage]:
    """The stage of each of ``patches`` (derived ones, needed or applied on
    the tree verified), judged on ``base``, the release before the fix (the
    module's docstring); a string: why there is none."""
    from deepstack_patch.engine.plan import plan_tree

    if isinstance(base, str):
        return {p.id: RuntimeStage("not-run", base) for p in patches}
    if not patches:
        return {}
    plan = plan_tree(base, series, {p.id for p in patches}, rewrite=False)
    stages = {}
    for patch in patches:
        report = plan.report(patch.id)
        missing = [
            str(loc.finding.details[RUNTIME])
            for loc in report.locations
            if loc.state is PatchState.DRIFTED and RUNTIME in loc.finding.details
        ]
        unchecked = [
            str(loc.finding.details[UNCHECKED])
            for loc in report.locations
            if UNCHECKED in loc.finding.details
        ]
        where = f"vLLM {base.version} at {base.root}"
        if missing:
            stages[patch.id] = RuntimeStage("failed", f"{missing[0]} (on {where})")
        elif unchecked:  # never "passed" where nothing was looked up
            stages[patch.id] = RuntimeStage(
                "not-run", f"runtime names not checked: {unchecked[0]} ({where})"
            )
        else:
            stages[patch.id] = RuntimeStage(
                "passed", f"what the fix reads is there ({where}: {report.state.value})"
            )
    return stages

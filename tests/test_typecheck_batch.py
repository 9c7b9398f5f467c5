"""Issue 41 item 4: the typed checks of one plan run as one batch, ty once
per state for every file that needs it (engine/derived/typecheck.py,
``diagnostics_of``), not twice per patch, and every patch gets the verdict
it gets checked alone: a file whose check reads what another check's file
holds otherwise is checked in a run of its own, and a verdict that finds
something makes the plan judge the later patches again (engine/plan.py)."""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path

import pytest
from deepstack_patch.engine import plan as plan_module
from deepstack_patch.engine.derived import closure, typecheck
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState

from tests.test_series_order import ADDS, RING, RING_FIXED, derived, whole_tree

#: vllm/alpha.py reads ``Ring.free``, which local#adds gives vllm/zshm.py:
#: its check reads another check's file.
USE = "from vllm.zshm import Ring\n\n\ndef make(size):\n    return Ring(size)\n"
USE_FIXED = USE.replace(
    "    return Ring(size)",
    "    ring = Ring(size)\n    if not ring.free:\n        raise RuntimeError\n"
    "    return ring",
)
#: vllm/toy.py's fix reads ``ToyConfig.strict``, which the release lacks
#: (ty drifts it), and adds ``Helper.tighten``, which vllm/beta.py's fix
#: calls: a verdict that finds something changes what a later patch reads.
CONFIG = "class ToyConfig:\n    limit: int = 4\n"
TOY = """from vllm.config import ToyConfig


class Helper:
    def loosen(self):
        return 0


def check(config: ToyConfig):
    return config.limit
"""
TOY_FIXED = TOY.replace(
    "        return 0\n",
    "        return 0\n\n    def tighten(self):\n        return 1\n",
).replace(
    "    return config.limit",
    "    if config.strict:\n        return 0\n    return config.limit",
)
BETA = "from vllm.toy import Helper\n\n\ndef run():\n    return Helper().loosen()\n"
BETA_FIXED = BETA.replace("loosen()", "tighten()")
#: Files no other check reads.
LONE = "def lone(x: int) -> int:\n    return x\n"
LONE_FIXED = LONE.replace("return x", "return x + 1")


def toy_tree(root: Path):
    return whole_tree(
        root,
        {
            "vllm/zshm.py": RING,
            "vllm/alpha.py": USE,
            "vllm/config.py": CONFIG,
            "vllm/toy.py": TOY,
            "vllm/beta.py": BETA,
            "vllm/lone1.py": LONE,
            "vllm/lone2.py": LONE,
        },
    )


SERIES = [
    ADDS,
    derived("local#reads", "vllm/alpha.py", USE, USE_FIXED),
    derived("local#toy", "vllm/toy.py", TOY, TOY_FIXED),
    derived("local#beta", "vllm/beta.py", BETA, BETA_FIXED),
    derived("local#lone1", "vllm/lone1.py", LONE, LONE_FIXED),
    derived("local#lone2", "vllm/lone2.py", LONE, LONE_FIXED),
]


def ty_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The files each run of ``ty check`` checks, as the runs start (every
    check runs ``ty check``, none through ``ty server``: those are compared
    in tests/test_typecheck_served.py)."""
    monkeypatch.setattr(typecheck, "SERVED", False)
    runs: list[list[str]] = []
    real = subprocess.Popen

    def counted(command: list[str], **options: object):
        runs.append([word for word in command if word.endswith(".py")])
        return real(command, **options)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "Popen", counted)
    return runs


def verdicts(plan) -> list[tuple[str, PatchState, str]]:
    return [(r.patch.id, r.state, r.reason) for r in plan.reports]


@pytest.mark.parametrize("rewrite", [False, True], ids=["status", "apply"])
def test_a_batched_plan_gives_every_patch_the_verdict_it_gets_checked_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rewrite: bool
) -> None:
    tree = toy_tree(tmp_path / "tree")
    runs = ty_runs(monkeypatch)
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "batched"))
    batched = verdicts(plan_tree(tree, SERIES, rewrite=rewrite))
    batched_runs = len(runs)
    # Each check at once, in series order (no pass puts one off).
    monkeypatch.setattr(plan_module, "_DEFERRING_PASSES", 0)
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "alone"))
    runs.clear()
    alone = verdicts(plan_tree(tree, SERIES, rewrite=rewrite))
    assert batched == alone
    states = {patch_id: (state, reason) for patch_id, state, reason in alone}
    assert states["local#reads"][0] is PatchState.NEEDED  # sees local#adds' field
    assert states["local#toy"][0] is PatchState.DRIFTED
    assert "`ToyConfig.strict`" in states["local#toy"][1]
    # local#toy drifted, so its Helper.tighten is not there for local#beta.
    assert states["local#beta"][0] is PatchState.DRIFTED
    assert "tighten" in states["local#beta"][1]
    assert states["local#lone1"][0] is PatchState.NEEDED
    # Checked alone, a patch's file runs once as fixed, and once more as it
    # is only where the fixed file holds a "cannot run" diagnostic on the
    # fix's lines (the two that drift): the file as it is excuses none else.
    checked = collections.Counter(path for run in runs for path in run)
    assert checked == {
        "vllm/zshm.py": 1,
        "vllm/alpha.py": 1,
        "vllm/toy.py": 2,
        "vllm/beta.py": 2,
        "vllm/lone1.py": 1,
        "vllm/lone2.py": 1,
    }, checked
    # Fewer runs batched: the first pass's batch, then local#beta again on
    # the tree without local#toy's fix.
    assert batched_runs < len(runs) / 2, batched_runs


def test_checks_that_read_no_other_check_s_file_take_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file as fixed in one run; none is run as it is, since no fixed
    file holds a new "cannot run" diagnostic on its fix's lines."""
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    tree = toy_tree(tmp_path / "tree")
    runs = ty_runs(monkeypatch)
    series = [p for p in SERIES if p.id in ("local#adds", "local#lone1", "local#lone2")]
    plan = plan_tree(tree, series, rewrite=False)
    assert {r.state for r in plan.reports} == {PatchState.NEEDED}
    assert sorted(map(sorted, runs)) == [
        ["vllm/lone1.py", "vllm/lone2.py", "vllm/zshm.py"],
    ]
    # Warm: every verdict from the cache, no run.
    runs.clear()
    assert verdicts(plan_tree(tree, series, rewrite=False)) == verdicts(plan)
    assert runs == []


def test_a_check_that_reads_another_s_file_is_run_apart_from_it(
    tmp_path: Path,
) -> None:
    """The diagnostics of a batch are those of each check run alone, and a
    file one check reads is never held as another check needs it."""
    root = toy_tree(tmp_path / "tree").root
    files = {
        path: (root / path).read_bytes()
        for path in ("vllm/zshm.py", "vllm/alpha.py", "vllm/lone1.py")
    }
    index = closure.ModuleIndex(files)

    def check(path: str, fixed: str, others: dict[str, bytes]) -> typecheck.Check:
        found = index.closure(path, [files[path], fixed.encode()])
        return typecheck.Check(
            path,
            {**others, path: files[path]},
            {**others, path: fixed.encode()},
            lambda relpath, appears: closure.reads_file(found, relpath, appears),
        )

    checks = [
        check("vllm/zshm.py", RING_FIXED, {}),
        # alpha.py as the series leaves it: zshm.py fixed, which it reads.
        check("vllm/alpha.py", USE_FIXED, {"vllm/zshm.py": RING_FIXED.encode()}),
        check("vllm/lone1.py", LONE_FIXED, {}),
        # alpha.py on zshm.py as it is, which lacks Ring.free.
        check("vllm/alpha.py", USE_FIXED, {}),
    ]
    views = typecheck._views(typecheck._sides(checks), typecheck._Disk(root))
    for view in views:
        for side in view.sides:  # what each side reads is as it holds it
            for relpath, raw in side.files.items():
                if relpath == side.path or side.reads(relpath, False):
                    held = view.files.get(relpath, (root / relpath).read_bytes())
                    assert held == raw
    # zshm.py as it is and alpha.py on the fixed zshm.py cannot share a
    # run, nor alpha.py on two zshm.py; lone1.py goes where there is room.
    assert [len(view.sides) for view in views] == [3, 3, 1, 1]
    batched = typecheck.diagnostics_of(root, checks)
    alone = [typecheck.diagnostics_of(root, [one])[0] for one in checks]
    assert batched == alone
    assert any(after for _before, after in alone)  # alpha.py: Ring lacks free

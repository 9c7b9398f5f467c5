"""A bug the release never had (issue 41, item 3): where what a derived
fix takes away is nowhere in the file, the unit is ``not-applicable``
with "not in this release: …", not drifted; where the target is there and
differs it stays drifted. A part absent beside others is shown at its own
file, with the states of the others, and an import unit says which import.
"""

from __future__ import annotations

from pathlib import Path

from deepstack_patch.engine.apply import apply_tree
from deepstack_patch.engine.derived.patch import DerivedPatch
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import VllmTree

from tests.support.toys import derived_patch
from tests.test_derive import _tree

WARN = "vllm/platforms/interface.py"
CUDA = "vllm/platforms/cuda.py"
GRAPHS = "vllm/graphs.py"

#: The fix: ``warning_once`` imports what imports this module (a cycle).
WARN_BEFORE = (
    "import logging\n\nlogger = logging.getLogger()\n\n\n"
    "def pin_memory():\n"
    "    if wsl():\n"
    '        logger.warning_once("no pinned memory on WSL")\n'
    "        return False\n"
    "    return True\n"
)
WARN_AFTER = WARN_BEFORE.replace("warning_once", "warning")
CUDA_BEFORE = (
    "def pin_memory_cuda():\n"
    "    if wsl():\n"
    '        logger.warning_once("old WSL kernel")\n'
    "        return False\n"
    "    return True\n"
)
CUDA_AFTER = CUDA_BEFORE.replace("warning_once", "warning")
#: A second part, already as the fix leaves it in the release.
GRAPHS_BEFORE = "def use_graphs(mode, breakable):\n    return mode or breakable\n"
GRAPHS_AFTER = "def use_graphs(mode, breakable):\n    return mode\n"


#: The release already warns, with another message (vllm#48444 on 0.20.2).
WARNS_PLAINLY = WARN_AFTER.replace("no pinned memory on WSL", "pinned memory is off")


def patch_of(*changes: tuple[str, str, str]) -> DerivedPatch:
    return derived_patch("vllm#1", *changes)


def warn_and_graphs() -> DerivedPatch:
    """A fix of two parts: the warning, and a second file's function."""
    return patch_of(
        (WARN, WARN_BEFORE, WARN_AFTER), (GRAPHS, GRAPHS_BEFORE, GRAPHS_AFTER)
    )


def report_on(tmp_path: Path, patch: DerivedPatch, files: dict[str, str]):  # noqa: ANN201
    return plan_tree(_tree(tmp_path, files), [patch], rewrite=False).report(patch.id)


def test_what_the_fix_takes_away_nowhere_is_not_in_this_release(
    tmp_path: Path,
) -> None:
    patch = patch_of((WARN, WARN_BEFORE, WARN_AFTER))
    # The release already warns with another message, and never called
    # warning_once: the bug was never here.
    release = WARNS_PLAINLY
    report = report_on(tmp_path / "never", patch, {WARN: release})
    assert report.state is PatchState.NOT_APPLICABLE
    assert report.reason == (
        "not in this release: `warning_once`, which the fix takes away, is "
        f"nowhere in {WARN}; what the fix adds (`warning`) is there already"
    )
    (location,) = report.locations
    assert (location.path, location.finding.line) == (WARN, 6)
    # The target there and different (warning_once, another message): drifted.
    vendor = WARN_BEFORE.replace("no pinned memory on WSL", "pinned memory is off")
    assert report_on(tmp_path / "differs", patch, {WARN: vendor}).state is (
        PatchState.DRIFTED
    )
    # warning_once elsewhere in the file: it may have been moved; drifted.
    elsewhere = release + '\n\ndef other():\n    logger.warning_once("x")\n'
    assert report_on(tmp_path / "elsewhere", patch, {WARN: elsewhere}).state is (
        PatchState.DRIFTED
    )


def test_a_part_absent_beside_one_never_there_is_not_applicable(
    tmp_path: Path,
) -> None:
    """vllm#48444 on 0.20.2: the release already warns plainly, and its
    cuda.py has no override: nothing of the fix is there, no part drifts."""
    patch = patch_of((WARN, WARN_BEFORE, WARN_AFTER), (CUDA, CUDA_BEFORE, CUDA_AFTER))
    release = WARNS_PLAINLY
    report = report_on(tmp_path, patch, {WARN: release, CUDA: "X = 1\n"})
    assert report.state is PatchState.NOT_APPLICABLE
    states = {part: report.part_state(part) for part in patch.parts}
    assert states[f"{CUDA}::pin_memory_cuda"] == (
        PatchState.NOT_APPLICABLE,
        f"target absent: no function pin_memory_cuda in {CUDA} in this tree",
    )
    assert "there elsewhere" not in report.reason


#: The release never warned there at all: neither what the fix takes away
#: (``warning_once``) nor what it adds (``warning``) is in the function.
SILENT = WARN_BEFORE.replace(
    '        logger.warning_once("no pinned memory on WSL")\n', ""
)


def test_parts_beside_code_never_there_go_in_where_the_code_is(
    tmp_path: Path,
) -> None:
    """vllm#49302 on 0.20.2: two parts as the fix leaves them, and the code
    the third changes came later: the fix is in for this release's code
    (applied), and the third part says what the release never had. Beside a
    needed part, the fix goes in there (vllm#41522 on 0.20.0, as the
    maintainers carried it into 0.20.1), and reads applied once written."""
    patch = warn_and_graphs()
    never = (
        PatchState.NOT_APPLICABLE,
        f"not in this release: `warning_once`, which the fix takes away, is "
        f"nowhere in {WARN}",
    )
    report = report_on(tmp_path / "a", patch, {WARN: SILENT, GRAPHS: GRAPHS_AFTER})
    assert report.state is PatchState.APPLIED
    assert report.part_state(f"{GRAPHS}::use_graphs")[0] is PatchState.APPLIED
    assert report.part_state(f"{WARN}::pin_memory") == never
    tree = _tree(tmp_path / "b", {WARN: SILENT, GRAPHS: GRAPHS_BEFORE})
    report = plan_tree(tree, [patch], rewrite=False).report(patch.id)
    assert report.state is PatchState.NEEDED
    assert report.part_state(f"{GRAPHS}::use_graphs")[0] is PatchState.NEEDED
    assert report.part_state(f"{WARN}::pin_memory") == never
    written = apply_tree(tree, [patch], {patch.id}).written
    assert sorted(written) == [GRAPHS]
    assert (tree.root / GRAPHS).read_text() == GRAPHS_AFTER
    assert (tree.root / WARN).read_text() == SILENT
    again = plan_tree(VllmTree.open(tree.root), [patch], rewrite=False)
    assert again.report(patch.id).state is PatchState.APPLIED


def test_a_part_never_there_that_reads_what_the_fix_adds_holds_the_rest_back(
    tmp_path: Path,
) -> None:
    """The release's function warns plainly already: what the fix takes
    away is not there, but what it adds is (fixed another way, perhaps:
    vllm#47062 on 0.25.0, whose ``flush`` catches ``HarmonyError`` itself).
    The rest of the fix is not written alone: the patch drifts, saying so."""
    patch = warn_and_graphs()
    release = WARNS_PLAINLY
    tree = _tree(tmp_path, {WARN: release, GRAPHS: GRAPHS_BEFORE})
    report = plan_tree(tree, [patch], rewrite=False).report(patch.id)
    assert report.state is PatchState.DRIFTED
    state, reason = report.part_state(f"{WARN}::pin_memory")
    assert state is PatchState.DRIFTED
    assert "what the fix adds (`warning`) is there already" in reason
    assert reason.endswith("it applies whole or not at all"), reason
    result = apply_tree(tree, [patch], {patch.id})
    assert result.drifted
    assert not result.written


def test_a_part_there_and_different_beside_one_never_there_drifts(
    tmp_path: Path,
) -> None:
    """Where the other part is there and differs, the fix would go in half:
    the whole patch drifts, and the part never there says what it lacks."""
    patch = warn_and_graphs()
    release = WARNS_PLAINLY
    vendor = GRAPHS_BEFORE.replace("mode or breakable", "breakable or mode")
    tree = _tree(tmp_path, {WARN: release, GRAPHS: vendor})
    report = plan_tree(tree, [patch], rewrite=False).report(patch.id)
    assert report.state is PatchState.DRIFTED
    state, reason = report.part_state(f"{WARN}::pin_memory")
    assert state is PatchState.NOT_APPLICABLE
    assert reason.startswith("not in this release: `warning_once`")
    assert report.part_state(f"{GRAPHS}::use_graphs")[0] is PatchState.DRIFTED
    result = apply_tree(tree, [patch], {patch.id})
    assert result.drifted
    assert not result.written
    assert (tree.root / GRAPHS).read_text() == vendor


def test_an_absent_part_is_shown_at_its_own_file_with_the_others_states(
    tmp_path: Path,
) -> None:
    """vllm#48444 as the issue saw it: the absent part was shown at the
    other file's line, "there elsewhere", while that part had drifted."""
    patch = patch_of((WARN, WARN_BEFORE, WARN_AFTER), (CUDA, CUDA_BEFORE, CUDA_AFTER))
    vendor = WARN_BEFORE.replace("no pinned memory on WSL", "pinned memory is off")
    report = report_on(tmp_path, patch, {WARN: vendor, CUDA: "X = 1\n"})
    assert report.state is PatchState.DRIFTED
    (absent,) = [loc for loc in report.locations if loc.path == CUDA]
    assert (absent.finding.line, absent.finding.symbol) == (0, "pin_memory_cuda")
    assert absent.finding.reason == (
        f"function pin_memory_cuda in {CUDA} is absent while pin_memory is "
        "drifted: it applies whole or not at all"
    )


def test_an_import_the_fix_removes_is_named_where_it_is_absent(
    tmp_path: Path,
) -> None:
    """vllm#45487 on 0.20.2: not "no imports of the file" (it has five),
    but the one import the fix removes, with the code that used it."""
    before = (
        "import os\nfrom vllm.workspace import manager\n\n\n"
        "def buffers():\n    return manager()\n"
    )
    after = "import os\n\n\ndef buffers():\n    return os.environ\n"
    patch = patch_of((GRAPHS, before, after))
    release = "import os\nimport sys\n\n\ndef other():\n    return sys.path\n"
    report = report_on(tmp_path, patch, {GRAPHS: release})
    assert report.state is PatchState.NOT_APPLICABLE
    assert report.part_state(f"{GRAPHS}::imports") == (
        PatchState.NOT_APPLICABLE,
        "not in this release: `from vllm.workspace import manager`, the import "
        f"the fix removes, is not in {GRAPHS}",
    )


def test_a_renamed_local_is_no_sign_of_a_bug_never_there(tmp_path: Path) -> None:
    """A vendor renamed a local the fix's removed code reads: the target is
    there and differs, so the unit is never not-applicable for it."""
    before = "def size(rows):\n    n = rows * 2\n    return n + 1\n"
    after = "def size(rows):\n    n = rows * 2\n    return rows\n"
    patch = patch_of((GRAPHS, before, after))
    renamed = before.replace("n =", "count =").replace("n + 1", "count + 2")
    report = report_on(tmp_path, patch, {GRAPHS: renamed})
    assert report.state is PatchState.DRIFTED, report.reason


MOE = "vllm/moe.py"
GUARD_BEFORE = """        if config.expert_parallel:
            self.mega = config.backend == "mega"
        else:
            self.mega = False
"""
GUARD_AFTER = """        self.mega = config.backend == "mega"
        if self.mega and not config.expert_parallel:
            raise NotImplementedError("mega needs expert parallel")
"""
#: vllm#41522's kind: one flag guarded the same way in two classes.
EXPERTS = "class Experts:\n    def __init__(self, config):\n        self.prefix = 1\n"
MODEL = "class Model:\n    def __init__(self, config):\n        self.config = config\n"
MOE_BEFORE = f"{EXPERTS}{GUARD_BEFORE}\n\n{MODEL}{GUARD_BEFORE}"
MOE_AFTER = f"{EXPERTS}{GUARD_AFTER}\n\n{MODEL}{GUARD_AFTER}"
#: The release: the model class has no such flag at all.
MOE_RELEASE = f"{EXPERTS}{GUARD_BEFORE}\n\n{MODEL}"


def test_a_flag_the_changed_code_sets_that_its_class_never_touches(
    tmp_path: Path,
) -> None:
    """The code the fix changes sets ``self.mega``; where the method's class
    never touches ``self.mega``, that code is not in it in any form: not in
    this release, and the fix goes in where it is (0.20.0's
    ``DeepseekV4Model`` has no ``use_mega_moe``, its ``DeepseekV4MoE``
    does). Where the class touches the flag elsewhere, the code may be
    there and differ: drifted."""
    patch = patch_of((MOE, MOE_BEFORE, MOE_AFTER))
    tree = _tree(tmp_path / "never", {MOE: MOE_RELEASE})
    report = plan_tree(tree, [patch], rewrite=False).report(patch.id)
    assert report.state is PatchState.NEEDED, report.reason
    assert report.part_state(f"{MOE}::Model.__init__") == (
        PatchState.NOT_APPLICABLE,
        "not in this release: `self.mega`, which the code the fix changes sets, "
        f"is nowhere in class Model of {MOE}",
    )
    assert apply_tree(tree, [patch], {patch.id}).written == [MOE]
    assert (tree.root / MOE).read_text() == f"{EXPERTS}{GUARD_AFTER}\n\n{MODEL}"
    touched = MOE_RELEASE + "\n    def forward(self):\n        return self.mega\n"
    report = report_on(tmp_path / "touched", patch, {MOE: touched})
    assert report.state is PatchState.DRIFTED
    assert report.part_state(f"{MOE}::Model.__init__")[0] is PatchState.DRIFTED


OPS = "vllm/ops.py"
#: vllm#30336's kind: __init__ gains a flag that only the changed condition
#: of another method reads.
OPS_BEFORE = """from vllm.gemm import ScaleFormat, platform


class Op:
    def __init__(self):
        self.use_e8m0 = platform.e8m0()

    def run(self, x):
        if ScaleFormat.from_oracle() == ScaleFormat.UE8M0:
            return x * 2
        return x
"""
OPS_AFTER = """from vllm.gemm import platform


class Op:
    def __init__(self):
        self.use_e8m0 = platform.e8m0()
        self.is_blackwell = platform.capability(100)

    def run(self, x):
        if self.use_e8m0 and self.is_blackwell:
            return x * 2
        return x
"""
#: The release writes the condition another way: no ScaleFormat anywhere.
OPS_RELEASE = OPS_BEFORE.replace("ScaleFormat, platform", "platform").replace(
    "ScaleFormat.from_oracle() == ScaleFormat.UE8M0", "self.use_e8m0"
)
GEMM = """class ScaleFormat:
    UE8M0 = 1


class Platform:
    def e8m0(self) -> bool:
        return True

    def capability(self, major: int) -> bool:
        return major > 0


platform = Platform()
"""


def test_what_is_there_of_a_fix_only_serving_what_is_not_is_not_applicable(
    tmp_path: Path,
) -> None:
    """vllm#30336 on 0.17.1: the method whose condition the fix rewrites
    never had it, and all the fix adds where it is there is a flag that
    only that condition reads: nothing of it is to do (not a needed patch
    that writes an attribute nothing reads), and the import it removes,
    already absent, goes with it. Where the part there also changes code of
    its own, it is a fix of its own, and goes in."""
    patch = patch_of((OPS, OPS_BEFORE, OPS_AFTER))
    files = {OPS: OPS_RELEASE, "vllm/gemm.py": GEMM}
    tree = _tree(tmp_path / "serving", files)
    report = plan_tree(tree, [patch], rewrite=False).report(patch.id)
    assert report.state is PatchState.NOT_APPLICABLE, report.reason
    # Nothing is written: its rewrite, computed before the parts were judged
    # together, is dropped (the corpus found the flag written while status
    # said not-applicable).
    assert not apply_tree(tree, [patch], {patch.id}).written
    assert (tree.root / OPS).read_text() == OPS_RELEASE
    assert report.part_state(f"{OPS}::Op.__init__") == (
        PatchState.NOT_APPLICABLE,
        "not in this release: it only adds `is_blackwell`, which the fix reads "
        "in Op.run alone, whose code this release never had",
    )
    assert report.part_state(f"{OPS}::imports") == (
        PatchState.NOT_APPLICABLE,
        "the imports of a fix whose code is not in this release",
    )
    own = OPS_AFTER.replace("platform.e8m0()", "platform.e8m0() or False")
    report = report_on(tmp_path / "own", patch_of((OPS, OPS_BEFORE, own)), files)
    assert report.state is PatchState.NEEDED, report.reason
    assert report.part_state(f"{OPS}::Op.__init__")[0] is PatchState.NEEDED


def test_imports_as_the_fix_leaves_them_beside_code_never_there_are_no_fix(
    tmp_path: Path,
) -> None:
    """The fix's one method never had the code it rewrites, and the import
    it adds is in the release already (for other code): nothing of the fix
    is here, not ``applied`` (imports alone never make a patch applied)."""
    fixed = OPS_BEFORE.replace(
        "from vllm.gemm", "import math\n\nfrom vllm.gemm"
    ).replace("ScaleFormat.from_oracle() == ScaleFormat.UE8M0", "math.isfinite(x)")
    release = OPS_BEFORE.replace(
        "from vllm.gemm", "import math\n\nfrom vllm.gemm"
    ).replace("ScaleFormat.from_oracle() == ScaleFormat.UE8M0", "self.use_e8m0")
    release += "\n\nHALF = math.sqrt(0.25)\nFORMAT = ScaleFormat\n"
    files = {OPS: release, "vllm/gemm.py": GEMM}
    report = report_on(tmp_path, patch_of((OPS, OPS_BEFORE, fixed)), files)
    assert report.state is PatchState.NOT_APPLICABLE, report.reason
    assert report.part_state(f"{OPS}::imports")[0] is PatchState.NOT_APPLICABLE


def test_a_series_says_which_parts_of_a_fix_it_leaves_out_and_why(
    tmp_path: Path,
) -> None:
    """A fix that goes in where its code is: its DEP-3 description in the
    series names each part left out, with the reason status gives."""
    import datetime as dt

    from deepstack_patch.distribution.quilt import format_patch, plan_steps

    patch = patch_of((MOE, MOE_BEFORE, MOE_AFTER))
    tree = _tree(tmp_path, {MOE: MOE_RELEASE})
    _plan, (step,) = plan_steps(tree, [patch], {patch.id})
    reason = (
        "not in this release: `self.mega`, which the code the fix changes sets, "
        f"is nowhere in class Model of {MOE}"
    )
    assert step.left_out == [f"Model.__init__: {reason}"]
    mail = format_patch(step, 1, 1, "0.0.1", dt.datetime(2026, 11, 29, tzinfo=dt.UTC))
    header = mail.decode().split("\n---\n", 1)[0]
    assert "Left out: Model.__init__: not in this release: `self.mega`" in header

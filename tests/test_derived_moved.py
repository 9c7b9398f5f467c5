"""Moved code is found (issue 34 item 4, engine/derived/moved.py).

Upstream moved vllm#46168's ``load_weights`` from ``DeepseekV2ForCausalLM``
to ``DeepseekV2Model`` after 0.20.2; on 0.20.2 the bug sits in the other
class. A unit whose qualified name is absent is looked for among the
file's other functions of its name: carried where exactly one holds the
fix's statements (and said so), drifted where several do, and never
``not-applicable`` while the statements it removes are in the file. The
synthetic modules here are this project's own; the release test builds a
diff of vllm#46168's function from two release tarballs at test time.
"""

from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path

import pytest
from deepstack_patch.engine.derived import DerivedPatch
from deepstack_patch.engine.derived.units import units_of_change
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import Finding, PatchState

from tests.support.derived_cli import cli

PATH = "vllm/m.py"

LOAD = """    def load(self, weights):
        mapping = [1, 2]
        pending: dict = {}  # the bug: a new dict at every call
        names = []
        for weight in weights:
            names.append(weight)
        return pending, names
"""
FIXED_LOAD = LOAD.replace(
    "        pending: dict = {}  # the bug: a new dict at every call\n",
    '        pending = getattr(self, "_pending", None)\n'
    "        if pending is None:\n"
    "            self._pending = pending = {}\n",
)

#: Upstream, after the move: ``load`` is a method of ``Model``.
UPSTREAM = f"""class Model:
{LOAD}

class ForCausalLM:
    def forward(self):
        return 1
"""

#: An older release: ``load`` is still a method of ``ForCausalLM``.
OLDER = f"""class Model:
    def forward(self):
        return 0


class ForCausalLM:
    def forward(self):
        return 1

{LOAD}"""


def derived() -> DerivedPatch:
    units = units_of_change(PATH, UPSTREAM, UPSTREAM.replace(LOAD, FIXED_LOAD))
    assert [u.name for u in units] == ["Model.load"]
    return DerivedPatch(
        id="local#1", title="t", symptom="s", base="0.0.1", paths=[PATH], units=units
    )


def finding(patch: DerivedPatch, source: str) -> Finding:
    (found,) = patch.recognise(ast.parse(source), PATH)
    return found


def test_a_method_another_class_holds_is_carried_there_and_said() -> None:
    patch = derived()
    needed = finding(patch, OLDER)
    assert needed.state is PatchState.NEEDED
    assert needed.reason == "found as `ForCausalLM.load`"
    assert needed.line == OLDER.splitlines().index("    def load(self, weights):") + 1
    fixed = rewrite_text(patch, OLDER, PATH)
    assert fixed == OLDER.replace(LOAD, FIXED_LOAD)  # there, and nowhere else
    applied = finding(patch, fixed)
    assert (applied.state, applied.reason) == (
        PatchState.APPLIED,
        "found as `ForCausalLM.load`",
    )
    assert rewrite_text(patch, fixed, PATH) == fixed


def test_a_module_level_function_of_the_name_is_a_place_too() -> None:
    patch = derived()
    module_level = "import os\n\n\n" + "\n".join(line[4:] for line in LOAD.splitlines())
    needed = finding(patch, module_level + "\n")
    assert (needed.state, needed.reason) == (PatchState.NEEDED, "found as `load`")


def test_several_functions_holding_the_fix_drift_naming_them() -> None:
    twice = OLDER + f"\n\nclass Other:\n{LOAD}"
    drifted = finding(derived(), twice)
    assert drifted.state is PatchState.DRIFTED
    lines = twice.splitlines()
    first = lines.index("    def load(self, weights):") + 1
    second = lines.index("    def load(self, weights):", first) + 1
    assert drifted.reason == (
        "no method Model.load in vllm/m.py; the code the fix changes is in 2 "
        f"functions of that name, `ForCausalLM.load` (line {first}), "
        f"`Other.load` (line {second}): which one it means cannot be told"
    )
    assert drifted.line == first


def test_one_function_is_never_the_place_of_two_units() -> None:
    """Two classes' copies of the method, both fixed upstream; the target
    has one copy, under a third class: one unit is carried there, and the
    other drifts (the patch with it) rather than fix it twice."""
    upstream = UPSTREAM + f"\n\nclass Twin:\n{LOAD}"
    units = units_of_change(PATH, upstream, upstream.replace(LOAD, FIXED_LOAD))
    assert [u.name for u in units] == ["Model.load", "Twin.load"]
    patch = DerivedPatch(
        id="local#2", title="t", symptom="s", base="0.0.1", paths=[PATH], units=units
    )
    found = {f.symbol: f for f in patch.recognise(ast.parse(OLDER), PATH)}
    assert (found["Model.load"].state, found["Model.load"].reason) == (
        PatchState.NEEDED,
        "found as `ForCausalLM.load`",
    )
    assert found["Twin.load"].state is PatchState.DRIFTED
    assert found["Twin.load"].reason.startswith(
        "no method Twin.load in vllm/m.py, but the code the fix removes"
    )


def test_removed_code_anywhere_in_the_file_is_never_not_applicable() -> None:
    """The statement the fix removes, in a function of another name: the
    unit drifts, shown at that function, instead of not-applicable."""
    renamed = OLDER.replace("def load(", "def load_all(")
    drifted = finding(derived(), renamed)
    assert drifted.state is PatchState.DRIFTED
    line = renamed.splitlines().index("    def load_all(self, weights):") + 1
    assert drifted.reason == (
        "no method Model.load in vllm/m.py, but the code the fix removes "
        f"(`pending: dict = {{}}`) is in def load_all at line {line}"
    )
    assert drifted.line == line
    # Where it is nowhere, the unit is absent: not-applicable, as before.
    gone = renamed.replace("pending: dict = {}", "pending = {}")
    assert derived().recognise(ast.parse(gone), PATH) == []
    # Another function of the name without the fix's statements is no
    # place for it either.
    other = gone.replace("def load_all(", "def load(")
    assert derived().recognise(ast.parse(other), PATH) == []


def test_apply_check_gates_on_moved_code_as_a_user_runs_it(tmp_path: Path) -> None:
    """``apply --check`` exits 1 where the fix is needed in the other class
    (a CI gate no longer passes with the bug there), and says where."""
    for name, text in (("upstream", UPSTREAM), ("older", OLDER)):
        (tmp_path / name / "vllm").mkdir(parents=True)
        (tmp_path / name / "vllm/__init__.py").write_text("")
        (tmp_path / name / PATH).write_text(text)
        (tmp_path / name / "PKG-INFO").write_text(
            "Metadata-Version: 2.4\nName: vllm\nVersion: 0.0.1\n"
        )
    fixed = UPSTREAM.replace(LOAD, FIXED_LOAD)
    (tmp_path / "fix.diff").write_text(
        "".join(
            difflib.unified_diff(
                UPSTREAM.splitlines(keepends=True),
                fixed.splitlines(keepends=True),
                f"a/{PATH}",
                f"b/{PATH}",
            )
        )
    )
    made = cli(
        "derive", "--diff", "fix.diff", "--base-src", "upstream", "--id",
        "acme#46168", "--out", "patches", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    gate = ["apply", "--vllm-src", "older", "--patches", "patches", "--check"]
    checked = cli(*gate, "--format", "json", cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    (patch,) = [
        p for p in json.loads(checked.stdout)["patches"] if p["id"] == "acme#46168"
    ]
    assert (patch["state"], patch["reason"]) == (
        "needed",
        "found as `ForCausalLM.load`",
    )
    assert patch["locations"][0]["reason"] == "found as `ForCausalLM.load`"
    applied = cli(*gate[:-1], cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (tmp_path / "older" / PATH).read_text() == OLDER.replace(LOAD, FIXED_LOAD)
    again = cli(*gate, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "found as `ForCausalLM.load`" in again.stdout


#: vllm#46168's method, where upstream has it after the move.
DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"


@pytest.mark.release
def test_vllm_46168s_method_is_found_in_the_class_0_20_2_has_it_in() -> None:
    """The fact this adds: on the real 0.20.2, a fix upstream made to
    ``DeepseekV2Model.load_weights`` (0.23.0 -> 0.25.0, the release that
    first has vllm#46168, restricted to that method) is needed in
    ``DeepseekV2ForCausalLM.load_weights``, the one place 0.20.2 has the
    code, and applied there after the rewrite; 0.19.1, without the code, is
    not-applicable."""
    from deepstack_patch.authoring.derive import derive_patch_from_text
    from deepstack_patch.engine.plan import plan_tree
    from deepstack_patch.engine.source import SourceFile

    from tests.support.upstream_diff import release_files, upstream_diff

    diff = upstream_diff(
        "0.23.0", "0.25.0", {DEEPSEEK: (["DeepseekV2Model.load_weights"], [])}
    )
    patch = derive_patch_from_text(
        diff, release_files("0.23.0", [DEEPSEEK]), "local#46168"
    ).patch
    assert [u.name for u in patch.units] == ["DeepseekV2Model.load_weights"]
    old = plan_tree(release_files("0.19.1", [DEEPSEEK]), [patch], rewrite=False)
    assert old.report(patch.id).state is PatchState.NOT_APPLICABLE
    plan = plan_tree(release_files("0.20.2", [DEEPSEEK]), [patch], rewrite=True)
    report = plan.report(patch.id)
    # One file of the release: its runtime names cannot be checked, and the
    # reason says so (issue 40 item 7) where it said where the code was found.
    assert report.state is PatchState.NEEDED
    assert report.reason.startswith("runtime names not checked"), report.reason
    (edit,) = plan.edits
    source = SourceFile(DEEPSEEK, edit.new)
    (applied,) = patch.recognise(source.ast, DEEPSEEK)
    assert (applied.state, applied.reason) == (
        PatchState.APPLIED,
        "found as `DeepseekV2ForCausalLM.load_weights`",
    )
    methods = {
        f"{c.name}.{f.name}": ast.unparse(f)
        for c in source.ast.body
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef)
    }
    assert "_pending_indexer_wk_fp8" in methods["DeepseekV2ForCausalLM.load_weights"]

"""verify's import stage for a patch without a proof of its own (issue 30,
item 8): every module the patch changes is imported on the pristine tree and
on the patched one, before its recorded tests run fail-to-pass.

The fast tier runs on a small synthetic tree whose ``vllm/envs.py`` answers
attributes at run time, as vLLM's does (a module ``__getattr__`` over its
table of variables): a fix that reads a variable this release lacks at
module level passes recognition, and every static check of names, and fails
only when the module is imported. The proofs run in this interpreter, as
tests/test_series.py's do. The release tier does the same on vLLM 0.20.2 in
the managed proof environment, through the command line.
"""

from __future__ import annotations

import ast
import difflib
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.apply import WRITE, apply_tree
from deepstack_patch.engine.derived import write_derived
from deepstack_patch.engine.series import assemble_series, patches_from_folder
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.proof.imports import ImportStage, ModuleImport, module_name

from tests.support import TARGETS
from tests.test_json_schemas import errors as schema_errors

#: Variables answered at run time, unknown ones raise: in a shape that does
#: not declare its names (vLLM's own, ``if name in environment_variables``,
#: does, and a fix reading one it lacks drifts: test_derived_names.py), so
#: that only the import stage can tell.
ENVS = """environment_variables = {"VLLM_TOY_LIMIT": lambda: 42}


def __getattr__(name):
    if name.startswith("VLLM_") and name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
"""

TOY = """import vllm.envs as envs


def answer():
    return 41
"""

#: The fix as upstream wrote it, on a release whose envs.py has the variable.
FIXED = """import vllm.envs as envs

STRICT = envs.VLLM_TOY_STRICT


def answer():
    return 42
"""

#: The same fix without the module-level read.
FIXED_CLEANLY = TOY.replace("return 41", "return 42")

TEST = """from vllm.toy import answer


def test_answer_is_42():
    assert answer() == 42
"""


def git_diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        f"a/{path}" if before else "/dev/null",
        f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def make_tree(root: Path, toy: str = TOY) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "envs.py").write_text(ENVS)
    (root / "vllm" / "toy.py").write_text(toy)
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    return root


def verified(tmp_path: Path, fixed: str, toy: str = TOY, pristine: bool = True):
    """derive the fix on a pristine toy tree, apply it to a copy, verify the
    copy (against the pristine tree): the report and the patch's verdict."""
    from deepstack_patch.proof import envs, verify

    before = make_tree(tmp_path / "pristine", toy)
    after = make_tree(tmp_path / "fixed", toy)
    diff = git_diff("vllm/toy.py", toy, fixed) + git_diff("tests/test_toy.py", "", TEST)
    result = derive_patch_from_text(diff, VllmTree.open(before), "acme#5")
    folder = tmp_path / "patches"
    folder.mkdir()
    write_derived(result.patch, folder)
    series = assemble_series(SERIES, patches_from_folder(folder))
    apply_tree(VllmTree.open(after), series, {"acme#5"}, WRITE)
    written = (after / "vllm" / "toy.py").read_text()
    assert ast.dump(ast.parse(written)) == ast.dump(ast.parse(fixed))
    report = verify.verify_tree(
        VllmTree.open(after),
        series,
        {"acme#5"},
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(before) if pristine else None,
    )
    (verdict,) = report.verdicts
    return report, verdict


def test_a_fix_that_breaks_an_import_fails_the_import_stage(tmp_path: Path) -> None:
    from deepstack_patch.output.documents import verify_json
    from deepstack_patch.output.junit import junit_xml

    report, verdict = verified(tmp_path, FIXED)
    stage = verdict.imports
    assert stage is not None and stage.status == "failed"
    (module,) = stage.modules
    error = (
        "AttributeError: module 'vllm.envs' has no attribute 'VLLM_TOY_STRICT' "
        "(at vllm/toy.py:3)"
    )
    assert (module.module, module.error, module.pristine_error) == (
        "vllm.toy",
        error,
        "",
    )
    problem = (
        "import stage failed: vllm.toy imports on the pristine tree and fails "
        f"after the fix: {error}"
    )
    assert verdict.problems[0] == problem
    assert report.exit_code == 1 and not report.ok
    # Then the recorded tests, which cannot import the module either.
    assert verdict.pristine_proof.status == "failed"
    assert verdict.proof.status == "could-not-run", verdict.proof.message

    document = verify_json(report)
    assert schema_errors("verify", json.loads(json.dumps(document))) == []
    (patch,) = document["patches"]
    assert patch["imports"]["status"] == "failed"
    assert patch["imports"]["modules"][0]["outcome"] == "broken"
    assert patch["imports"]["modules"][0]["error"] == error
    assert problem in patch["problems"]
    suite = ET.fromstring(junit_xml(report))
    (case,) = [
        c for c in suite.iter("testcase") if c.get("classname") == "imports.0.20.2"
    ]
    assert case.get("name") == "acme#5"
    assert case.find("failure").get("message") == problem


def test_the_text_report_names_the_stage_and_the_error(tmp_path: Path) -> None:
    from deepstack_patch.output.tables import print_verify_report
    from rich.console import Console

    report, _ = verified(tmp_path, FIXED)
    console = Console(record=True, width=300)
    print_verify_report(console, report)
    text = console.export_text()
    assert "imports" in text.splitlines()[3]  # the table's column
    assert (
        "acme#5 imports: failed: vllm.toy imports on the pristine tree and fails "
        "after the fix: AttributeError: module 'vllm.envs' has no attribute "
        "'VLLM_TOY_STRICT' (at vllm/toy.py:3)"
    ) in text


def test_a_fix_that_imports_passes_then_its_tests_prove_it(tmp_path: Path) -> None:
    report, verdict = verified(tmp_path, FIXED_CLEANLY)
    assert verdict.imports.status == "passed"
    assert verdict.imports.message == "vllm.toy imports"
    assert verdict.pristine_proof.status == "failed"
    assert verdict.proof.status == "passed", verdict.proof.message
    assert verdict.fail_to_pass == "proven" and report.exit_code == 0


def test_a_module_that_fails_on_the_pristine_tree_too_is_not_provable(
    tmp_path: Path,
) -> None:
    """It proves nothing either way: not a pass."""
    needs = "import deepstack_no_such_package  # noqa: F401\n"
    report, verdict = verified(tmp_path, needs + FIXED_CLEANLY, needs + TOY)
    assert verdict.imports.status == "not-provable"
    (module,) = verdict.imports.modules
    assert module.outcome == "not-provable"
    missing = "ModuleNotFoundError: No module named 'deepstack_no_such_package'"
    assert module.pristine_error.startswith(missing)
    assert (
        f"import stage not provable: vllm.toy does not import here: {missing}"
        in verdict.problems[0]
    )
    assert "it fails on the pristine tree too" in verdict.problems[0]
    assert report.exit_code == 1


def test_without_a_pristine_tree_a_failing_import_is_not_provable(
    tmp_path: Path,
) -> None:
    report, verdict = verified(tmp_path, FIXED, pristine=False)
    assert verdict.imports.status == "not-provable"
    assert "no pristine tree to tell whether the fix broke it" in (
        verdict.imports.message
    )
    assert report.exit_code == 1


def test_a_patch_with_a_proof_of_its_own_has_no_import_stage(tmp_path: Path) -> None:
    """The built-in patches' proofs import the code they prove."""
    from deepstack_patch.proof import envs, verify

    tree = make_tree(tmp_path / "tree")
    report = verify.verify_tree(
        VllmTree.open(tree),
        SERIES,
        {p.id for p in SERIES},
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
    )
    assert all(v.imports is None for v in report.verdicts)


@pytest.mark.parametrize(
    ("path", "module"),
    [
        ("vllm/model_executor/models/x_mtp.py", "vllm.model_executor.models.x_mtp"),
        ("vllm/config/__init__.py", "vllm.config"),
        ("setup.py", None),
        ("vllm/README.md", None),
    ],
)  # fmt: skip
def test_module_names(path: str, module: str | None) -> None:
    assert module_name(path) == module


def test_stage_status_from_its_modules() -> None:
    ok = ModuleImport("vllm.a", "vllm/a.py", "", "")
    broken = ModuleImport("vllm.b", "vllm/b.py", "ImportError: x", "")
    unknown = ModuleImport("vllm.c", "vllm/c.py", "ImportError: y", None)
    assert ImportStage([ok]).status == "passed"
    assert ImportStage([ok, unknown]).status == "not-provable"
    assert ImportStage([ok, unknown, broken]).status == "failed"
    assert ImportStage([]).status == "not-provable"  # nothing shown: no pass


# -- a real release, in the managed proof environment ---------------------------

#: The module the synthetic fix changes: it imports vllm.envs and imports in
#: the CPU proof environment on 0.20.2.
BATCH_INVARIANT = "vllm/model_executor/layers/batch_invariant.py"
LOGGER = "logger = init_logger(__name__)\n"
#: A module-level read of a variable 0.20.2's envs.py does not define (one
#: an upstream fix may read, added to envs.py by an earlier upstream change),
#: through envs' own table by key: no static check sees a missing key (the
#: attribute `envs.VLLM_BATCH_INVARIANT_STRICT` is refused by derive's
#: declared-names check, engine/derived/declared.py).
STRICT_READ = (
    "_BATCH_INVARIANT_STRICT = "
    'envs.environment_variables["VLLM_BATCH_INVARIANT_STRICT"]()\n'
)
RELEASE_TEST = "tests/model_executor/test_batch_invariant_strict.py"
RELEASE_TEST_TEXT = """from vllm.model_executor.layers import batch_invariant


def test_strict_is_off_by_default():
    assert batch_invariant._BATCH_INVARIANT_STRICT is False
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.mark.release
@pytest.mark.verify
def test_verify_catches_a_derived_fix_that_breaks_an_import_on_0_20_2(
    proof_env: object,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """vllm#48429's kind of failure, in a shape no static check sees: derive
    (a synthetic diff on 0.20.2, made here from the release), apply, then
    verify --against-pristine: the module imported before and fails after;
    the JSON, the text and the JUnit report name the stage and the error."""
    pristine = release_tree("0.20.2")
    text = (pristine / BATCH_INVARIANT).read_text()
    assert text.count(LOGGER) == 1
    fixed = text.replace(LOGGER, LOGGER + "\n" + STRICT_READ)
    diff = tmp_path / "strict.diff"
    diff.write_text(
        git_diff(BATCH_INVARIANT, text, fixed)
        + git_diff(RELEASE_TEST, "", RELEASE_TEST_TEXT)
    )
    out = tmp_path / "patches"
    made = cli(
        "derive", "--diff", str(diff), "--base-src", str(pristine),
        "--id", "local#1", "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    tree = patched_copy("0.20.2")
    patches = ("--patches", str(out))
    done = cli("apply", "--vllm-src", str(tree), *patches, "--only", "local#1")
    assert done.returncode == 0, done.stderr
    junit = tmp_path / "verify.xml"
    verify = cli(
        "verify", "--vllm-src", str(tree), *patches, "--only", "local#1",
        "--against-pristine", "--pristine", str(pristine),
        "--junit-xml", str(junit), "--format", "json",
    )  # fmt: skip
    assert verify.returncode == 1, verify.stdout + verify.stderr
    (patch,) = json.loads(verify.stdout)["patches"]
    stage = patch["imports"]
    assert stage["status"] == "failed", stage
    (module,) = stage["modules"]
    assert module["module"] == "vllm.model_executor.layers.batch_invariant"
    assert module["pristine_error"] == ""
    assert module["error"].startswith(
        "KeyError: 'VLLM_BATCH_INVARIANT_STRICT' (at "
        "vllm/model_executor/layers/batch_invariant.py:"
    )
    assert patch["problems"][0].startswith("import stage failed: ")
    # The recorded test still ran, fail-to-pass, after the import stage.
    assert patch["pristine_proof"]["status"] == "failed"
    assert patch["proof"]["status"] == "could-not-run"
    assert patch["fail_to_pass"] == "could-not-run"
    case = next(
        c
        for c in ET.parse(junit).getroot().iter("testcase")
        if c.get("classname") == "imports.0.20.2"
    )
    assert "VLLM_BATCH_INVARIANT_STRICT" in case.find("failure").get("message")

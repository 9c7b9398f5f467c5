"""verify's one verdict per patch, in words that say what the evidence is
(issue 41 item 5, issue 42 item 2): ``proven``, ``no regression``, ``partly
proven``, ``not verified`` (with why), ``failed``; the same in the text, in
JSON and in JUnit.

- A derived patch is ``proven`` only where a recorded test of every file it
  changes passed; otherwise ``partly proven``, with the counts, and not ok.
- A recorded test that fails the same way on the pristine and the patched
  tree on something the release's own code lacks (an argument, an
  attribute) does not fit this release: not ``proof failed``.
- The built-in fixes keep their verdicts.

The fast tier runs verify's plumbing in this interpreter on small synthetic
trees, as tests/test_recorded_test_words.py does.
"""

from __future__ import annotations

import copy
import io
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.apply import WRITE, apply_tree
from deepstack_patch.engine.derived import write_derived
from deepstack_patch.engine.protocol import PatchState, RecordedTest
from deepstack_patch.engine.series import assemble_series, patches_from_folder
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.proof.exercised import covers, imported_modules
from deepstack_patch.proof.failures import release_lacks
from deepstack_patch.proof.proofs import ProofResult
from deepstack_patch.proof.recorded_tests import misfits_of
from deepstack_patch.proof.results import TestCase
from deepstack_patch.proof.verdicts import (
    WORDS,
    ChangedUnitTests,
    PatchVerdict,
)

from tests.support import TARGETS
from tests.test_json_schemas import errors
from tests.test_recorded_test_words import git_diff

ESCAPED = 'def render():\n    return "\\\\u00e9"\n'
PLAIN = 'def render():\n    return "\\u00e9"\n'

#: acme#10 changes three parsers: alpha's test passes after the fix, beta's
#: (named after it, importing none of it) needs the network, gamma has none.
ALPHA_TEST = """from vllm.parsers.alpha import render


def test_alpha_is_not_escaped():
    assert render() == "\\u00e9"
"""

BETA_TEST = """class LocalEntryNotFoundError(Exception):
    pass


LocalEntryNotFoundError.__module__ = "huggingface_hub.errors"


def test_beta_from_the_hub():
    raise LocalEntryNotFoundError("cannot find the requested files in the local cache")
"""

REGION = """class Region:
    def __init__(self, size):
        self.size = size

    def close(self):
        return "closed"
"""

#: acme#11's tests: one written for a later release (``engine_id``, which
#: this release's ``Region`` does not take), one that fits it.
REGION_TEST = """from vllm.region import Region


def test_close_of_a_region_of_an_engine():
    assert Region(size=1, engine_id="e").close() == "released"


def test_close():
    assert Region(size=1).close() == "released"
"""

SHM_TEST = """from vllm.shm import Region


def test_close_of_a_region_of_an_engine():
    assert Region(size=1, engine_id="e").close() == "released"
"""

FILES = {
    "vllm/parsers/__init__.py": "",
    "vllm/parsers/alpha.py": ESCAPED,
    "vllm/parsers/beta.py": ESCAPED,
    "vllm/parsers/gamma.py": ESCAPED,
    "vllm/region.py": REGION,
    "vllm/shm.py": REGION,
}


def fixed(path: str) -> str:
    return FILES[path].replace(ESCAPED, PLAIN).replace('"closed"', '"released"')


DIFFS = {
    "acme#10": "".join(
        git_diff(path, FILES[path], fixed(path))
        for path in ("vllm/parsers/alpha.py", "vllm/parsers/beta.py")
        + ("vllm/parsers/gamma.py",)
    )
    + git_diff("tests/parsers/test_alpha.py", "", ALPHA_TEST)
    + git_diff("tests/parsers/test_beta.py", "", BETA_TEST),
    "acme#11": git_diff("vllm/region.py", REGION, fixed("vllm/region.py"))
    + git_diff("tests/test_region.py", "", REGION_TEST),
    "acme#12": git_diff("vllm/shm.py", REGION, fixed("vllm/shm.py"))
    + git_diff("tests/test_shm.py", "", SHM_TEST),
}


def make_tree(root: Path) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    for path, text in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "tests").mkdir()
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    return root


def verified(tmp_path: Path, pristine: bool = True) -> object:
    before = make_tree(tmp_path / "pristine")
    after = make_tree(tmp_path / "fixed")
    report = derived_and_verified(
        tmp_path, DIFFS, before, after, before if pristine else None
    )
    assert (after / "vllm/parsers/gamma.py").read_text() == PLAIN
    return report


def derived_and_verified(
    tmp_path: Path,
    diffs: dict[str, str],
    base: Path,
    fixed: Path,
    pristine: Path | None,
) -> object:
    """Each diff derived on ``base`` into a patches folder, applied to
    ``fixed``, and ``fixed`` verified (against ``pristine``): the report."""
    from deepstack_patch.proof import envs, verify

    folder = tmp_path / "patches"
    folder.mkdir()
    for patch_id, diff in diffs.items():
        made = derive_patch_from_text(diff, VllmTree.open(base), patch_id)
        write_derived(made.patch, folder)
    series = assemble_series(SERIES, patches_from_folder(folder))
    apply_tree(VllmTree.open(fixed), series, set(diffs), WRITE)
    return verify.verify_tree(
        VllmTree.open(fixed),
        series,
        set(diffs),
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(pristine) if pristine else None,
    )


def text_of(report: object) -> str:
    from deepstack_patch.output.progress import console_for
    from deepstack_patch.output.tables import print_verify_report

    stream = io.StringIO()
    print_verify_report(console_for(stream), report)
    return stream.getvalue()


def test_verdicts_on_derived_patches_in_text_json_and_junit(tmp_path: Path) -> None:
    from deepstack_patch.output.documents import verify_json
    from deepstack_patch.output.junit import junit_xml

    report = verified(tmp_path)
    partly, region, shm = report.verdicts

    # acme#10: alpha's test went from fail to pass; beta's could not run and
    # gamma has none: partly proven, with the counts, and not ok.
    assert partly.pristine_proof.status == "failed"
    assert partly.proof.status == "passed", partly.proof.message
    assert partly.fail_to_pass == "partly-proven"
    said = partly.verdict
    assert said.word == "partly proven" and not said.ok
    assert said.text == (
        "partly proven: 1 of 3 changed files exercised (recorded tests: 1 "
        "passed, 1 could not run); not exercised: vllm/parsers/beta.py (1 could "
        "not run); vllm/parsers/gamma.py (no recorded test imports it or is "
        "named after it)"
    )
    assert partly.problems == [
        "2 of 3 changed files not exercised by a recorded test that passed: "
        "vllm/parsers/beta.py (1 could not run); vllm/parsers/gamma.py (no "
        "recorded test imports it or is named after it)"
    ]

    # acme#11: the test that calls Region(engine_id=...) fails alike before
    # and after, on an argument 0.20.2-like Region lacks: it does not fit,
    # and the other test proves the fix.
    assert region.proof.status == "passed", region.proof.message
    assert region.pristine_proof.status == "failed", region.pristine_proof.message
    assert region.verdict.text == "proven" and not region.problems
    assert region.proof.message.startswith(
        "recorded tests: 1 passed, 1 does not fit this release\n"
    )
    assert (
        "tests/test_region.py::test_close_of_a_region_of_an_engine: does not fit "
        "this release: TypeError: Region.__init__() got an unexpected keyword "
        "argument 'engine_id'"
    ) in region.proof.message

    # acme#12: its only test does not fit: not verified, with why; no failure.
    assert shm.proof.status == "could-not-run", shm.proof.message
    assert shm.verdict.text == (
        "not verified: could not run here: does not fit this release (it uses "
        "an argument ('engine_id') the release's own code lacks and the fix does "
        "not change); recorded tests: 1 does not fit this release"
    )
    assert "failed" not in " ".join(shm.problems)
    assert report.exit_code == 1

    # The same words in the text's rows, in JSON and in JUnit.
    text = text_of(report)
    rows = {line.split()[0]: line for line in text.splitlines() if " applied " in line}
    assert rows["acme#10"].split()[3:6] == ["passed", "failed", "partly-proven"]
    assert rows["acme#10"].endswith(said.text), text
    assert "1 passed, 1 could not run" in rows["acme#10"]
    assert " ok" not in text
    assert rows["acme#11"].split()[-1] == "proven"
    assert rows["acme#12"].endswith(shm.verdict.text)

    document = verify_json(report)
    assert errors("verify", document) == []
    unsaid = copy.deepcopy(document)
    unsaid["patches"][0]["verdict"]["word"] = "ok"  # not one of the words
    del unsaid["patches"][1]["verdict"]
    assert len(errors("verify", unsaid)) == 2, errors("verify", unsaid)
    patches = {p["id"]: p for p in document["patches"]}
    assert patches["acme#10"]["ok"] is False
    assert patches["acme#10"]["verdict"]["word"] == "partly proven"
    assert patches["acme#10"]["verdict"]["text"] == said.text
    assert patches["acme#10"]["verdict"]["recorded_tests"] == {
        "passed": 1,
        "could not run": 1,
    }
    assert [f["exercised"] for f in patches["acme#10"]["verdict"]["files"]] == [
        True,
        False,
        False,
    ]
    assert patches["acme#11"]["verdict"]["word"] == "proven"
    assert patches["acme#12"]["verdict"]["word"] == "not verified"

    suite = ET.fromstring(junit_xml(report))
    proofs = {
        c.get("name"): c
        for c in suite.iter("testcase")
        if c.get("classname") == "proof.0.20.2"
    }
    words = {
        name: case.find("properties/property[@name='verdict']").get("value")
        for name, case in proofs.items()
    }
    assert {k: words[k] for k in DIFFS} == {
        "acme#10": "partly proven",
        "acme#11": "proven",
        "acme#12": "not verified",
    }
    # Partly proven: nothing failed; an error, with the verdict's words.
    assert proofs["acme#10"].find("failure") is None
    assert proofs["acme#10"].find("error").get("message") == said.text
    assert proofs["acme#11"].find("error") is None
    assert proofs["acme#11"].find("failure") is None
    assert proofs["acme#12"].find("failure") is None


def test_without_a_pristine_tree(tmp_path: Path) -> None:
    report = verified(tmp_path, pristine=False)
    partly, region, shm = report.verdicts
    assert partly.verdict.word == "partly proven"
    # The fix's edits tell a test that does not fit without the pristine tree.
    assert region.proof.status == "passed", region.proof.message
    assert region.verdict.text == (
        "passed: fail-to-pass not checked (no --against-pristine)"
    )
    assert shm.proof.status == "could-not-run" and shm.verdict.word == "not verified"


# -- the verdict from synthetic outcomes -------------------------------------------


def case(nodeid: str, outcome: str, message: str = "") -> TestCase:
    return TestCase(nodeid, outcome, message)


def test_does_not_fit_is_what_the_release_lacks_and_the_fix_does_not_change() -> None:
    from deepstack_patch.engine.derived import DerivedPatch
    from deepstack_patch.engine.derived.data import Edit, Unit

    edit = Edit("body", removed="self.size = size\n", inserted="check(size)\n")
    unit = Unit("vllm/region.py", "method", "Region.__init__", "", "", (edit,))
    derived = DerivedPatch(
        id="acme#20", title="t", symptom="", base="0.20.2",
        paths=["vllm/region.py"], units=[unit],
    )  # fmt: skip
    lacks = "E   TypeError: X.__init__() got an unexpected keyword argument 'engine_id'"
    attribute = "E   AttributeError: 'X' object has no attribute 'engine'"
    added = "E   AttributeError: <module 'vllm.region'> has no attribute 'check'"
    wrong = "E   AssertionError: assert 41 == 42"
    absent = (
        "E   AssertionError: assert False\n"
        "E    +  where False = hasattr(<X object at 0x7f>, 'prev_step')"
    )
    present = (
        "E   AssertionError: assert not True\n"
        "E    +  where True = hasattr(<X object at 0x7f>, 'prev_step')"
    )
    name = "E   ImportError: cannot import name 'y' from 'vllm.z' (/tmp/a/vllm/z.py)"
    offline = "E   ModuleNotFoundError: No module named 'multiprocess'"
    after = ProofResult(
        "p",
        "failed",
        cases=[
            case("t.py::lacks", "failed", lacks),
            case("t.py::attribute", "failed", attribute),
            case("t.py::added", "failed", added),
            case("t.py::wrong", "failed", wrong),
            case("t.py::absent", "failed", absent),
            case("t.py::present", "failed", present),
            case("t.py::name", "error", name),
            case("t.py::offline", "error", offline),
            case("t.py::passes", "passed"),
        ],
    )
    # A name the fix's edits name is the fix's (what it adds, absent on the
    # pristine tree, shows the bug); an assertion is the fix's failure.
    lacking = "the release's own code lacks and the fix does not change"
    assert misfits_of(derived, after) == {
        "t.py::lacks": f"an argument ('engine_id') {lacking}",
        "t.py::attribute": f"an attribute ('engine') {lacking}",
        "t.py::absent": f"an attribute ('prev_step') {lacking}",
        "t.py::name": f"a name ('y') {lacking}",
    }
    # A patch that does not say what it changes: only a test that fails the
    # same way on the pristine tree (wherever that tree is) does not fit.
    written = SERIES[0]
    assert misfits_of(written, after) == {}
    before = ProofResult(
        "p",
        "failed",
        cases=[
            case("t.py::lacks", "failed", lacks),
            case("t.py::attribute", "passed"),
            case("t.py::name", "error", name.replace("/tmp/a/", "/tmp/b/")),
        ],
    )
    alike = "the release's own code lacks, failing the same way before the fix"
    assert misfits_of(written, after, before) == {
        "t.py::lacks": f"an argument ('engine_id') {alike}",
        "t.py::name": f"a name ('y') {alike}",
    }
    assert release_lacks("AssertionError: assert 1 == 2") is None


def test_changed_files_are_matched_with_tests_by_import_and_by_name() -> None:
    source = (
        "import vllm.a.one\nfrom vllm.a import two\nfrom . import near\n\n"
        "def test():\n    from vllm.b.three import f\n"
    )
    assert imported_modules(source) == {
        "vllm.a.one",
        "vllm.a",
        "vllm.a.two",
        "vllm.b.three",
        "vllm.b.three.f",
    }
    test = RecordedTest("tests/a/test_four.py", source)
    assert [
        path
        for path in (
            "vllm/a/one.py",
            "vllm/a/two.py",
            "vllm/b/three.py",
            "vllm/c/four.py",
            "vllm/a/__init__.py",
            "vllm/a/five.py",
        )
        if covers(test, path)
    ] == [
        "vllm/a/one.py",
        "vllm/a/two.py",
        "vllm/b/three.py",
        "vllm/c/four.py",
        "vllm/a/__init__.py",
    ]
    assert not covers(RecordedTest("tests/test_x.py", "def test(:\n"), "vllm/y.py")


def test_no_regression_from_the_tests_of_the_changed_units() -> None:
    """What the stage that runs the tree's tests of the changed units feeds
    (``PatchVerdict.unit_tests``), for a patch with no test of its own."""
    patch = SERIES[0]

    def without_a_test_of_its_own(tests: ChangedUnitTests | None) -> PatchVerdict:
        verdict = PatchVerdict(patch, PatchState.APPLIED, "", unit_tests=tests)
        verdict.proof = ProofResult(patch.id, "missing", "no proof: no tests\nhint: x")
        verdict.pristine_state = PatchState.NEEDED
        return verdict

    unverified = without_a_test_of_its_own(None)
    assert unverified.verdict.text == "not verified: no proof: no tests"
    assert unverified.problems == ["proof missing", "fail-to-pass not shown "
                                   "(pristine proof not run)"]  # fmt: skip
    clean = without_a_test_of_its_own(
        ChangedUnitTests(pass_to_pass=12, could_not_run=1, reasons=("no GPU",))
    )
    assert clean.verdict.text == (
        "no regression: tests of the changed units: 12 pass before and after, "
        "1 could not run (no GPU); no test of its own ran"
    )
    assert clean.verdict.ok and not clean.problems
    assert clean.json()["verdict"]["changed_unit_tests"]["pass_to_pass"] == 12
    broken = without_a_test_of_its_own(
        ChangedUnitTests(pass_to_pass=12, pass_to_fail=1)
    )
    assert broken.verdict.word == "failed"
    assert "1 test(s) of the changed units pass before the fix and fail after it" in (
        broken.problems
    )
    nothing = without_a_test_of_its_own(ChangedUnitTests(could_not_run=3))
    assert nothing.verdict.word == "not verified"


def test_not_verified_says_why_whatever_kept_it_from_being_shown() -> None:
    from deepstack_patch.proof.imports import ImportStage, ModuleImport

    patch = SERIES[0]
    unknown = ModuleImport("vllm.c", "vllm/c.py", "ImportError: y", None)
    verdict = PatchVerdict(patch, PatchState.APPLIED, "")
    verdict.imports = ImportStage([unknown])
    verdict.proof = ProofResult(patch.id, "passed", "recorded tests: 1 passed")
    # Its tests passed, but its module's import proves nothing either way:
    # the stage's words, never the proof's "1 passed" as if that were why.
    assert verdict.verdict.word == "not verified"
    assert verdict.verdict.why == verdict.imports.problem
    assert verdict.verdict.why.startswith("import stage not provable: ")
    verdict.proof = ProofResult(patch.id, "could-not-run", "could not run here: x\ny")
    assert verdict.verdict.why == "could not run here: x"


def test_built_in_fixes_keep_their_verdicts() -> None:
    """A fix with a proof of its own: the same ok and problems as before,
    and the word its fail-to-pass says."""
    patch = SERIES[0]

    def built_in(before: str | None, pristine: PatchState) -> PatchVerdict:
        verdict = PatchVerdict(patch, PatchState.APPLIED, "")
        verdict.proof = ProofResult(patch.id, "passed")
        if before is not None:
            verdict.pristine_state = pristine
            verdict.pristine_proof = ProofResult(patch.id, before)
        return verdict

    proven = built_in("failed", PatchState.NEEDED)
    assert (proven.fail_to_pass, proven.verdict.text) == ("proven", "proven")
    assert proven.problems == [] and proven.verdict.files == ()
    upstream = built_in("passed", PatchState.APPLIED)
    assert upstream.verdict.text == "fixed upstream" and not upstream.problems
    alone = built_in(None, PatchState.NEEDED)
    assert alone.verdict.text == (
        "passed: fail-to-pass not checked (no --against-pristine)"
    )
    assert not alone.problems
    not_shown = built_in("passed", PatchState.NEEDED)
    assert not_shown.verdict.word == "failed"
    assert not_shown.problems == ["fail-to-pass not shown (pristine proof passed)"]
    needed = PatchVerdict(patch, PatchState.NEEDED, "")
    needed.proof = ProofResult(patch.id, "failed")
    assert needed.verdict.word == "not verified"
    assert needed.verdict.why.startswith("not applied to this tree")
    assert {
        built_in("failed", PatchState.NEEDED).verdict.word,
        upstream.verdict.word,
        alone.verdict.word,
        not_shown.verdict.word,
        needed.verdict.word,
    } <= set(WORDS)


#: acme#13 is carried on top of another fix (which adds ``check`` to
#: ``vllm/helpers.py``), as vllm#50358 on vllm#48879: drifted on the release
#: as released, so its recorded tests run on the patched tree alone.
HELPERS = "def other():\n    return 0\n"
CHECKED = HELPERS + "\n\ndef check(size):\n    return size\n"
CARRIED = REGION
CARRIED_FIXED = "from vllm.helpers import check\n\n\n" + REGION.replace(
    "self.size = size", "self.size = check(size)"
)


def test_a_fix_drifted_on_the_pristine_tree_tells_a_test_that_does_not_fit(
    tmp_path: Path,
) -> None:

    def tree(root: Path, helpers: str) -> Path:
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "__init__.py").write_text("")
        (root / "vllm" / "helpers.py").write_text(helpers)
        (root / "vllm" / "carried.py").write_text(CARRIED)
        (root / "PKG-INFO").write_text(
            "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
        )
        return root

    base = tree(tmp_path / "base", CHECKED)  # the other fix's result upstream
    pristine = tree(tmp_path / "pristine", HELPERS)
    fixed = tree(tmp_path / "fixed", CHECKED)  # the other fix carried
    diff = git_diff("vllm/carried.py", CARRIED, CARRIED_FIXED) + git_diff(
        "tests/test_carried.py", "", SHM_TEST.replace("vllm.shm", "vllm.carried")
    )
    report = derived_and_verified(tmp_path, {"acme#13": diff}, base, fixed, pristine)
    (carried,) = report.verdicts
    assert carried.pristine_state is PatchState.DRIFTED
    assert carried.pristine_proof is None
    assert carried.proof.status == "could-not-run", carried.proof.message
    assert carried.verdict.word == "not verified"
    assert "does not fit this release" in carried.verdict.text
    assert not any("proof failed" in problem for problem in carried.problems)


def test_the_release_tests_stage_feeds_the_verdict_and_says_a_regression_once() -> None:
    """The stage's outcomes (release_tests.py), counted into the verdict:
    pass-to-pass alone is `no regression`; a pass-to-fail fails it, in the
    stage's own words (with the test), not twice."""
    from deepstack_patch.proof.impact import Selection
    from deepstack_patch.proof.release_tests import ReleaseTests, TestOutcome

    patch = SERIES[0]
    passing = [TestOutcome(f"tests/t.py::test_{n}", "passed", "passed") for n in "ab"]
    release = ReleaseTests(Selection(), 120.0, pass_to_pass=passing)
    release.could_not_run = [TestOutcome("tests/t.py::test_c", "", "", "no GPU")]
    counted = ChangedUnitTests.of(release)
    assert (counted.pass_to_pass, counted.could_not_run) == (2, 1)
    assert counted.reasons == ("no GPU",)

    verdict = PatchVerdict(patch, PatchState.APPLIED, "", unit_tests=counted)
    verdict.release_tests = release
    verdict.proof = ProofResult(patch.id, "missing", "no proof: no tests\nhint: x")
    verdict.pristine_state = PatchState.NEEDED
    assert verdict.verdict.word == "no regression" and not verdict.problems

    # Tests that passed without running the changed code are no evidence,
    # and the verdict says they are why.
    release.not_reached, release.pass_to_pass = release.pass_to_pass, []
    verdict.unit_tests = ChangedUnitTests.of(release)
    assert verdict.verdict.word == "not verified"
    assert verdict.verdict.text == (
        "not verified: no proof: no tests; tests of the changed units: 2 pass "
        "without running the changed code, 1 could not run (no GPU)"
    )
    assert verdict.json()["verdict"]["changed_unit_tests"]["not_reached"] == 2
    release.pass_to_pass, release.not_reached = release.not_reached, []

    release.pass_to_fail = [TestOutcome("tests/t.py::test_d", "passed", "failed", "E")]
    verdict.unit_tests = ChangedUnitTests.of(release)
    assert verdict.verdict.word == "failed"
    assert release.problem in verdict.problems
    assert not [p for p in verdict.problems if "fail after it" in p]  # said once


#: Imports both parsers and calls alpha's alone: gamma's module is imported,
#: its changed function never runs.
BOTH_TEST = """from vllm.parsers import gamma
from vllm.parsers.alpha import render


def test_alpha_only():
    assert render() == "\\u00e9"
    assert callable(gamma.render)
"""


def test_a_recorded_test_that_imports_a_changed_file_but_never_runs_it(
    tmp_path: Path,
) -> None:
    """By import, the test covers both files it changes; run on the fixed tree
    with their changed functions' lines watched, it ran alpha's alone. The
    fix is partly proven, and gamma's test is told as one that passed
    without running its changed code."""
    before = make_tree(tmp_path / "pristine")
    after = make_tree(tmp_path / "fixed")
    paths = ("vllm/parsers/alpha.py", "vllm/parsers/gamma.py")
    diff = "".join(git_diff(path, FILES[path], fixed(path)) for path in paths)
    diff += git_diff("tests/parsers/test_both.py", "", BOTH_TEST)
    report = derived_and_verified(tmp_path, {"acme#20": diff}, before, after, before)
    (both,) = report.verdicts
    assert (both.pristine_proof.status, both.proof.status) == ("failed", "passed")
    assert both.proof.watched == {
        "vllm/parsers/alpha.py::render",
        "vllm/parsers/gamma.py::render",
    }
    assert both.verdict.text == (
        "partly proven: 1 of 2 changed files exercised (recorded tests: 1 "
        "passed); not exercised: vllm/parsers/gamma.py (1 passed without "
        "running its changed code)"
    )

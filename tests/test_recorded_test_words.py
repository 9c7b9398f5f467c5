"""verify's words for a derived patch's recorded tests (issue 36 item 3).

- Only the tests the pull request added or changed run (``derive`` records
  their names), never the rest of the upstream test file.
- A test that fails because the proof environment has no network (the
  Hugging Face Hub's ``LocalEntryNotFoundError``), lacks a package or a GPU
  *could not run*: not ``proof failed``, not ``not-proven``.
- A failure's message is the assertion or the exception, never a lone ``)``.
- The table and the text below it say the same.
- The hint to derive again names the patch's own pull request's diff, and
  is not given for a patch derived from the merged commit.

The fast tier runs verify's plumbing in this interpreter on a small
synthetic tree, as tests/test_series.py does; the command line, in the
managed proof environment, is the ``verify``-marked test at the end.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deepstack_patch.authoring.changed_tests import changed_tests
from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.apply import WRITE, apply_tree
from deepstack_patch.engine.derived import load_derived, write_derived
from deepstack_patch.engine.series import assemble_series, patches_from_folder
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.proof.failures import environment_cause, failure_summary

from tests.support import TARGETS

TOY = """def answer():
    return 41


def model_name():
    return "toy"
"""

FIXED = TOY.replace("return 41", "return 42").replace('"toy"', '"toy-2"')

#: The test file as the release has it: one test that fails on every tree.
#: If verify ran the whole file, this would fail the fix's proof.
TEST_BEFORE = """from vllm.toy import answer


def test_unrelated_and_broken_everywhere():
    assert answer() == "never"
"""

#: What the pull request adds: a test whose failure shows an object with a
#: repr over several lines (the message's last line is ")").
TEST_AFTER = (
    TEST_BEFORE
    + """

class Reply:
    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return self.n == other.n

    def __repr__(self):
        return f"Reply(\\n    n={self.n},\\n)"


def test_answer_is_42():
    reply = Reply(answer())
    if reply != Reply(42):
        raise AssertionError(f"unexpected {reply!r}")
"""
)

#: Stands for huggingface_hub's error (not installed in the fast tier's
#: interpreter), with the name pytest reports for the real one.
OFFLINE_TEST = """from vllm.toy import model_name


class LocalEntryNotFoundError(Exception):
    pass


LocalEntryNotFoundError.__module__ = "huggingface_hub.errors"


def test_model_from_the_hub():
    raise LocalEntryNotFoundError(
        "An error happened while trying to locate the file on the Hub and we "
        "cannot find the requested files in the local cache."
    )
    assert model_name() == "toy-2"
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
    (root / "vllm" / "toy.py").write_text(toy)
    (root / "tests").mkdir()
    (root / "tests" / "test_toy.py").write_text(TEST_BEFORE)
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    return root


#: Two fixes of the toy: acme#5 (its test added to the release's file, which
#: has a broken test of its own) and acme#6 (its only test needs the Hub).
DIFFS = {
    "acme#5": git_diff("vllm/toy.py", TOY, TOY.replace("return 41", "return 42"))
    + git_diff("tests/test_toy.py", TEST_BEFORE, TEST_AFTER),
    "acme#6": git_diff("vllm/toy.py", TOY, TOY.replace('"toy"', '"toy-2"'))
    + git_diff("tests/test_hub.py", "", OFFLINE_TEST),
}


def derived_folder(tmp_path: Path, pristine: Path) -> Path:
    folder = tmp_path / "patches"
    folder.mkdir()
    for patch_id, diff in DIFFS.items():
        made = derive_patch_from_text(diff, VllmTree.open(pristine), patch_id)
        write_derived(made.patch, folder)
    return folder


# -- which tests run -------------------------------------------------------------


def test_derive_records_only_the_tests_the_diff_added_or_changed(
    tmp_path: Path,
) -> None:
    pristine = make_tree(tmp_path / "pristine")
    folder = derived_folder(tmp_path, pristine)
    patch = load_derived(folder / "acme-5.toml")
    (test,) = patch.recorded_tests
    assert test.names == ("test_answer_is_42",)
    assert test.nodeids == ["tests/test_toy.py::test_answer_is_42"]
    assert 'names = ["test_answer_is_42"]' in (folder / "acme-5.toml").read_text()
    (hub,) = load_derived(folder / "acme-6.toml").recorded_tests
    assert hub.names == ("test_model_from_the_hub",)  # a new file: all of it


CHANGED = [
    # A test of its own: changed or new; a formatting change is no change.
    ("def test_a():\n    assert 1\n", "def test_a():\n    assert 2\n", ["test_a"]),
    ("def test_a():\n    assert 1\n", "def test_a():\n    assert (1)\n", []),
    ("", "def test_a():\n    pass\n\n\ndef helper():\n    pass\n", ["test_a"]),
    # A fixture it takes by name changed, or a helper it calls, or one the
    # helper calls.
    (
        "import pytest\n\n@pytest.fixture\ndef f():\n    return 1\n\n\n"
        "def test_a(f):\n    pass\n\n\ndef test_b():\n    pass\n",
        "import pytest\n\n@pytest.fixture\ndef f():\n    return 2\n\n\n"
        "def test_a(f):\n    pass\n\n\ndef test_b():\n    pass\n",
        ["test_a"],
    ),
    (
        "def low():\n    return 1\n\n\ndef high():\n    return low()\n\n\n"
        "def test_a():\n    assert high()\n\n\ndef test_b():\n    pass\n",
        "def low():\n    return 2\n\n\ndef high():\n    return low()\n\n\n"
        "def test_a():\n    assert high()\n\n\ndef test_b():\n    pass\n",
        ["test_a"],
    ),
    # Methods of a test class by class::method; a changed class attribute
    # makes every test of the class changed.
    (
        "class TestX:\n    def test_a(self):\n        pass\n\n"
        "    def test_b(self):\n        pass\n",
        "class TestX:\n    def test_a(self):\n        pass\n\n"
        "    def test_b(self):\n        assert 0\n",
        ["TestX::test_b"],
    ),
    (
        "class TestX:\n    k = 1\n\n    def test_a(self):\n        pass\n",
        "class TestX:\n    k = 2\n\n    def test_a(self):\n        pass\n",
        ["TestX::test_a"],
    ),
    # Not parseable: nothing named, the whole file runs.
    ("def test_a(:\n", "def test_a():\n    pass\n", []),
]


@pytest.mark.parametrize(("before", "after", "expected"), CHANGED)
def test_changed_tests(before: str, after: str, expected: list[str]) -> None:
    assert list(changed_tests(before, after)) == expected


# -- what a failure says ---------------------------------------------------------


def test_environment_causes_are_told_from_the_codes_failures() -> None:
    hub = (
        "huggingface_hub.errors.LocalEntryNotFoundError: An error happened "
        "while trying to locate the file on the Hub"
    )
    assert environment_cause(hub) == "no network"
    missing = "E   ModuleNotFoundError: No module named 'anthropic'"
    assert environment_cause(missing) == "the package 'anthropic' is not installed"
    assert environment_cause("RuntimeError: No CUDA GPUs are available") == "no GPU"
    # Seen on 0.20.2 (vllm#35540's and vllm#42233's recorded tests).
    vocab = (
        "openai_harmony.HarmonyError: error downloading or loading vocab "
        "file: failed to download or load vocab file"
    )
    assert environment_cause(vocab) == "no network"
    bench = "ImportError: Please install vllm[bench] for bench support"
    assert environment_cause(bench) == "vLLM's optional extra 'bench' is not installed"
    # Seen on 0.20.2's own tests of the 40-fix batch (2026-11-29): a test
    # that binds a fixed port while the other tree's run has it, and a
    # test that calls a compiled operator a source tree lacks.
    port = (
        "torch.distributed.DistNetworkError: The server socket has failed to "
        "listen on any local network address. port: 12345, useIpv6: false, "
        "code: -98, name: EADDRINUSE, message: address already in use"
    )
    assert environment_cause(port) == (
        "a network port it listens on was taken (both trees' tests run at once)"
    )
    ops = "AttributeError: '_OpNamespace' '_C' object has no attribute 'fused_add'"
    assert environment_cause(ops) == (
        "vLLM's compiled operators (_C) are not built in a source tree"
    )
    cumem = "AssertionError: cumem allocator is not available"
    assert environment_cause(cumem) == "no GPU"
    # The tree's own code failing is the code's failure, not the environment's.
    assert environment_cause("E   ModuleNotFoundError: No module named 'vllm.x'") == ""
    assert environment_cause("ImportError: cannot import name 'y' from 'vllm.z'") == ""
    assert environment_cause("AssertionError: assert 41 == 42") == ""


def test_a_failure_summary_is_never_a_closing_bracket() -> None:
    multi_line = "AssertionError: assert Reply(\n    n=41,\n) == Reply(\n    n=42,\n)"
    assert failure_summary(multi_line) == (
        "AssertionError: assert Reply( n=41, ) == Reply( n=42, )"
    )
    report = (
        "ImportError while importing test module '/x/tests/test_t.py'.\n"
        "Hint: make sure your test modules/packages have valid Python names.\n"
        "Traceback:\n  File ...\nE   ModuleNotFoundError: No module named 'anthropic'"
    )
    assert failure_summary(report) == "ModuleNotFoundError: No module named 'anthropic'"
    rewritten = "assert 41 == 42\n +  where 41 = answer()"
    assert failure_summary(rewritten) == "assert 41 == 42 +  where 41 = answer()"
    assert failure_summary("(\n  x,\n)\n") == "x,"
    assert len(failure_summary("ValueError: " + "x" * 1000)) == 300


# -- verify, fail-to-pass ----------------------------------------------------------


def verified(tmp_path: Path) -> object:
    from deepstack_patch.proof import envs, verify

    pristine = make_tree(tmp_path / "pristine")
    fixed = make_tree(tmp_path / "fixed")
    folder = derived_folder(tmp_path, pristine)
    series = assemble_series(SERIES, patches_from_folder(folder))
    selected = set(DIFFS)
    apply_tree(VllmTree.open(fixed), series, selected, WRITE)
    assert (fixed / "vllm" / "toy.py").read_text() == FIXED
    return verify.verify_tree(
        VllmTree.open(fixed),
        series,
        selected,
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(pristine),
    )


def test_verify_runs_the_pull_requests_tests_and_says_what_could_not_run(
    tmp_path: Path,
) -> None:
    from deepstack_patch.output.documents import verify_json
    from deepstack_patch.output.progress import console_for
    from deepstack_patch.output.tables import print_verify_report

    report = verified(tmp_path)
    fix, hub = report.verdicts
    # acme#5: only its own test ran (the file's broken one did not), failing
    # before the fix with the assertion, passing after.
    assert fix.proof.message == "recorded tests: 1 passed", fix.proof.message
    assert fix.pristine_proof.status == "failed"
    assert "unrelated" not in fix.pristine_proof.message + fix.proof.message
    assert fix.pristine_proof.message.endswith(
        "tests/test_toy.py::test_answer_is_42: failed: AssertionError: "
        "unexpected Reply( n=41, )"
    ), fix.pristine_proof.message
    assert fix.fail_to_pass == "proven" and not fix.problems
    # acme#6: its test needs the network on both trees: could not run.
    for proof in (hub.proof, hub.pristine_proof):
        assert proof.status == "could-not-run", proof.message
        assert proof.message.startswith("could not run here: no network; ")
        assert "LocalEntryNotFoundError" in proof.message
    assert hub.fail_to_pass == "could-not-run"
    assert hub.problems == [
        "proof could not run",
        "fail-to-pass not shown (pristine proof could not run)",
    ]
    assert "failed" not in " ".join(hub.problems)
    assert report.exit_code == 1  # nothing was shown for acme#6: no pass

    document = verify_json(report)
    patches = {p["id"]: p for p in document["patches"]}
    assert patches["acme#6"]["fail_to_pass"] == "could-not-run"
    assert patches["acme#6"]["pristine_proof"]["status"] == "could-not-run"

    # The table and the text below it agree, row by row.
    stream = io.StringIO()
    print_verify_report(console_for(stream), report)
    text = stream.getvalue()
    rows = {line.split()[0]: line for line in text.splitlines() if " applied " in line}
    row = rows["acme#6"]
    assert row.split()[3:6] == ["could-not-run"] * 3, row
    assert "not-proven" not in row and "failed" not in row
    assert "acme#6 pristine: could not run here: no network" in text
    assert "acme#6 proof: could not run here: no network" in text
    assert rows["acme#5"].split()[3:] == ["passed", "failed", "proven", "-", "proven"]


# -- the hint of a derived patch without tests ----------------------------------------


def test_the_derive_again_hint_names_the_patchs_own_diff_or_is_not_given() -> None:
    from deepstack_patch.engine.derived import DerivedPatch
    from deepstack_patch.engine.derived.data import Unit
    from deepstack_patch.proof.recorded_tests import no_proof_reason

    unit = Unit("vllm/toy.py", "function", "answer", "", "", ())

    def patch(**fields: str) -> DerivedPatch:
        return DerivedPatch(
            id="vllm#51997", title="t", symptom="", base="0.20.2",
            paths=["vllm/toy.py"], units=[unit], **fields,
        )  # fmt: skip

    from_diff = no_proof_reason(patch())
    assert "(https://github.com/vllm-project/vllm/pull/51997.diff)" in from_diff
    assert "OWNER/REPO" not in from_diff
    other = no_proof_reason(patch(upstream_url="https://github.com/acme/vllm/pull/7"))
    assert "(https://github.com/acme/vllm/pull/7.diff)" in other
    from_commit = no_proof_reason(patch(commit="6ea6c42659" + "0" * 30))
    assert (
        "the merged commit 6ea6c4265900 it was derived from changed no test file"
        in (from_commit)
    )
    assert "derive it again" not in from_commit and ".diff" not in from_commit
    assert "--skip vllm#51997" in from_commit


# -- the command line, in the managed proof environment ----------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )


#: The same test, with the real Hugging Face Hub client of the managed
#: environment: a file not in the local cache, asked for without the network.
REAL_OFFLINE_TEST = """from huggingface_hub import hf_hub_download

from vllm.toy import model_name


def test_model_from_the_hub():
    hf_hub_download("deepstack-patch/absent", "config.json", local_files_only=True)
    assert model_name() == "toy-2"
"""


@pytest.mark.verify
def test_verify_command_says_could_not_run_and_runs_only_the_prs_tests(
    tmp_path: Path, proof_env: object
) -> None:
    """derive, apply and verify as a user runs them, in the managed proof
    environment (its real huggingface_hub): what the text and JSON say."""
    pristine = make_tree(tmp_path / "pristine")
    fixed = make_tree(tmp_path / "fixed")
    out = tmp_path / "patches"
    diffs = dict(DIFFS)
    diffs["acme#6"] = diffs["acme#6"].replace(
        git_diff("tests/test_hub.py", "", OFFLINE_TEST),
        git_diff("tests/test_hub.py", "", REAL_OFFLINE_TEST),
    )
    said = {}
    for patch_id, diff in diffs.items():
        (tmp_path / "fix.diff").write_text(diff)
        made = cli(
            "derive", "--diff", str(tmp_path / "fix.diff"), "--base-src",
            str(pristine), "--id", patch_id, "--out", str(out),
        )  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        said[patch_id] = made.stdout
    assert "  test tests/test_toy.py (test_answer_is_42)\n" in said["acme#5"]
    patches = ("--patches", str(out))
    done = cli("apply", "--vllm-src", str(fixed), *patches)
    assert done.returncode == 0, done.stdout + done.stderr
    verify = ("verify", "--vllm-src", str(fixed), *patches, "--against-pristine")
    verify += ("--pristine", str(pristine))
    text = cli(*verify)
    assert text.returncode == 1, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    row = {line.split()[0]: line for line in lines if " applied " in line}["acme#6"]
    assert "could-not-run" in row and "not-proven" not in row, text.stdout
    assert "acme#6 proof: could not run here: no network" in text.stdout
    assert "unrelated" not in text.stdout
    document = json.loads(cli(*verify, "--format", "json").stdout)
    found = {p["id"]: p for p in document["patches"]}
    assert found["acme#5"]["fail_to_pass"] == "proven"
    assert found["acme#6"]["fail_to_pass"] == "could-not-run"
    assert "LocalEntryNotFoundError" in found["acme#6"]["proof"]["message"]

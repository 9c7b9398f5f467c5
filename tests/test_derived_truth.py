"""One truth in a derived patch's data file (issue 30, item 9).

A reviewer reads each unit's ``before`` and ``after``; the engine writes its
edits. The loader refuses a file where they disagree, and fields ``derive``
checks; ``derive`` refuses an id any file of ``--out`` holds, and derives a
fix whose test file does not apply to the base without that test. Each case
runs as a user meets it: the command line in a subprocess, on a small
synthetic tree (no network).
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from deepstack_patch.engine.derived import load_derived
from deepstack_patch.engine.errors import DeepstackError

CODE = "vllm/limits.py"

BEFORE = """import os

LIMIT = 4


def clamp(n):
    if n > LIMIT:
        n = LIMIT
    return n
"""

AFTER = """import os

LIMIT = 8


def clamp(n):
    if n > LIMIT:
        n = LIMIT
    return max(n, 0)
"""

TEST = "tests/test_limits.py"

TEST_BEFORE = """from vllm.limits import clamp


def test_clamp():
    assert clamp(9) == 4
"""

TEST_AFTER = """from vllm.limits import clamp


def test_clamp():
    assert clamp(9) == 8
    assert clamp(-1) == 0
"""


def git_diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        f"a/{path}",
        f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n" + "".join(
        lines
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def make_tree(root: Path, files: dict[str, str]) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.0.1\n"
    )
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "base", {CODE: BEFORE, TEST: TEST_BEFORE})


def derive(
    tmp_path: Path,
    base: Path,
    diff_text: str,
    out: Path,
    patch_id: str = "acme#7",
    output: str = "json",
) -> subprocess.CompletedProcess[str]:
    diff = tmp_path / f"fix-{len(list(tmp_path.glob('fix-*')))}.diff"
    diff.write_text(diff_text)
    return cli(
        "derive", "--diff", str(diff), "--base-src", str(base), "--id", patch_id,
        "--out", str(out), "--format", output,
    )  # fmt: skip


@pytest.fixture
def data_file(tmp_path: Path, base: Path) -> Path:
    """The data file derive writes for the fix (two units: the module's
    ``LIMIT`` and the function ``clamp``)."""
    done = derive(tmp_path, base, git_diff(CODE, BEFORE, AFTER), tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp_path / "out" / "acme-7.toml"


def status(base: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    return cli("status", "--vllm-src", str(base), "--patches", str(folder))


def refused(data_file: Path, base: Path) -> str:
    """The loader's refusal, through `apply` (nothing written)."""
    done = cli("apply", "--vllm-src", str(base), "--patches", str(data_file.parent))
    assert done.returncode == 2, done.stdout + done.stderr
    assert (base / CODE).read_text() == BEFORE
    assert "error:" in done.stderr and str(data_file) in done.stderr
    return done.stderr


def edit(data_file: Path, old: str, new: str) -> None:
    text = data_file.read_text()
    assert text.count(old) == 1, (old, text)
    data_file.write_text(text.replace(old, new))


def inserted(code: str) -> str:
    """An edit's ``inserted`` field as the data file writes it."""
    return "inserted = '''\n" + code + "\n'''"


# -- one truth: the edits turn before into after ------------------------------


def test_a_hand_made_edit_is_refused(data_file: Path, base: Path) -> None:
    """The edit writes code the unit's ``after`` does not show; edited in
    both places, it is a change of the fix, and loads."""
    done = status(base, data_file.parent)
    assert done.returncode == 0 and "needed" in done.stdout, done.stderr
    edit(data_file, inserted("return max(n, 0)"), inserted('print("HACKED")'))
    error = refused(data_file, base)
    assert (
        "unit vllm/limits.py::clamp: its edits do not turn `before` into `after`"
        in (error)
    )
    assert '`inserted` has `print("HACKED")`' in error
    assert "`return max(n, 0)`" in error
    assert "hint: " in error and "derive it again, or edit both" in error
    edit(data_file, "    return max(n, 0)\n'''", "    print(\"HACKED\")\n'''")
    done = cli("apply", "--vllm-src", str(base), "--patches", str(data_file.parent))
    assert done.returncode == 0, done.stderr
    assert (base / CODE).read_text() == AFTER.replace(
        "return max(n, 0)", 'print("HACKED")'
    )


def test_an_agreement_kept_from_a_load_holds_only_for_those_bytes(
    data_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file found in agreement is not checked again on the next load (its
    bytes and the engine's code are the key); a byte edited is a new key."""
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DEEPSTACK_PATCH_NO_CACHE", raising=False)
    load_derived(data_file)
    assert len(list((tmp_path / "cache" / "agreed").rglob("*"))) == 2  # folder, mark
    load_derived(data_file)
    edit(data_file, inserted("return max(n, 0)"), inserted('print("HACKED")'))
    with pytest.raises(DeepstackError, match="its edits do not turn"):
        load_derived(data_file)


def test_a_hand_made_after_alone_is_refused(data_file: Path, base: Path) -> None:
    """Editing what the reviewer reads changes nothing the engine writes."""
    edit(data_file, "    return max(n, 0)\n'''", "    return min(n, 0)\n'''")
    error = refused(data_file, base)
    assert "unit vllm/limits.py::clamp" in error
    assert "`return max(n, 0)`" in error and "`return min(n, 0)`" in error


def test_a_hand_made_module_statement_is_refused(data_file: Path, base: Path) -> None:
    """A unit recorded as its statements: ``after`` is what it inserts."""
    # The edit records the lines between its neighbours, blank ones included.
    edit(data_file, "inserted = '''\n\nLIMIT = 8\n", "inserted = '''\n\nLIMIT = 80\n")
    error = refused(data_file, base)
    assert "unit vllm/limits.py::LIMIT" in error
    assert "`after` has `LIMIT = 8`" in error and "`LIMIT = 80`" in error


# -- fixed_in and upstream_url as derive checks them ----------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fixed_in", "soon", "fixed_in 'soon': not a version"),
        ("upstream_url", "github.com/x y", "upstream_url 'github.com/x y': not an"),
        ("upstream_url", "ftp://example.com/fix", "not an http(s) URL"),
    ],
)  # fmt: skip
def test_a_bad_fixed_in_or_url_is_refused_on_load(
    data_file: Path, base: Path, field: str, value: str, message: str
) -> None:
    edit(data_file, f'{field} = ""', f"{field} = {json.dumps(value)}")
    error = refused(data_file, base)
    assert message in error and "hint: " in error
    with pytest.raises(DeepstackError) as caught:
        load_derived(data_file)
    assert message in caught.value.message and caught.value.path == str(data_file)


# -- derive: an id any file of --out holds --------------------------------------


def test_an_id_held_by_a_file_of_another_name_is_refused(
    tmp_path: Path, base: Path, data_file: Path
) -> None:
    renamed = data_file.with_name("clamp-fix.toml")
    data_file.rename(renamed)
    again = derive(tmp_path, base, git_diff(CODE, BEFORE, AFTER), data_file.parent)
    assert again.returncode == 2, again.stdout + again.stderr
    error = json.loads(again.stdout)["error"]
    assert error["message"] == f"--id acme#7: already held by {renamed}"
    assert sorted(p.name for p in data_file.parent.iterdir()) == ["clamp-fix.toml"]
    # Another id goes in beside it.
    other = derive(
        tmp_path, base, git_diff(CODE, BEFORE, AFTER), data_file.parent, "acme#8"
    )
    assert other.returncode == 0, other.stderr


# -- derive: a test file whose hunks do not apply ------------------------------


def test_a_test_hunk_that_does_not_apply_leaves_the_code_derived(
    tmp_path: Path, base: Path
) -> None:
    """The test drifted since the PR (its base copy differs): the fix is
    derived, the test named and left out of the proof."""
    drifted_test = git_diff(TEST, TEST_BEFORE.replace("== 4", "== 5"), TEST_AFTER)
    new_test = "tests/test_zero.py"
    added = git_diff(new_test, "", "def test_zero():\n    pass\n").replace(
        f"--- a/{new_test}", "--- /dev/null"
    )
    out = tmp_path / "out"
    done = derive(
        tmp_path, base, git_diff(CODE, BEFORE, AFTER) + drifted_test + added, out
    )
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["tests"] == [new_test]
    (skipped,) = document["skipped_tests"]
    assert skipped["path"] == TEST
    assert skipped["reason"].startswith("its hunks do not apply to the base (hunk 1")
    assert any(
        n.startswith(f"{TEST}: its hunks do not apply") and "left out of the proof" in n
        for n in document["notes"]
    )
    patch = load_derived(out / "acme-7.toml")
    assert [t.path for t in patch.recorded_tests] == [new_test]
    assert [(s.path, s.reason) for s in patch.skipped_tests] == [
        (TEST, skipped["reason"])
    ]
    assert "[[skipped_tests]]" in (out / "acme-7.toml").read_text()
    # The text report names it too.
    code_and_test = git_diff(CODE, BEFORE, AFTER) + drifted_test
    text = derive(tmp_path, base, code_and_test, tmp_path / "t", output="text")
    assert text.returncode == 0, text.stderr
    assert f"note: {TEST}: its hunks do not apply to the base" in text.stdout


def test_a_class_header_is_its_units_before_and_after(tmp_path: Path) -> None:
    """A class whose bases change: the unit shows the header before and
    after, and a header edited in one place alone is refused."""
    from deepstack_patch.engine.derived import DerivedPatch, dump_derived
    from deepstack_patch.engine.derived.units import units_of_change

    before = "class Buffer(Base):\n    size = 8\n"
    after = "class Buffer(Base, Mixin):\n    size = 8\n"
    (unit,) = units_of_change(CODE, before, after)
    assert (unit.kind, unit.before, unit.after) == (
        "class",
        "class Buffer(Base):\n",
        "class Buffer(Base, Mixin):\n",
    )
    patch = DerivedPatch(
        id="acme#9", title="t", symptom="s", base="0.0.1", paths=[CODE], units=[unit]
    )
    path = tmp_path / "acme-9.toml"
    path.write_text(dump_derived(patch))
    assert load_derived(path).units == (unit,)
    path.write_text(
        dump_derived(patch).replace(
            "header_after = '''\nclass Buffer(Base, Mixin):",
            "header_after = '''\nclass Buffer(Base, Backdoor):",
        )
    )
    with pytest.raises(DeepstackError) as caught:
        load_derived(path)
    assert "unit vllm/limits.py::Buffer" in caught.value.message
    assert "`class Buffer(Base, Backdoor):`" in caught.value.message


def test_verify_names_the_tests_left_out_of_the_proof(
    tmp_path: Path, base: Path
) -> None:
    """The proof of a fix whose test file was left out says so: the recorded
    tests that ran are not all the pull request's."""
    from deepstack_patch.engine.series import assemble_series, patches_from_folder
    from deepstack_patch.engine.tree import VllmTree
    from deepstack_patch.patches import SERIES
    from deepstack_patch.proof import envs, verify

    from tests.support import TARGETS

    drifted_test = git_diff(TEST, TEST_BEFORE.replace("== 4", "== 5"), TEST_AFTER)
    out = tmp_path / "out"
    done = derive(tmp_path, base, git_diff(CODE, BEFORE, AFTER) + drifted_test, out)
    assert done.returncode == 0, done.stderr
    fixed = make_tree(tmp_path / "fixed", {CODE: AFTER})
    report = verify.verify_tree(
        VllmTree.open(fixed),
        assemble_series(SERIES, patches_from_folder(out)),
        {"acme#7"},
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
    )
    (verdict,) = report.verdicts
    assert verdict.proof.status == "missing"
    said, hint = verdict.proof.message.split("\n")
    assert said.endswith(
        f"no recorded tests: left out of the proof: {TEST}: its hunks do not "
        f"apply to the base (hunk 1 (@@ -2,4 +2,5 @@) of {TEST} does not apply: "
        "line 5 is 'assert clamp(9) == 4', the hunk expects "
        "'assert clamp(9) == 5')"
    )
    assert hint.startswith("hint: derive it again")
    assert report.exit_code == 1


def test_an_edit_moved_to_another_class_is_refused(tmp_path: Path) -> None:
    """The way to a method is its name: edits led into another class would
    rewrite a method the unit does not show."""
    from deepstack_patch.engine.derived import DerivedPatch, dump_derived
    from deepstack_patch.engine.derived.units import units_of_change

    before = "class Buffer:\n    def read(self):\n        return 1\n"
    after = "class Buffer:\n    def read(self):\n        return 2\n"
    (unit,) = units_of_change(CODE, before, after)
    patch = DerivedPatch(
        id="acme#9", title="t", symptom="s", base="0.0.1", paths=[CODE], units=[unit]
    )
    path = tmp_path / "acme-9.toml"
    path.write_text(dump_derived(patch))
    assert load_derived(path).units == (unit,)
    path.write_text(
        dump_derived(patch).replace(
            'header = "class Buffer:\\n"', 'header = "class Cache:\\n"'
        )
    )
    with pytest.raises(DeepstackError) as caught:
        load_derived(path)
    assert caught.value.message.endswith("its edits lead to Cache, not to Buffer.read")


def forks_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each fork of a forked child, counted (:mod:`.engine.forked`)."""
    from deepstack_patch.engine import forked

    forks: list[int] = []
    real_fork = forked.os.fork

    def fork() -> int:
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(forked.os, "fork", fork)
    # Another test may leave a thread behind; these children take no lock.
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    return forks


def lay_data_files(
    folder: Path, text: str, hacked: str, names: str, hacks: str, broken: str = ""
) -> None:
    """``folder`` holding a data file of ``text`` for each of ``names``
    (``hacked`` for those in ``hacks``; one that does not parse for
    ``broken``), each with an id of its own."""
    for old in folder.iterdir():
        old.unlink()
    for number, name in enumerate(names, 1):
        body = hacked if name in hacks else text
        body = body.replace('id = "acme#7"', f'id = "acme#{number}"')
        (folder / f"{name}.toml").write_text("[[" if name == broken else body)


@pytest.fixture
def batch(
    data_file: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str, str, list[int]]:
    """A folder for data files made of ``data_file``'s text and of that text
    with a hand-made edit, each fork counted, no agreement kept."""
    monkeypatch.setenv("DEEPSTACK_PATCH_NO_CACHE", "1")
    folder = data_file.parent / "batch"
    folder.mkdir()
    text = data_file.read_text()
    hacked = text.replace(inserted("return max(n, 0)"), inserted('print("HACKED")'))
    return folder, text, hacked, forks_counted(monkeypatch)


def test_a_folder_is_checked_side_by_side_and_its_first_disagreement_told(
    batch: tuple[Path, str, str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder's data files are checked for agreement together, the later
    ones in a forked child: the error is the one a check of each file in
    turn gives (the first file that disagrees, named with the way to leave
    it out; an earlier one's before a later file's own error), whichever
    process found it, and also where the child gives no answer."""
    from deepstack_patch.engine import forked
    from deepstack_patch.engine.series import patches_from_folder

    folder, text, hacked, forks = batch

    def lay(*names: str, broken: str = "") -> None:
        lay_data_files(folder, text, hacked, "abcd", "".join(names), broken)

    def told() -> DeepstackError:
        forks.clear()
        with pytest.raises(DeepstackError) as caught:
            patches_from_folder(folder)
        assert forks == [1]
        return caught.value

    lay()
    assert len(patches_from_folder(folder)) == 4
    for hacks, broken, named in (
        (("b", "c"), "", "b"),  # two disagree: the first is told
        (("d",), "", "d"),  # found by the child
        (("b",), "c", "b"),  # before c's own error
        ((), "c", "c"),  # a and b checked first
    ):
        lay(*hacks, broken=broken)
        error = told()
        assert error.path == str((folder / f"{named}.toml").absolute()), error
        assert f"rename it to _{named}.toml" in str(error.hint)
        assert ("its edits do not turn" in error.message) == (named != broken)
    # A child that answers nothing: its files are checked here.
    lay("d")
    monkeypatch.setattr(forked.json, "dumps", lambda _: 1 / 0)
    assert told().path == str((folder / "d.toml").absolute())


def test_status_tells_a_disagreement_found_while_it_planned(
    data_file: Path, base: Path
) -> None:
    """``status`` has the agreement worked out in a forked child while it
    plans (its first second is spent on one core), and tells it before it
    reports anything: the error loading gives (``apply``'s), exit 2."""
    edit(data_file, inserted("return max(n, 0)"), inserted('print("HACKED")'))
    done = status(base, data_file.parent)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    told = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert told and "its edits do not turn" in told[0]
    assert told == [
        line
        for line in refused(data_file, base).splitlines()
        if line.startswith("error:")
    ]


def test_a_folder_checked_while_the_command_goes_on_tells_what_a_load_would(
    batch: tuple[Path, str, str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given ``ahead``, a folder's data files are checked by one niced forked
    child, and :meth:`refuse` tells what loading tells (the first that
    disagrees, named with the way to leave it out), once. Where the child
    has not answered by then (starved on a busy host, gone, stopped) the
    check is worked out here, the child stopped. A file's own error is
    told at once, the files before it checked first, as loading does."""
    import os
    import time

    from deepstack_patch.engine import forked
    from deepstack_patch.engine.derived import truth
    from deepstack_patch.engine.series import patches_from_folder

    folder, text, hacked, forks = batch
    lay_data_files(folder, text, hacked, "abc", "bc")

    def checked(**child: object) -> truth.AgreementAhead:
        """A folder's check started (``child``: what its child is given in
        place of ``os``'s functions), its child's answer here already where
        it gives one in time; nothing worked out here unless it must be."""
        ahead: list = []
        with monkeypatch.context() as patched:
            for name, value in child.items():  # the child inherits them
                patched.setattr(os, name, value)
            assert len(patches_from_folder(folder, ahead=ahead)) == 3  # nothing told
        checking = ahead[0]._checking
        deadline = time.monotonic() + 60
        while checking._child and not checking._child.ready():
            if child or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return ahead[0]

    here: list[int] = []
    real = truth._first_disagreement
    monkeypatch.setattr(
        truth, "_first_disagreement", lambda units: here.append(1) or real(units)
    )
    # The child's answer: nothing worked out here.
    forks.clear()
    first = checked()
    assert forks == [1]
    with pytest.raises(DeepstackError) as caught:
        first.refuse()
    assert caught.value.path == str((folder / "b.toml").absolute())
    assert "rename it to _b.toml" in str(caught.value.hint)
    assert here == []
    first.refuse()  # told once
    # A child not done (it waits), one whose parent is gone (its ppid
    # another: it ends at once), one stopped: worked out here, the same.
    stopped: list[int] = []
    real_stop = forked.Forked.stop
    monkeypatch.setattr(
        forked.Forked, "stop", lambda self: stopped.append(1) or real_stop(self)
    )
    slow = checked(nice=lambda _: time.sleep(120))
    gone = checked(getppid=lambda: -1)
    cut = checked()
    cut.stop()
    for each in (slow, gone, cut):
        here.clear()
        with pytest.raises(DeepstackError, match="its edits do not turn") as caught:
            each.refuse()
        assert caught.value.path == str((folder / "b.toml").absolute())
        assert here
    assert len(stopped) >= 2  # the slow one's and the cut one's
    # A file that does not load is told at once, those before it checked.
    (folder / "c.toml").write_text("[[")
    with pytest.raises(DeepstackError) as caught:
        patches_from_folder(folder, ahead=[])
    assert caught.value.path == str((folder / "b.toml").absolute())

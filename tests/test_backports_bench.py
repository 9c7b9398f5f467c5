"""The backports bench (bench/backports.py) maps a release difference to the
commits behind it and compares a tool's write with the maintainers' result,
on synthetic files: a made-up module in three states (the earlier release,
the later one, a commit's parent and result) and a scratch git repository
for the commit. No network, no vLLM.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import backports  # noqa: E402

PATH = "vllm/layers.py"
#: The earlier release: two functions and a constant.
PREV = (
    "import os\n\n\ndef f(x):\n    y = x + 1\n    return y\n\n\n"
    "def g():\n    return os.sep\n\n\nLIMIT = 4\n"
)
#: The fix behind the backport: f clamps its result.
FIX = ("    return y\n", "    return min(y, LIMIT)\n")
#: Another backport of the same release, elsewhere in the file.
OTHER = ("    return os.sep\n", "    return os.sep * 2\n")
#: The later release: both backports.
NEXT = PREV.replace(*FIX).replace(*OTHER)


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose last commit is the fix, on a parent whose header
    of f differs from the release's (main moved on); its git dir."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    work = tmp_path / "upstream"
    (work / "vllm").mkdir(parents=True)
    parent = PREV.replace("def f(x):", "def f(x, /):")
    (work / PATH).write_text(parent)
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "parent")
    (work / PATH).write_text(parent.replace(*FIX))
    _git(work, "commit", "-q", "-am", "[Bugfix] clamp f (#1)")
    return work / ".git", _git(work, "rev-parse", "HEAD").strip()


def _release(tmp_path: Path, name: str, text: str) -> Path:
    tree = tmp_path / name
    (tree / "vllm").mkdir(parents=True)
    (tree / PATH).write_text(text)
    return tree


def test_a_backport_is_mapped_and_the_rest_is_left_unmapped(upstream) -> None:
    repo, sha = upstream
    changes = backports.parse_diff(backports.commit_diff(repo, sha, "-U1"))
    assert [(c.path, c.kind, len(c.hunks)) for c in changes] == [(PATH, "modified", 1)]
    share = backports.carried(changes, {PATH: PREV}, {PATH: NEXT})
    assert (share.kind, share.carried, share.hunks) == ("backported", 1, 1)
    # f's return line is the fifth (0-based) of the earlier release.
    assert share.spans == {PATH: [(5, 6)]}
    # The other backport's block is the one that no commit explains.
    assert backports.unmapped([PATH], {PATH: PREV}, {PATH: NEXT}, [share]) == [
        f"{PATH}:10"
    ]


def test_a_commit_the_later_release_lacks_or_the_earlier_has_is_not_mapped(
    upstream,
) -> None:
    repo, sha = upstream
    changes = backports.parse_diff(backports.commit_diff(repo, sha, "-U1"))
    not_carried = PREV.replace(*OTHER)
    assert backports.carried(changes, {PATH: PREV}, {PATH: not_carried}).kind == ""
    already = PREV.replace(*FIX)
    assert backports.carried(changes, {PATH: already}, {PATH: NEXT}).kind == ""


def test_an_insertion_the_earlier_release_already_has_is_not_carried() -> None:
    # With one line of context, the pre-image (the class line, then the
    # decorator) also reads in the post-image, where the method is inserted
    # first: a release that has the method holds both.
    diff = (
        "diff --git a/vllm/b.py b/vllm/b.py\n--- a/vllm/b.py\n+++ b/vllm/b.py\n"
        "@@ -1,2 +1,5 @@\n class B:\n+    @staticmethod\n+    def name():\n"
        "+        return 'b'\n     @staticmethod\n"
    )
    without = "class B:\n    @staticmethod\n    def size():\n        return 1\n"
    with_it = without.replace(
        "class B:\n",
        "class B:\n    @staticmethod\n    def name():\n        return 'b'\n",
    )
    changes = backports.parse_diff(diff)
    path = "vllm/b.py"
    assert backports.carried(changes, {path: without}, {path: with_it}).kind == (
        "backported"
    )
    assert backports.carried(changes, {path: with_it}, {path: with_it}).kind == ""


def test_a_hunk_line_that_reads_like_a_header_is_code() -> None:
    diff = (
        "diff --git a/vllm/c.py b/vllm/c.py\n--- a/vllm/c.py\n+++ b/vllm/c.py\n"
        "@@ -1,2 +1,2 @@\n x = 1\n--- x\n+++ x\n"
    )
    # A removed line "-- x" and an added "++ x": code, not a header.
    [change] = backports.parse_diff(diff)
    [hunk] = change.hunks
    assert (hunk.pre, hunk.post) == (["x = 1", "-- x"], ["x = 1", "++ x"])
    assert (hunk.lo, hunk.hi) == (1, 2)


def test_an_added_file_is_carried_where_only_the_later_release_has_it() -> None:
    diff = (
        "diff --git a/vllm/new.py b/vllm/new.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/vllm/new.py\n@@ -0,0 +1 @@\n+X = 1\n"
    )
    changes = backports.parse_diff(diff)
    assert backports.carried(changes, {}, {"vllm/new.py": "X = 1\n"}).kind == (
        "backported"
    )
    assert backports.carried(changes, {"vllm/new.py": "X = 1\n"}, {}).kind == ""


@pytest.mark.parametrize(
    ("written", "verdict"),
    [
        # The fix alone: the maintainers' result, though the later release
        # also holds another backport in g.
        (PREV.replace(*FIX), "same"),
        # The same code, other text.
        (PREV.replace(*FIX).replace("min(y, LIMIT)", "min(y,LIMIT)"), "same-ast"),
        # Other code where the fix goes.
        (PREV.replace("    return y\n", "    return max(y, LIMIT)\n"), "differs"),
        # The fix, and a change the maintainers did not make.
        (PREV.replace(*FIX).replace("LIMIT = 4", "LIMIT = 8"), "differs"),
        # Nothing written where the maintainers carried the fix.
        (PREV, "differs"),
    ],
)
def test_a_write_is_compared_with_the_maintainers_result_of_the_fix_alone(
    tmp_path: Path, written: str, verdict: str
) -> None:
    prev = _release(tmp_path, "prev", PREV)
    next_ = _release(tmp_path, "next", NEXT)
    ours = _release(tmp_path, "ours", written)
    seeds = {PATH: [(5, 6)]}
    found, differs = backports.compare([PATH], prev, next_, ours, seeds, [])
    assert found == verdict
    assert bool(differs) == (verdict != "same")


def test_no_file_compared_is_no_verdict(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no vllm"):
        backports.compare([], tmp_path, tmp_path, tmp_path, {}, [])


def test_the_maintainers_text_grows_to_the_blocks_it_meets() -> None:
    # The maintainers wrote the fix with one more line beside it: the region
    # of the fix grows to that line too; g's backport stays out.
    next_ = NEXT.replace(FIX[1], FIX[1].replace("return", "z = 0\n    return"))
    expected = backports.maintainers_text(PREV, next_, PREV, [(5, 6)])
    assert expected == PREV.replace(*FIX).replace(
        FIX[1], FIX[1].replace("return", "z = 0\n    return")
    )


def test_git_apply_fails_where_3way_merges_with_the_parent_blobs(
    upstream, tmp_path: Path
) -> None:
    repo, sha = upstream
    # The release's header of f differs from the parent's two lines above
    # the fix: within git apply's context, so it refuses; a 3-way merge is
    # clean.
    prev = _release(tmp_path, "prev", PREV)
    diff = backports.commit_diff(repo, sha, "--full-index", "--binary")
    plain = backports.git_apply(diff, prev, [PATH], tmp_path / "plain")
    assert (plain.verdict, plain.reason) == ("refused", "does not apply")
    merged = backports.git_apply_3way(diff, prev, [PATH], tmp_path / "3way", repo, sha)
    assert merged.verdict == ""
    assert (tmp_path / "3way" / PATH).read_text() == PREV.replace(*FIX)
    assert not (tmp_path / "3way" / ".git").exists()


def test_the_tool_is_an_executable_or_a_python() -> None:
    assert backports.tool_command("/v/bin/deepstack-patch") == [
        "/v/bin/deepstack-patch"
    ]
    assert backports.tool_command("/v/bin/python3") == [
        "/v/bin/python3",
        "-m",
        "deepstack_patch",
    ]
    assert backports.tool_command(None)[1:] == ["-m", "deepstack_patch"]


# -- a commit judged after its partner -------------------------------------------

UTIL = "vllm/util.py"
LAYERS = "vllm/layers.py"
#: The earlier release: a helper module and a layer that uses it.
BASE_FILES = {
    "vllm/__init__.py": "",
    UTIL: "def double(x):\n    return 2 * x\n",
    LAYERS: "from vllm.util import double\n\n\ndef f(x):\n    return double(x)\n",
}
#: The partner: adds `clamp` to the helper module.
PARTNER = (UTIL, "def clamp(x):\n    return min(x, 4)\n\n\n")
#: The fix: the layer clamps, with the partner's `clamp`.
OWN = (
    LAYERS,
    "from vllm.util import clamp, double\n\n\ndef f(x):\n    return clamp(double(x))\n",
)


def _write(folder: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)


def _with_partner(files: dict[str, str], partner: tuple[str, str]) -> dict[str, str]:
    path, added = partner
    return {**files, path: added + files[path]}


@pytest.fixture
def paired(tmp_path: Path) -> dict:
    """Upstream's main with the partner, then the fix; the two releases
    (the later one carries both); the pair as the data file maps it."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    work = tmp_path / "upstream"
    _write(work, BASE_FILES)
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "parent")
    with_partner = _with_partner(BASE_FILES, PARTNER)
    fixed = {**with_partner, OWN[0]: OWN[1]}
    commits = []
    for files, subject in (
        (with_partner, "[Feature] clamp (#1)"),
        (fixed, "[Bugfix] clamp f (#2)"),
    ):
        _write(work, files)
        _git(work, "commit", "-q", "-am", subject)
        sha = _git(work, "rev-parse", "HEAD").strip()
        commits.append({"sha": sha, "subject": subject, "kind": "backported"})
    trees = {}
    for version, files in (("0.1.0", BASE_FILES), ("0.1.1", fixed)):
        tree = tmp_path / "trees" / version
        _write(tree, files)
        (tree / "PKG-INFO").write_text(f"Name: vllm\nVersion: {version}\n")
        (tree / "pyproject.toml").write_text('[project]\nname = "vllm"\n')
        trees[version] = tree
    pair = {"prev": "0.1.0", "next": "0.1.1", "commits": commits}
    return {
        "repo": work / ".git",
        "trees": trees,
        "pair": pair,
        "run": tmp_path / "run",
    }


def _judged(paired: dict, index: int) -> dict:
    pair = paired["pair"]
    commit = {**pair["commits"][index], "prev": "0.1.0", "next": "0.1.1"}
    (paired["run"] / "derived").mkdir(parents=True, exist_ok=True)
    job = (
        commit,
        paired["repo"],
        paired["trees"],
        backports.tool_command(None),
        paired["run"],
        backports.earlier_in_pair([pair], commit),
    )
    record = backports.judge_commit(job)
    assert "failed" not in record, record["failed"]
    return {r["tool"]: r for r in record["results"]}


def test_a_fix_refused_for_a_name_its_partner_adds_is_judged_after_it(
    paired: dict,
) -> None:
    results = _judged(paired, 1)
    ours = results["deepstack-patch"]
    assert (ours["verdict"], ours["partner"]) == (
        "same",
        f"vllm#1 ({paired['pair']['commits'][0]['sha'][:12]})",
    )
    # Alone, it was refused for the name: the reason says so.
    assert "judged after its partner vllm#1" in ours["reason"]
    assert "clamp" in ours["reason"].split("alone: ", 1)[1]
    # The textual tools are judged after the same partner, each applying it
    # first with itself: the three carry the same pair.
    for tool in ("git apply", "git apply --3way"):
        assert (results[tool]["verdict"], results[tool]["partner"]) == (
            "same",
            ours["partner"],
        )
    # The partner itself is judged alone.
    assert _judged(paired, 0)["deepstack-patch"]["partner"] == ""


def test_no_earlier_commit_adds_the_name_and_the_refusal_stands(paired: dict) -> None:
    paired["pair"]["commits"].reverse()  # the fix first: no partner before it
    ours = _judged(paired, 0)["deepstack-patch"]
    assert (ours["verdict"], ours["partner"]) == ("refused", "")


def test_a_partner_is_looked_for_only_for_a_lacked_name_or_definition() -> None:
    reason = (
        "drifted: a.py::f: the fix's code cannot run in this release (ty: "
        "Argument `aux_stream_list` does not match any known parameter of "
        "`Layer.__init__` [unknown-argument])"
    )
    assert backports.lacked_names(reason) == ["aux_stream_list"]
    assert backports.lacked_names(
        "drifted: the fix reads `MoERunner._quant_method`, which this release lacks"
    ) == ["_quant_method"]
    assert backports.lacked_names("drifted: `x = 1` not found in def f") == []
    # A definition absent beside parts that are there (vllm#30566 changes
    # `Base._decorate_cls_for_torch_compile`, which vllm#30518 adds).
    assert backports.lacked_names(
        "drifted: a.py::Base.g: method Base.g in a.py is absent while f is "
        "needed: it applies whole or not at all"
    ) == ["g"]


def test_a_diff_adds_a_name_it_writes_more_often_than_it_removes() -> None:
    diff = (
        "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,3 @@\n"
        "-    streams = [s]\n+    streams = [s, t]\n+def g(streams): ...\n"
    )
    assert backports.adds(diff, "streams")
    assert not backports.adds(diff, "s")  # one removed, one added
    assert not backports.adds(diff, "stream")

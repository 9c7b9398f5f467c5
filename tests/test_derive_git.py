"""``derive --commit``: a derived patch from a commit of a git clone.

The clone is built here: a small made-up ``vllm/`` package, a tag, and a
fix commit whose subject ends in the pull request's number, as upstream
squash-merges them. Also the ``--diff`` cases this brings: a format-patch's
subject as the title, and a tree with no version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.engine.context import TreeContext
from deepstack_patch.engine.derived import load_derived
from deepstack_patch.engine.tree import ASKED_FOR

PATH = "vllm/sampler.py"
TEST_PATH = "tests/test_sampler.py"

BEFORE = '''"""A made-up sampler."""

LIMIT = 4


class Sampler:
    def __init__(self, n):
        self.n = n

    def clamp(self, x):
        if x > LIMIT:
            x = LIMIT
        return x
'''

AFTER = BEFORE.replace("        return x\n", "        return max(x, 0)\n")

SUBJECT = "[Bugfix] Clamp negative sampler values to zero (#123)"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@e.st",
         "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip


def commit_files(repo: Path, files: dict[str, str], subject: str) -> str:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def clone(tmp_path: Path) -> tuple[Path, str]:
    """A clone with a tag v0.1.0, the fix on top of it, and a later commit."""
    repo = tmp_path / "vllm-clone"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit_files(
        repo,
        {
            "vllm/__init__.py": "",
            PATH: BEFORE,
            TEST_PATH: "def test_clamp():\n    pass\n",
            "README.md": "made up\n",
            # A checkout is whole: what is not in it is not in the release.
            "pyproject.toml": "[project]\nname = 'vllm'\n",
        },
        "Initial",
    )
    git(repo, "tag", "v0.1.0")
    fix = commit_files(
        repo,
        {
            PATH: AFTER,
            TEST_PATH: "def test_clamp():\n    assert clamp(-1) == 0\n",
            "README.md": "made up, fixed\n",
        },
        SUBJECT,
    )
    commit_files(repo, {"vllm/later.py": "X = 1\n"}, "Later work (#124)")
    return repo, fix


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1"},
    )


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))


def work_tree_state(repo: Path) -> tuple[str, str, bytes, str]:
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain", "--untracked-files=all"),
        (repo / ".git" / "index").read_bytes(),
        (repo / PATH).read_text(),
    )


def test_derive_commit_from_a_clone_leaves_its_work_tree_alone(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    repo, fix = clone
    # The work tree is elsewhere and dirty: checked out at the tag, with a
    # change of the very file the fix changes, staged, and an untracked file.
    git(repo, "checkout", "-q", "v0.1.0")
    (repo / PATH).write_text(BEFORE + "\n# local change\n")
    git(repo, "add", PATH)
    (repo / "vllm" / "scratch.py").write_text("Y = 2\n")
    before = work_tree_state(repo)
    out = tmp_path / "out"
    result = cli(
        "derive", "--commit", fix[:10], "--repo", str(repo), "--out", str(out),
        "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert document["id"] == "vllm#123"
    assert document["commit"] == fix
    assert document["base"] == "0.1.0"
    assert document["upstream_url"] == "https://github.com/vllm-project/vllm/pull/123"
    assert document["tests"] == [TEST_PATH]
    assert document["notes"] == ["README.md: not Python, left out"]
    patch = load_derived(out / "vllm-123.toml")
    assert patch.title == SUBJECT
    assert patch.base == "0.1.0"
    assert patch.upstream_url == "https://github.com/vllm-project/vllm/pull/123"
    assert [u.name for u in patch.units] == ["Sampler.clamp"]
    assert "assert clamp(-1) == 0" in patch.recorded_tests[0].content
    assert work_tree_state(repo) == before


def test_derive_commit_in_a_bare_clone_and_from_inside_a_work_tree(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    repo, fix = clone
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
    result = cli(
        "derive", "--commit", fix, "--repo", str(bare), "--out",
        str(tmp_path / "from-bare"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"derived vllm#123 from commit {fix[:12]} on vLLM 0.1.0" in result.stdout
    # Without --repo: the repository the command runs in.
    result = cli(
        "derive", "--commit", fix, "--out", str(tmp_path / "from-inside"),
        cwd=repo / "vllm",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    derived = [
        load_derived(tmp_path / folder / "vllm-123.toml")
        for folder in ("from-bare", "from-inside")
    ]
    assert derived[0].units == derived[1].units
    assert [p.base for p in derived] == ["0.1.0", "0.1.0"]


def test_a_parent_after_the_tag_is_described(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    repo, _fix = clone
    later = commit_files(repo, {PATH: AFTER.replace("max(x, 0)", "max(x, 1)")}, "Fix")
    code, output = run(
        "derive", "--commit", later, "--repo", str(repo), "--id", "local#2",
        "--out", str(tmp_path / "out"), "--format", "json",
    )  # fmt: skip
    assert code == 0, output
    parent = git(repo, "rev-parse", "--short", f"{later}~1")
    assert json.loads(output)["base"] == f"0.1.0-2-g{parent}"


def test_a_clone_without_tags_needs_base_version(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    repo, fix = clone
    git(repo, "tag", "-d", "v0.1.0")
    out = tmp_path / "out"
    code, output = run(
        "derive", "--commit", fix, "--repo", str(repo), "--out", str(out)
    )
    assert code == 2
    assert "git describe finds no tag" in output
    assert "hint: pass --base-version VERSION" in output
    assert not out.exists()
    code, output = run(
        "derive", "--commit", fix, "--repo", str(repo), "--out", str(out),
        "--base-version", "not a version",
    )  # fmt: skip
    assert code == 2 and "--base-version 'not a version': not a version" in output
    code, output = run(
        "derive", "--commit", fix, "--repo", str(repo), "--out", str(out),
        "--base-version", "0.0.9",
    )  # fmt: skip
    assert code == 0, output
    assert "on vLLM 0.0.9" in output
    assert load_derived(out / "vllm-123.toml").base == "0.0.9"


def test_a_subject_without_a_pull_request_needs_an_id(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    repo, _fix = clone
    local = commit_files(repo, {PATH: AFTER.replace("max(x, 0)", "abs(x)")}, "Fix it")
    out = tmp_path / "out"
    code, output = run(
        "derive", "--commit", local, "--repo", str(repo), "--out", str(out)
    )
    assert code == 2
    assert "its subject names no pull request" in output and "--id ID" in output
    code, output = run(
        "derive", "--commit", local, "--repo", str(repo), "--out", str(out),
        "--id", "acme#7", "--format", "json",
    )  # fmt: skip
    assert code == 0, output
    document = json.loads(output)
    assert (document["id"], document["upstream_url"]) == ("acme#7", "")
    assert load_derived(out / "acme-7.toml").title == "Fix it"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--diff", "fix.diff"], "--commit and --diff exclude each other"),
        (["--base", "0.20.2"], "--commit and --base exclude each other"),
        (["--base-src", "."], "--commit and --base-src exclude each other"),
    ],
)
def test_commit_excludes_a_diff_and_its_base(
    tmp_path: Path, clone: tuple[Path, str], arguments: list[str], expected: str
) -> None:
    repo, fix = clone
    out = tmp_path / "out"
    code, output = run(
        "derive", "--commit", fix, "--repo", str(repo), "--out", str(out), *arguments
    )
    assert code == 2
    assert expected in output and "hint:" in output
    assert not out.exists()


def test_the_source_options_are_checked(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    code, output = run("derive", "--out", out, "--id", "local#1")
    assert code == 2 and "give the fix: --diff FILE" in output
    code, output = run(
        "derive", "--repo", ".", "--diff", "x", "--id", "a#1", "--out", out
    )
    assert code == 2 and "--repo goes with --commit" in output
    plain = tmp_path / "plain.diff"  # no mail: no subject names an id
    plain.write_text(f"--- a/{PATH}\n+++ b/{PATH}\n@@ -1 +1 @@\n-a\n+b\n")
    code, output = run(
        "derive", "--diff", str(plain), "--base-src", ".", "--out", out
    )  # fmt: skip
    assert code == 2 and f"--diff {plain} needs --id ID" in output
    code, output = run(
        "derive", "--diff", "x", "--base", "0.20.2", "--base-version", "0.20.2",
        "--id", "a#1", "--out", out,
    )  # fmt: skip
    assert code == 2 and "--base-version goes with --base-src or --commit" in output


def test_a_missing_commit_a_root_commit_and_not_a_repository(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    repo, _fix = clone
    out = str(tmp_path / "out")
    code, output = run(
        "derive", "--commit", "f" * 40, "--repo", str(repo), "--out", out
    )
    assert code == 2 and "no such commit" in output and "hint:" in output
    root = git(repo, "rev-list", "--max-parents=0", "HEAD")
    code, output = run("derive", "--commit", root, "--repo", str(repo), "--out", out)
    assert code == 2 and "is a root commit" in output
    elsewhere = tmp_path / "not-a-repo"
    elsewhere.mkdir()
    code, output = run(
        "derive", "--commit", "HEAD", "--repo", str(elsewhere), "--out", out
    )
    assert code == 2 and "not a git repository" in output
    code, output = run(
        "derive", "--commit", "HEAD", "--repo", str(tmp_path / "no"), "--out", out
    )
    assert code == 2 and "no such folder" in output


def test_without_gitpython_commit_says_what_to_install(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    repo, fix = clone
    code = (
        "import sys; sys.modules['git'] = None\n"  # import git raises ImportError
        "from deepstack_patch.entry import main\n"
        "sys.argv = ['deepstack-patch', *sys.argv[1:]]\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "derive", "--commit", fix, "--repo", str(repo),
         "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "derive --commit needs GitPython, which is not installed" in result.stderr
    assert "pip install 'deepstack-patch[vendor]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_format_patch_subject_is_the_title(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    """git format-patch folds a long subject over two header lines."""
    repo, _fix = clone
    subject = "[Bugfix] " + "Keep the sampler's values in range " * 3 + "(#125)"
    fix = commit_files(repo, {PATH: AFTER.replace("max(x, 0)", "abs(x)")}, subject)
    mail = tmp_path / "fix.patch"
    mail.write_text(git(repo, "format-patch", "-1", "--stdout", fix) + "\n")
    assert "Subject: [PATCH] " in mail.read_text()
    base = tmp_path / "base"
    (base / "vllm").mkdir(parents=True)
    (base / "vllm" / "__init__.py").write_text("")
    (base / PATH).write_text(AFTER)
    out = tmp_path / "out"
    code, output = run(
        "derive", "--diff", str(mail), "--base-src", str(base), "--base-version",
        "0.1.0", "--id", "vllm#125", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    assert load_derived(out / "vllm-125.toml").title == subject
    code, output = run(
        "derive", "--diff", str(mail), "--base-src", str(base), "--base-version",
        "0.1.0", "--id", "vllm#126", "--out", str(out), "--title", "Mine",
    )  # fmt: skip
    assert code == 0, output
    assert load_derived(out / "vllm-126.toml").title == "Mine"


def test_a_tree_without_a_version_is_refused_or_takes_base_version(
    tmp_path: Path,
) -> None:
    base = tmp_path / "base"
    (base / "vllm").mkdir(parents=True)
    (base / "vllm" / "__init__.py").write_text("")
    (base / PATH).write_text(BEFORE)
    diff = tmp_path / "fix.diff"
    repo = tmp_path / "scratch"
    repo.mkdir()
    git(repo, "init", "-q")
    commit_files(repo, {PATH: BEFORE}, "before")
    commit_files(repo, {PATH: AFTER}, "after")
    diff.write_text(git(repo, "diff", "HEAD~1", "HEAD") + "\n")
    out = tmp_path / "out"
    args = ["derive", "--diff", str(diff), "--base-src", str(base), "--id", "local#1"]
    code, output = run(*args, "--out", str(out))
    assert code == 2
    assert "the tree has no version" in output
    assert "hint: pass --base-version VERSION" in output
    assert not out.exists()
    code, output = run(*args, "--out", str(out), "--base-version", "0.20.2")
    assert code == 0, output
    assert "on vLLM 0.20.2" in output and "unknown" not in output
    assert load_derived(out / "local-1.toml").base == "0.20.2"


def test_the_base_holds_the_modules_the_fix_imports_from(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    """Where a name the fix reads from another vllm module is looked up."""
    repo, _fix = clone
    commit_files(
        repo,
        {
            "vllm/limits.py": "FLOOR = 0\n",
            "vllm/helpers.py": "def floor(x):\n    return x\n",
        },
        "Add limits",
    )
    importing = AFTER.replace(
        '"""A made-up sampler."""\n',
        '"""A made-up sampler."""\nfrom vllm.limits import FLOOR\n\n'
        "from .helpers import floor\n",
    ).replace("max(x, 0)", "floor(max(x, FLOOR))")
    fix = commit_files(repo, {PATH: importing}, "[Bugfix] Floor (#130)")
    out = tmp_path / "out"
    code, output = run(
        "derive", "--commit", fix, "--repo", str(repo), "--out", str(out)
    )
    assert code == 0, output
    [base] = (tmp_path / "cache" / "commit-trees").iterdir()
    held = sorted(p.relative_to(base).as_posix() for p in base.rglob("*.py"))
    assert held == ["vllm/__init__.py", "vllm/helpers.py", "vllm/limits.py", PATH]
    # A partial copy made by this tool, which lists that no file is known
    # absent from it (a folder without the list is read as whole).
    assert (base / ASKED_FOR).read_text() == ""
    context = TreeContext(base)
    assert not context.lacks("vllm/config.py")


# -- issue 34 item 6: the commit carried; a base far past its tag ---------------


def test_the_commit_is_recorded_and_every_output_carries_it(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    """``derive --commit`` records the commit's full sha in the data file;
    ``list``, ``export``'s DEP-3 headers, ``apply --commit``'s trailers and
    the SBOM carry it; without a URL, DEP-3's Origin names the commit."""
    from deepstack_patch.distribution.provenance import (
        AppliedPatch,
        UpstreamArtefact,
        sbom_document,
    )

    repo, fix = clone
    local = commit_files(repo, {PATH: AFTER.replace("max(x, 0)", "abs(x)")}, "Fix it")
    out = tmp_path / "out"
    for sha, options in ((fix, []), (local, ["--id", "acme#7"])):
        made = cli(
            "derive", "--commit", sha[:10], "--repo", str(repo), "--out", str(out),
            *options,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    assert f'\ncommit = "{fix}"\n' in (out / "vllm-123.toml").read_text()
    assert load_derived(out / "acme-7.toml").commit == local
    listed = cli("list", "--patches", str(out), "--format", "json")
    commits = {p["id"]: p["commit"] for p in json.loads(listed.stdout)["patches"]}
    assert (commits["vllm#123"], commits["acme#7"]) == (fix, local)
    assert commits["vllm#38933"] == ""  # written by hand
    headers = {}
    for patch_id, at in (("acme#7", f"{local}~1"), ("vllm#123", "v0.1.0")):
        tree = tmp_path / f"tree-{patch_id.replace('#', '-')}"
        subprocess.run(["git", "clone", "-q", str(repo), str(tree)], check=True)
        git(tree, "checkout", "-q", "-b", "vendor", at)
        base = ["--vllm-src", str(tree), "--patches", str(out)]
        series = tmp_path / f"series-{patch_id.replace('#', '-')}"
        exported = cli("export", *base, "--only", patch_id, "--series", str(series))
        assert exported.returncode == 0, exported.stderr
        (mail,) = series.glob("0001-*.patch")
        headers[patch_id] = mail.read_text().split("\n---\n")[0]
    assert (
        "Origin: backport, https://github.com/vllm-project/vllm/pull/123\n"
        in (headers["vllm#123"])
    )
    assert headers["vllm#123"].endswith(f"\nUpstream-commit: {fix}")
    assert f"Origin: backport, commit:{local}\n" in headers["acme#7"]
    applied = cli("apply", *base, "--only", "vllm#123", "--commit")
    assert applied.returncode == 0, applied.stderr
    trailers = git(tree, "log", "-1", "--format=%(trailers:only)")
    assert trailers.splitlines() == [
        "Backport-of: vllm-project/vllm#123",
        f"Upstream-commit: {fix}",
    ]
    sbom = sbom_document(
        release="0.1.0",
        local_version="0.1.0+deepstack.1",
        upstream=UpstreamArtefact("vllm-0.1.0.tar.gz", "ab" * 32, "sdist"),
        applied=[
            AppliedPatch(load_derived(out / "vllm-123.toml"), "series/1.patch", b"x")
        ],
    )
    pedigree = json.loads(sbom)["metadata"]["component"]["pedigree"]
    assert pedigree["commits"] == [{"uid": fix, "message": "vllm#123"}]


def test_a_hand_edited_commit_that_is_no_sha_is_refused(tmp_path: Path) -> None:
    """The loader checks the recorded commit as derive would write it: the
    outputs carry it as it is."""
    from tests.test_series import DERIVED_TOML

    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "acme-5.toml").write_text(
        DERIVED_TOML.replace("\npaths = ", '\ncommit = "HEAD~1"\npaths = ', 1)
    )
    listed = cli("list", "--patches", str(folder))
    assert listed.returncode == 2
    assert "commit 'HEAD~1': not a full commit sha" in listed.stderr


def test_a_base_far_past_its_tag_gets_a_warning(
    tmp_path: Path, clone: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone whose newest tag is long before the commit: the base reads
    0.1.0-N-g..., and derive warns, suggesting --base-version (a few
    commits past a tag, as a release's own commits are, get no warning)."""
    from deepstack_patch.authoring import commit

    repo, fix = clone
    near = cli("derive", "--commit", fix, "--repo", str(repo), "--out", "near",
               cwd=tmp_path)  # fmt: skip
    assert near.returncode == 0 and "warning" not in near.stderr
    later = commit_files(repo, {PATH: AFTER.replace("max(x, 0)", "max(x, 1)")}, "Fix")
    monkeypatch.setattr(commit, "FAR_PAST_TAG", 1)
    code, output = run(
        "derive", "--commit", later, "--repo", str(repo), "--id", "local#2",
        "--out", str(tmp_path / "far"), "--format", "json",
    )  # fmt: skip
    assert code == 0, output
    (warning,) = json.loads(output)["warnings"]
    parent = git(repo, "rev-parse", "--short", f"{later}~1")
    assert warning.startswith(
        f"the base is 0.1.0-2-g{parent}, 2 commits after the tag of vLLM 0.1.0: "
    )
    assert "pass --base-version VERSION" in warning
    code, output = run(
        "derive", "--commit", later, "--repo", str(repo), "--id", "local#3",
        "--out", str(tmp_path / "given"), "--base-version", "0.1.5",
        "--format", "json",
    )  # fmt: skip
    assert code == 0 and json.loads(output)["warnings"] == []


def test_a_commit_with_a_binary_file_derives_leaving_it_out(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    """A fix whose commit adds a binary test asset (issue 34 item 5)."""
    repo, _fix = clone
    (repo / "tests").mkdir(exist_ok=True)
    (repo / "tests" / "asset.bin").write_bytes(b"\x00\x01\x02binary\xff")
    sha = commit_files(
        repo, {PATH: AFTER.replace("max(x, 0)", "abs(x)")}, "Fix with an asset (#9)"
    )
    made = cli("derive", "--commit", sha, "--repo", str(repo), "--out",
               str(tmp_path / "out"), "--format", "json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["notes"] == [
        "tests/asset.bin: a binary file, left out"
    ]


# -- issue 36 item 6: derive's options -------------------------------------------


def test_a_mail_names_the_id_and_derived_again_needs_force(
    tmp_path: Path, clone: tuple[Path, str]
) -> None:
    """``derive --diff mail.patch`` takes the id and URL from the mail's
    subject, as ``--commit`` does; derived again into the same ``--out``
    it says where the id came from, and ``--force`` replaces that one file
    (also one of another name that holds the id)."""
    repo, fix = clone
    mail = tmp_path / "fix.patch"
    mail.write_text(git(repo, "format-patch", "-1", "--stdout", fix) + "\n")
    base = tmp_path / "base"
    (base / "vllm").mkdir(parents=True)
    (base / "vllm" / "__init__.py").write_text("")
    (base / PATH).write_text(BEFORE)
    out = tmp_path / "out"
    (out).mkdir()
    (out / "notes.txt").write_text("a vendor's notes\n")
    words = ["derive", "--diff", str(mail), "--base-src", str(base),
             "--base-version", "0.1.0", "--out", str(out)]  # fmt: skip
    made = cli(*words, "--format", "json")
    assert made.returncode == 0, made.stderr
    document = json.loads(made.stdout)
    assert (document["id"], document["upstream_url"]) == (
        "vllm#123",
        "https://github.com/vllm-project/vllm/pull/123",
    )
    again = cli(*words, "--title", "Mine")
    assert again.returncode == 2
    assert again.stderr.startswith(
        f"error: vllm#123 (the id the mail's subject names): {out / 'vllm-123.toml'} "
        "already exists\nhint: give --force to replace that file"
    )
    assert load_derived(out / "vllm-123.toml").title == SUBJECT
    forced = cli(*words, "--title", "Mine", "--force")
    assert forced.returncode == 0, forced.stderr
    assert load_derived(out / "vllm-123.toml").title == "Mine"
    # A file of another name that holds the id is the one replaced.
    (out / "vllm-123.toml").rename(out / "mine.toml")
    held = cli(*words)
    assert held.returncode == 2
    assert f"vllm#123 (the id the mail's subject names): already held by {out}" in (
        held.stderr
    )
    assert cli(*words, "--force").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "vllm-123.toml"]
    assert load_derived(out / "vllm-123.toml").title == SUBJECT
    # --commit names the commit's subject; --patches of the same folder
    # does not stop --force.
    words = ["derive", "--commit", fix, "--repo", str(repo), "--out", str(out)]
    again = cli(*words, "--patches", str(out))
    assert again.returncode == 2
    assert "vllm#123 (the id the commit's subject names): already taken" in (
        again.stderr
    )
    forced = cli(*words, "--patches", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert load_derived(out / "vllm-123.toml").commit == fix

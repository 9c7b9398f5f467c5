"""Vendor pipelines on real releases and real git repositories.

`export`'s series applied with `patch -p1`, `git apply`, `git am` and quilt
gives byte for byte the tree `apply` gives; `apply --commit` makes one commit
per patch with provenance trailers and never commits anything else;
`backport` writes its outputs; `matrix` holds the real releases to
targets.toml; an emitted CI job's own backport command writes every file the
job attests and keeps (test_pipelines.py checks the pipelines offline).

`patch` and `git` may write into files in place, so the trees they patch are
real copies, never the hard-link copies of conftest.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.distribution.quilt import upstream_reference
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.targets import default_targets_path
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES

from tests.support import TARGETS, link_copy

pytestmark = pytest.mark.release

RELEASE = "0.20.2"
NEEDING = [
    pytest.param(v, id=v)
    for v in TARGETS.releases
    if PatchState.NEEDED in TARGETS.expected(v).values()
]
# Version metadata `backport` rewrites on top of the fixes.
VERSION_FILES = {"PKG-INFO", "vllm.egg-info/PKG-INFO", "vllm/_version.py"}


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def flat(output: str) -> str:
    """Output with rich's line wrapping undone, for text assertions."""
    return " ".join(output.split())


def needed_ids(version: str) -> list[str]:
    """The ids targets.toml expects needed, in series order."""
    expected = TARGETS.expected(version)
    return [p.id for p in SERIES if expected.get(p.id) is PatchState.NEEDED]


def tree_bytes(root: Path, ignore: set[str] = frozenset()) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and not path.is_symlink()
        and path.relative_to(root).parts[0] not in {".pc", ".git"}
        and path.relative_to(root).as_posix() not in ignore
    }


def assert_same_tree(left: Path, right: Path, ignore: set[str] = frozenset()) -> None:
    a, b = tree_bytes(left, ignore), tree_bytes(right, ignore)
    assert sorted(a.keys() ^ b.keys()) == [], "the trees hold different files"
    differing = sorted(path for path in a if a[path] != b[path])
    assert differing == [], f"files differ: {differing}"


def applied_tree(patched_copy: Callable[[str], Path], version: str) -> Path:
    """A copy of the release after `apply` (the reference every route must hit)."""
    root = patched_copy(version)
    code, output = run("apply", "--vllm-src", str(root))
    assert code == 0, output
    return root


def real_copy(release_tree: Callable[[str], Path], version: str, to: Path) -> Path:
    return Path(shutil.copytree(release_tree(version), to, symlinks=True))


def unlinked_copy(source: Path, to: Path, series_dir: Path, names: list[str]) -> Path:
    """A hard-link copy whose files named in the series are real copies.

    `patch` writes only the files a patch names, so this protects the pristine
    tree as a full copy would, for a fraction of the cost on every release.
    """
    link_copy(source, to)
    for name in names:
        for line in (series_dir / name).read_text().splitlines():
            if line.startswith("diff --git a/"):
                path = to / line.split(" b/", 1)[1]
                content = path.read_bytes()
                path.unlink()
                path.write_bytes(content)
    return to


def export(tree: Path, series_dir: Path) -> list[str]:
    code, output = run("export", "--vllm-src", str(tree), "--series", str(series_dir))
    assert code == 0, output
    lines = (series_dir / "series").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


# --- export --------------------------------------------------------------------


@pytest.mark.parametrize("version", NEEDING)
def test_series_with_patch_p1_equals_apply(
    version: str,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    names = export(release_tree(version), tmp_path / "series")
    assert len(names) == len(needed_ids(version))
    target = unlinked_copy(
        release_tree(version), tmp_path / "by-patch", tmp_path / "series", names
    )
    for name in names:
        subprocess.run(
            [
                "patch",
                "-p1",
                "--forward",
                "--no-backup-if-mismatch",
                "-s",
                "-i",
                str(tmp_path / "series" / name),
            ],
            cwd=target,
            check=True,
        )
    assert_same_tree(applied_tree(patched_copy, version), target)


@pytest.mark.parametrize("tool", ["git apply", "quilt"])
def test_series_with_git_apply_and_quilt_equals_apply(
    tool: str,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    if tool == "quilt" and shutil.which("quilt") is None:
        pytest.skip("quilt is not installed on this machine (apt-get install quilt)")
    series_dir = tmp_path / "series"
    names = export(release_tree(RELEASE), series_dir)
    assert names, f"targets.toml expects patches needed on {RELEASE}"
    target = real_copy(release_tree, RELEASE, tmp_path / "by-tool")
    if tool == "quilt":
        subprocess.run(
            ["quilt", "push", "-a", "-q"],
            cwd=target,
            check=True,
            env={
                "PATH": "/usr/bin:/bin",
                "QUILT_PATCHES": str(series_dir),
                "HOME": str(tmp_path),
            },
        )
    else:
        for name in names:
            subprocess.run(
                ["git", "apply", str(series_dir / name)], cwd=target, check=True
            )
    assert_same_tree(applied_tree(patched_copy, RELEASE), target)


def test_series_files_carry_dep3_and_format_patch_headers(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    names = export(release_tree(RELEASE), tmp_path / "series")
    patches = {p.id: p for p in SERIES}
    for number, (name, patch_id) in enumerate(
        zip(names, needed_ids(RELEASE), strict=True), start=1
    ):
        patch = patches[patch_id]
        text = (tmp_path / "series" / name).read_text()
        head, _, body = text.partition("\n\n")
        assert head.startswith("From ") and head.splitlines()[0].endswith(
            " Mon Sep 17 00:00:00 2001"
        )
        assert f"\nSubject: [PATCH {number}/{len(names)}] {patch.title}" in head
        assert "\nDate: " in head and "\nFrom: " in head
        fields = dict(
            line.split(": ", 1)
            for line in body.partition("\n---\n")[0].splitlines()
            if ": " in line and not line.startswith(" ")
        )
        assert fields["Description"] == patch.title
        assert fields["Origin"] == f"backport, {patch.upstream_url}"
        assert fields["Bug"] == patch.upstream_url
        assert fields["Applied-Upstream"] == patch.fixed_in
        assert len(fields["Last-Update"]) == 10  # YYYY-MM-DD
        assert "\ndiff --git a/" in text


def test_export_of_a_fixed_release_writes_an_empty_series(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    fixed = next(v for v in reversed(TARGETS.releases) if not needed_ids(v))
    assert export(release_tree(fixed), tmp_path / "series") == []


def test_export_refuses_a_folder_it_did_not_write(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    foreign = tmp_path / "debian-patches"
    foreign.mkdir()
    (foreign / "series").write_text("vendor-fix.patch\n")
    code, output = run(
        "export", "--vllm-src", str(release_tree(RELEASE)), "--series", str(foreign)
    )
    assert code == 2 and "not a series this tool wrote" in flat(output)
    assert (foreign / "series").read_text() == "vendor-fix.patch\n"
    # Its own folder is replaced on a second export, stale files removed.
    ours = tmp_path / "ours"
    first = export(release_tree(RELEASE), ours)
    assert export(release_tree(RELEASE), ours) == first
    assert sorted(p.name for p in ours.iterdir()) == sorted([*first, "series"])


# --- apply --commit ------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def git_release(
    release_tree: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A git repository holding the pristine release as its one commit."""
    repo = real_copy(release_tree, RELEASE, tmp_path_factory.mktemp("git") / "base")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(
        repo,
        "-c",
        "user.name=Base",
        "-c",
        "user.email=base@example.com",
        "commit",
        "-q",
        "-m",
        f"vLLM {RELEASE}",
    )
    return repo


@pytest.fixture
def checkout(git_release: Path, tmp_path: Path) -> Path:
    """A fresh clone (real files) with an identity, for one test to write."""
    work = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(git_release), str(work)], check=True)
    git(work, "config", "user.name", "Vendor")
    git(work, "config", "user.email", "vendor@example.com")
    git(work, "config", "commit.gpgsign", "false")
    return work


def commits_since(repo: Path, base: str) -> list[str]:
    return git(repo, "rev-list", "--reverse", f"{base}..HEAD").split()


def test_commit_per_patch_with_trailers_then_no_commit(
    checkout: Path, patched_copy: Callable[[str], Path]
) -> None:
    base = git(checkout, "rev-parse", "HEAD").strip()
    code, output = run("apply", "--vllm-src", str(checkout), "--commit")
    assert code == 0, output

    shas = commits_since(checkout, base)
    ids = needed_ids(RELEASE)
    assert len(shas) == len(ids) >= 1
    patches = {p.id: p for p in SERIES}
    pristine = VllmTree.open(git_release_path(checkout))
    for sha, patch_id in zip(shas, ids, strict=True):
        patch = patches[patch_id]
        message = git(checkout, "log", "-1", "--format=%B", sha)
        assert message.splitlines()[0] == patch.title
        assert patch.upstream_url in message and patch.fixed_in in message
        trailers = git(checkout, "log", "-1", "--format=%(trailers:only)", sha)
        assert trailers.split("\n")[:2] == [
            f"Backport-of: {upstream_reference(patch)}",
            f"Upstream-release: {patch.fixed_in}",
        ]
        changed = set(git(checkout, "show", "--name-only", "--format=", sha).split())
        expected = {
            loc.path
            for loc in plan_tree(pristine, SERIES, rewrite=False)
            .report(patch_id)
            .locations
            if loc.state is PatchState.NEEDED
        }
        assert changed == expected
    assert upstream_reference(patches["vllm#40917"]) == "vllm-project/vllm#40917"
    assert git(checkout, "status", "--porcelain") == ""
    # The clone holds the tracked files (vLLM's .gitignore drops a few).
    applied = applied_tree(patched_copy, RELEASE)
    tracked = git(checkout, "ls-files", "-z").rstrip("\0").split("\0")
    assert len(tracked) > 1000
    differing = [
        path
        for path in tracked
        if (checkout / path).read_bytes() != (applied / path).read_bytes()
    ]
    assert differing == []

    head = git(checkout, "rev-parse", "HEAD")
    code, output = run("apply", "--vllm-src", str(checkout), "--commit")
    assert code == 0, output
    assert "no commit made" in flat(output)
    assert git(checkout, "rev-parse", "HEAD") == head


def git_release_path(checkout: Path) -> Path:
    """The clone's origin: the pristine repository."""
    return Path(git(checkout, "remote", "get-url", "origin").strip())


def test_commit_refuses_a_dirty_work_tree(checkout: Path) -> None:
    head = git(checkout, "rev-parse", "HEAD")
    (checkout / "README.md").write_text("local edit\n")
    code, output = run("apply", "--vllm-src", str(checkout), "--commit")
    assert code == 2
    assert "uncommitted changes" in flat(output) and "README.md" in flat(output)
    assert "--allow-dirty" in flat(output)  # the hint
    assert git(checkout, "rev-parse", "HEAD") == head
    assert git(checkout, "status", "--porcelain").split() == ["M", "README.md"]


def test_allow_dirty_commits_only_the_patches_files(checkout: Path) -> None:
    base = git(checkout, "rev-parse", "HEAD").strip()
    (checkout / "README.md").write_text("unstaged local edit\n")
    with (checkout / "setup.py").open("a") as handle:
        handle.write("# staged local edit\n")
    git(checkout, "add", "setup.py")
    (checkout / "notes.txt").write_text("untracked\n")

    code, output = run(
        "apply", "--vllm-src", str(checkout), "--commit", "--allow-dirty"
    )
    assert code == 0, output
    shas = commits_since(checkout, base)
    assert len(shas) == len(needed_ids(RELEASE))
    committed = {
        path
        for sha in shas
        for path in git(checkout, "show", "--name-only", "--format=", sha).split()
    }
    assert committed and all(path.startswith("vllm/") for path in committed)
    assert git(checkout, "diff", "--cached", "--name-only").split() == ["setup.py"]
    assert git(checkout, "diff", "--name-only").split() == ["README.md"]
    assert "notes.txt" in git(checkout, "status", "--porcelain")


def test_allow_dirty_refuses_local_edits_in_a_target_file(checkout: Path) -> None:
    pristine = VllmTree.open(git_release_path(checkout))
    target = next(
        loc.path
        for report in plan_tree(pristine, SERIES, rewrite=False).reports
        for loc in report.locations
        if loc.state is PatchState.NEEDED
    )
    with (checkout / target).open("a") as handle:
        handle.write("# local edit\n")
    head = git(checkout, "rev-parse", "HEAD")
    code, output = run(
        "apply", "--vllm-src", str(checkout), "--commit", "--allow-dirty"
    )
    assert (
        code == 2 and target in flat(output) and "uncommitted changes" in flat(output)
    )
    assert git(checkout, "rev-parse", "HEAD") == head


def test_commit_outside_git_says_what_to_do(
    patched_copy: Callable[[str], Path],
) -> None:
    code, output = run("apply", "--vllm-src", str(patched_copy(RELEASE)), "--commit")
    assert (
        code == 2
        and "not inside a git work tree" in flat(output)
        and "git init" in flat(output)
    )


def test_series_applies_with_git_am(
    checkout: Path, release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    """The files are real format-patch mails: `git am` makes the commits."""
    names = export(release_tree(RELEASE), tmp_path / "series")
    base = git(checkout, "rev-parse", "HEAD").strip()
    git(checkout, "am", "-q", *[str(tmp_path / "series" / n) for n in names])
    shas = commits_since(checkout, base)
    patches = {p.id: p for p in SERIES}
    titles = [git(checkout, "log", "-1", "--format=%s", s).strip() for s in shas]
    assert titles == [patches[i].title for i in needed_ids(RELEASE)]
    code, output = run("apply", "--vllm-src", str(checkout), "--check")
    assert code == 0, output


# --- backport ------------------------------------------------------------------


def test_backport_writes_tree_series_tarball_and_report(
    release_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code, output = run("backport", "--release", RELEASE, "--out", str(out))
    assert code == 0, output
    version = f"{RELEASE}+deepstack.1"
    tree = out / f"vllm-{version}"
    sdist = out / f"vllm-{version}.tar.gz"
    report = json.loads((out / "report.json").read_text())
    assert report["command"] == "backport" and report["schema"] == 1
    assert report["local_version"] == version
    assert report["applied"] == needed_ids(RELEASE)
    assert VllmTree.open(tree).version == version

    # The tree is the pristine release + the series + the version metadata.
    by_patch = real_copy(release_tree, RELEASE, tmp_path / "by-patch")
    for name in report["outputs"]["series_files"]:
        subprocess.run(
            ["patch", "-p1", "-s", "-i", str(out / "series" / name)],
            cwd=by_patch,
            check=True,
        )
    assert_same_tree(tree, by_patch, ignore=VERSION_FILES)
    assert "Version: 0.20.2+deepstack.1\n" in (tree / "PKG-INFO").read_text()
    assert "'0.20.2+deepstack.1'" in (tree / "vllm/_version.py").read_text()

    # The tarball holds exactly the tree, under vllm-<local version>/.
    with tarfile.open(sdist) as tar:
        packed = {
            m.name.partition("/")[2]: tar.extractfile(m).read()
            for m in tar
            if m.isfile()
        }
        assert {m.name.partition("/")[0] for m in tar} == {f"vllm-{version}"}
    assert packed == tree_bytes(tree)

    # A second run into the same folder replaces its outputs.
    code, output = run("backport", "--release", RELEASE, "--out", str(out))
    assert code == 0, output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "report.json",
            "series",
            f"vllm-{version}",
            f"vllm-{version}.tar.gz",
            "sbom.cdx.json",
            "provenance.intoto.json",
        ]
    )


def test_backport_refuses_a_foreign_out_folder(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine\n")
    code, output = run("backport", "--release", RELEASE, "--out", str(tmp_path))
    assert code == 2 and "not empty" in flat(output)
    assert (tmp_path / "keep.txt").read_text() == "mine\n"


def test_an_emitted_job_attests_and_keeps_what_its_backport_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GitHub job's own backport command, run here: the attested subject
    is the tarball it writes, and every kept path but verify.xml (verify's,
    not run here) names files it wrote."""
    code, output = run("matrix", "--emit", "github-actions", "--output", "-")
    assert code == 0, output
    job = yaml.safe_load(output)["jobs"]["backport"]
    (row,) = [
        r for r in job["strategy"]["matrix"]["include"] if r["release"] == RELEASE
    ]
    backport = shlex.split(row["run"].splitlines()[0])
    assert backport[:2] == ["deepstack-patch", "backport"], backport
    monkeypatch.chdir(tmp_path)
    code, output = run(*backport[1:])
    assert code == 0, output

    (attest,) = [
        step
        for step in job["steps"]
        if step.get("uses", "").startswith("actions/attest-build-provenance@")
    ]
    assert attest["with"]["subject-path"] == "${{ matrix.tarball }}"
    tarball = tmp_path / row["tarball"]
    report = json.loads((tarball.parent / "report.json").read_text())
    assert Path(report["outputs"]["sdist"]) == tarball.resolve()
    assert tarball.is_file()

    (upload,) = [
        step
        for step in job["steps"]
        if step.get("uses", "").startswith("actions/upload-artifact@")
    ]
    kept = upload["with"]["path"].replace("${{ matrix.release }}", RELEASE)
    missing = [
        path for path in kept.splitlines() if not list(tmp_path.glob(path.rstrip("/")))
    ]
    assert missing == [f"backport-{RELEASE}/verify.xml"]


# --- matrix --------------------------------------------------------------------


def test_matrix_conforms_to_targets() -> None:
    code, output = run("matrix", "--jobs", "2", "--format", "json")
    document = json.loads(output)
    assert code == 0, document["differences"] or output
    assert document["ok"] is True
    assert [r["version"] for r in document["releases"]] == TARGETS.releases
    for release in document["releases"]:
        expected = {k: v.value for k, v in TARGETS.expected(release["version"]).items()}
        assert release["states"] == expected


def test_matrix_exits_1_when_a_state_differs(tmp_path: Path) -> None:
    patch_id = needed_ids(RELEASE)[0]
    text = default_targets_path().read_text()
    table = f'[patches."{patch_id}".expected]'
    head, _, tail = text.partition(table)
    assert tail, f"targets.toml has no {table}"
    wrong = tail.replace(f'"{RELEASE}" = "needed"', f'"{RELEASE}" = "applied"', 1)
    targets = tmp_path / "targets.toml"
    targets.write_text(head + table + wrong)
    releases = tmp_path / "releases.txt"
    releases.write_text(f"# just one\n{RELEASE}\n")
    code, output = run(
        "matrix", "--targets", str(targets), "--releases", str(releases), "-j", "1"
    )
    assert code == 1, output
    assert "needed ≠ applied" in flat(output) and "differ from the targets" in flat(
        output
    )


@pytest.mark.verify
def test_matrix_verify_runs_verify_on_the_patched_release(
    proof_env: object, tmp_path: Path
) -> None:
    """``matrix --verify`` patches each release and judges it with verify's
    plumbing (in the worker process), in the managed environment."""
    patch_id = needed_ids(RELEASE)[0]
    releases = tmp_path / "releases.txt"
    releases.write_text(f"{RELEASE}\n")
    code, output = run(
        "matrix", "--releases", str(releases), "--verify", "--only", patch_id,
        "-j", "1", "--format", "json",
    )  # fmt: skip
    document = json.loads(output)
    [row] = document["releases"]
    assert row["error"] == "" and row["states"][patch_id] == "needed", output
    assert row["verify_exit_code"] == 0, output
    assert code == 0 and document["ok"] is True


def test_allow_dirty_without_commit_is_an_error(
    patched_copy: Callable[[str], Path],
) -> None:
    code, output = run(
        "apply", "--vllm-src", str(patched_copy(RELEASE)), "--allow-dirty"
    )
    assert code == 2 and "--allow-dirty needs --commit" in flat(output)

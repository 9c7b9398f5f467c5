"""Derived patches that add or delete a whole file (issue 40, item 2).

A fix that adds a module carries it: needed where the module is absent,
applied where it is there with upstream's code, drifted where it is there
and different; its names are checked like any other new code. A deleted
file is the reverse. Small synthetic trees, written here.
"""

from __future__ import annotations

import ast
import json
import stat
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.cli import main
from deepstack_patch.engine.derived import DerivedPatch, load_derived, write_derived
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.output.diffs import unified_diff

from tests.test_derive import _tree, git_diff
from tests.test_json_schemas import errors

NEW_PATH = "vllm/pkg/scaled.py"
NEW = (
    '"""Scaled values."""\n'
    "from vllm.helpers import scale\n\n\n"
    "def doubled(x):\n"
    "    # twice the scale\n"
    "    return scale(x) * 2\n"
)
USER = "vllm/use.py"
USER_BEFORE = "def f():\n    return 1\n"
USER_AFTER = (
    "from vllm.pkg.scaled import doubled\n\n\ndef f():\n    return doubled(1)\n"
)
OLD_PATH = "vllm/legacy.py"
OLD = "LEGACY = 1\n"

BASE_FILES = {
    "vllm/helpers.py": "def scale(x):\n    return x\n",
    "vllm/pkg/__init__.py": "",
    USER: USER_BEFORE,
    OLD_PATH: OLD,
}


def _span(count: int) -> str:
    return "1" if count == 1 else f"1,{count}"


def added_diff(path: str, text: str) -> str:
    """A file added, as ``git diff`` writes it."""
    lines = text.splitlines(keepends=True)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
        f"index 0000000..1111111\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +{_span(len(lines))} @@\n" + "".join("+" + line for line in lines)
    )


def deleted_diff(path: str, text: str) -> str:
    """A file deleted, as ``git diff`` writes it."""
    lines = text.splitlines(keepends=True)
    return (
        f"diff --git a/{path} b/{path}\ndeleted file mode 100644\n"
        f"index 1111111..0000000\n--- a/{path}\n+++ /dev/null\n"
        f"@@ -{_span(len(lines))} +0,0 @@\n" + "".join("-" + line for line in lines)
    )


FIX = (
    added_diff(NEW_PATH, NEW)
    + git_diff(USER, USER_BEFORE, USER_AFTER)
    + deleted_diff(OLD_PATH, OLD)
)


def derived(tmp_path: Path, diff: str = FIX) -> DerivedPatch:
    """The patch derived on a base tree, written and read back as --patches
    reads it."""
    base = _tree(tmp_path / "base", BASE_FILES)
    result = derive_patch_from_text(diff, base, "local#F2")
    out = tmp_path / "out"
    out.mkdir()
    return load_derived(write_derived(result.patch, out))


def state_on(patch: DerivedPatch, root: Path) -> tuple[PatchState, str]:
    report = plan_tree(VllmTree.open(root), [patch], rewrite=False).report(patch.id)
    return report.state, report.reason


def test_the_data_file_holds_the_whole_text_once_and_reads_back(
    tmp_path: Path,
) -> None:
    patch = derived(tmp_path)
    text = (tmp_path / "out" / "local-F2.toml").read_text()
    assert 'kind = "new-file"' in text and 'kind = "deleted-file"' in text
    assert text.count("return scale(x) * 2") == 1  # no edit repeats it
    kinds = {unit.path: unit.kind for unit in patch.units}
    assert kinds[NEW_PATH] == "new-file" and kinds[OLD_PATH] == "deleted-file"
    new = next(unit for unit in patch.units if unit.path == NEW_PATH)
    assert (new.name, new.before, new.after) == ("vllm.pkg.scaled", "", NEW)
    assert patch.whole_files == (NEW_PATH, OLD_PATH)


def test_a_hand_edited_whole_file_unit_is_refused(tmp_path: Path) -> None:
    derived(tmp_path)
    data = tmp_path / "out" / "local-F2.toml"
    text = data.read_text()
    broken = text.replace('after = ""', 'after = "LEGACY = 2\\n"', 1)
    assert broken != text
    data.write_text(broken)
    with pytest.raises(DeepstackError, match="`after` must be empty"):
        load_derived(data)


def test_needed_where_absent_then_written_whole_and_applied(tmp_path: Path) -> None:
    patch = derived(tmp_path)
    root = _tree(tmp_path / "target", BASE_FILES).root
    assert state_on(patch, root)[0] is PatchState.NEEDED
    plan = plan_tree(VllmTree.open(root), [patch])
    actions = {edit.relpath: edit.action for edit in plan.edits}
    assert actions == {NEW_PATH: "add", USER: "change", OLD_PATH: "delete"}
    written = write_edits(root, plan.edits)
    assert sorted(written) == sorted([NEW_PATH, USER, OLD_PATH])
    assert (root / NEW_PATH).read_text() == NEW
    assert stat.S_IMODE((root / NEW_PATH).stat().st_mode) == 0o644
    assert not (root / OLD_PATH).exists()
    assert ast.dump(ast.parse((root / USER).read_text())) == ast.dump(
        ast.parse(USER_AFTER)
    )
    assert state_on(patch, root) == (PatchState.APPLIED, "")


def test_a_new_module_reformatted_is_applied_and_other_code_drifts(
    tmp_path: Path,
) -> None:
    patch = derived(tmp_path)
    fixed = {**BASE_FILES, USER: USER_AFTER}
    del fixed[OLD_PATH]
    # Comments and layout aside, it is upstream's module.
    reformatted = NEW.replace("    # twice the scale\n", "").replace("\n\n\n", "\n\n")
    root = _tree(tmp_path / "same", {**fixed, NEW_PATH: reformatted}).root
    assert state_on(patch, root) == (PatchState.APPLIED, "")
    other = NEW.replace("* 2", "* 3")
    root = _tree(tmp_path / "other", {**fixed, NEW_PATH: other}).root
    state, reason = state_on(patch, root)
    assert state is PatchState.DRIFTED
    assert f"{NEW_PATH} is there, and is not the module the fix adds" in reason
    assert "line 5: `def doubled(x):`" in reason


def test_a_deleted_file_with_other_text_drifts(tmp_path: Path) -> None:
    patch = derived(tmp_path)
    root = _tree(tmp_path / "vendor", {**BASE_FILES, OLD_PATH: "LEGACY = 2\n"}).root
    state, reason = state_on(patch, root)
    assert state is PatchState.DRIFTED
    assert f"{OLD_PATH} is there, and is not the module the fix deletes" in reason


def test_a_deleted_module_that_the_release_still_imports_drifts(
    tmp_path: Path,
) -> None:
    """In a whole tree (one with its pyproject.toml), an import of the
    module from a file the patch does not change keeps it."""
    patch = derived(tmp_path)
    whole = {**BASE_FILES, "pyproject.toml": "[project]\nname = 'vllm'\n"}
    root = _tree(tmp_path / "whole", whole).root
    assert state_on(patch, root)[0] is PatchState.NEEDED
    for user in ("from vllm import legacy\n", "from .legacy import LEGACY\n"):
        (root / "vllm" / "vendor.py").write_text("import os\n" + user)
        state, reason = state_on(patch, root)
        assert state is PatchState.DRIFTED
        assert f"the fix deletes {OLD_PATH}, which vllm/vendor.py:2 imports" in reason


def test_a_new_module_reading_what_the_release_lacks_is_refused(
    tmp_path: Path,
) -> None:
    patch = derived(tmp_path)
    lacking = {**BASE_FILES, "vllm/helpers.py": "def other(x):\n    return x\n"}
    root = _tree(tmp_path / "lacking", lacking).root
    state, reason = state_on(patch, root)
    assert state is PatchState.DRIFTED
    assert "the fix needs `scale` from `vllm.helpers`, which this release lacks" in (
        reason
    )
    code, output = run(
        "apply", "--vllm-src", str(root), "--patches", str(tmp_path / "out")
    )
    assert code == 2 and "error:" in output
    assert not (root / NEW_PATH).exists()  # nothing written
    assert (root / OLD_PATH).exists() and (root / USER).read_text() == USER_BEFORE


def test_a_release_without_the_new_modules_package(tmp_path: Path) -> None:
    """The folder a new file goes into is part of what the fix was shown: a
    release without it is from before the package (not-applicable where the
    rest of the fix is absent too, drifted where it is there)."""
    only_new = added_diff(NEW_PATH, NEW)
    patch = derived(tmp_path, only_new)
    no_package = {k: v for k, v in BASE_FILES.items() if not k.startswith("vllm/pkg")}
    root = _tree(tmp_path / "old", no_package).root
    state, reason = state_on(patch, root)
    assert state is PatchState.NOT_APPLICABLE
    assert f"{NEW_PATH} is not in this tree" in reason
    mixed = derived(tmp_path / "mixed")
    state, reason = state_on(mixed, root)
    assert state is PatchState.DRIFTED
    assert f"new file {NEW_PATH} is absent" in reason


def test_a_new_package_is_made_with_its_folder(tmp_path: Path) -> None:
    package = "vllm/fresh/__init__.py"
    module = "vllm/fresh/mod.py"
    diff = added_diff(package, "from .mod import VALUE\n") + added_diff(
        module, "VALUE = 1\n"
    )
    patch = derived(tmp_path, diff)
    root = _tree(tmp_path / "target", BASE_FILES).root
    assert state_on(patch, root)[0] is PatchState.NEEDED
    plan = plan_tree(VllmTree.open(root), [patch])
    write_edits(root, plan.edits)
    assert (root / module).read_text() == "VALUE = 1\n"
    assert state_on(patch, root)[0] is PatchState.APPLIED


def test_a_fix_of_new_files_only_derives_and_applies_from_the_command_line(
    tmp_path: Path,
) -> None:
    base = _tree(tmp_path / "base", BASE_FILES).root
    diff = tmp_path / "fix.diff"
    diff.write_text(added_diff(NEW_PATH, NEW))
    out = tmp_path / "out"
    code, output = run(
        "derive", "--diff", str(diff), "--base-src", str(base), "--id", "local#F3",
        "--out", str(out), "--format", "json",
    )  # fmt: skip
    assert code == 0, output
    document = json.loads(output)
    assert document["round_trip"] == "text"
    assert errors("derive", document) == []
    assert document["units"] == [
        {"path": NEW_PATH, "kind": "new-file", "name": "vllm.pkg.scaled", "edits": 0}
    ]
    target = _tree(tmp_path / "target", BASE_FILES).root
    code, output = run(
        "apply", "--vllm-src", str(target), "--patches", str(out), "--dry-run"
    )
    assert code == 0, output
    assert f"--- /dev/null\n+++ b/{NEW_PATH}\n" in output
    assert not (target / NEW_PATH).exists()
    code, output = run("apply", "--vllm-src", str(target), "--patches", str(out))
    assert code == 0, output
    assert (target / NEW_PATH).read_text() == NEW


def test_derive_refuses_an_added_file_the_base_has_or_a_deletion_that_differs(
    tmp_path: Path,
) -> None:
    base = _tree(tmp_path / "base", BASE_FILES)
    with pytest.raises(DeepstackError, match="already has"):
        derive_patch_from_text(added_diff(USER, "x = 1\n"), base, "local#F4")
    with pytest.raises(DeepstackError, match="hunk 1 .* does not apply"):
        derive_patch_from_text(deleted_diff(OLD_PATH, "OTHER = 1\n"), base, "local#F4")
    longer = _tree(tmp_path / "longer", {**BASE_FILES, OLD_PATH: OLD + "MORE = 2\n"})
    with pytest.raises(DeepstackError, match="is not the one the diff deletes"):
        derive_patch_from_text(deleted_diff(OLD_PATH, OLD), longer, "local#F4")


def test_diffs_of_added_and_deleted_files_are_git_diffs(tmp_path: Path) -> None:
    patch = derived(tmp_path)
    root = _tree(tmp_path / "target", BASE_FILES).root
    diff = unified_diff(plan_tree(VllmTree.open(root), [patch]).edits)
    assert (
        f"diff --git a/{NEW_PATH} b/{NEW_PATH}\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/{NEW_PATH}\n@@ -0,0 +1,7 @@\n"
    ) in diff
    assert (
        f"diff --git a/{OLD_PATH} b/{OLD_PATH}\ndeleted file mode 100644\n"
        f"--- a/{OLD_PATH}\n+++ /dev/null\n@@ -1 +0,0 @@\n-LEGACY = 1\n"
    ) in diff


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


# -- every output that lists changed files -------------------------------------


def _folder_with_patch(tmp_path: Path) -> Path:
    derived(tmp_path)
    return tmp_path / "out"


def test_an_exported_series_creates_and_deletes_with_git_apply(tmp_path: Path) -> None:
    patches = _folder_with_patch(tmp_path)
    target = _tree(tmp_path / "target", BASE_FILES).root
    series = tmp_path / "series"
    code, output = run(
        "export", "--vllm-src", str(target), "--patches", str(patches),
        "--series", str(series),
    )  # fmt: skip
    assert code == 0, output
    (name,) = [
        line for line in (series / "series").read_text().splitlines() if line[:1] != "#"
    ]
    subprocess.run(["git", "apply", "-p1", str(series / name)], cwd=target, check=True)
    assert (target / NEW_PATH).read_text() == NEW
    assert not (target / OLD_PATH).exists()
    applied = _tree(tmp_path / "applied", BASE_FILES).root
    code, output = run("apply", "--vllm-src", str(applied), "--patches", str(patches))
    assert code == 0, output
    for path in (NEW_PATH, USER):
        assert (target / path).read_bytes() == (applied / path).read_bytes()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def test_apply_commit_commits_the_new_file_and_the_deletion(tmp_path: Path) -> None:
    patches = _folder_with_patch(tmp_path)
    repo = _tree(tmp_path / "repo", BASE_FILES).root
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    identity = ["-c", "user.name=V", "-c", "user.email=v@example.com"]
    git(repo, *identity, "commit", "-q", "-m", "base")
    git(repo, "config", "user.name", "V")
    git(repo, "config", "user.email", "v@example.com")
    code, output = run(
        "apply", "--vllm-src", str(repo), "--patches", str(patches), "--commit"
    )
    assert code == 0, output
    changed = git(repo, "show", "--name-status", "--format=", "HEAD").split("\n")
    assert {f"A\t{NEW_PATH}", f"D\t{OLD_PATH}", f"M\t{USER}"} <= set(changed)
    assert git(repo, "status", "--porcelain") == ""


def test_a_patched_wheel_holds_the_new_module_and_not_the_deleted_one(
    tmp_path: Path,
) -> None:
    from wheel.wheelfile import WheelFile

    patches = _folder_with_patch(tmp_path)
    wheel = tmp_path / "vllm-0.1.0-py3-none-any.whl"
    members = {
        "vllm/__init__.py": "",
        **BASE_FILES,
        "vllm-0.1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\n"
        "Version: 0.1.0\n",
        "vllm-0.1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with WheelFile(wheel, "w") as out:
        for name, text in members.items():
            out.writestr(name, text)
    code, output = run(
        "wheel", "--wheel", str(wheel), "--patches", str(patches),
        "--out", str(tmp_path / "wheels"),
    )  # fmt: skip
    assert code == 0, output
    (patched,) = (tmp_path / "wheels").glob("*.whl")
    with zipfile.ZipFile(patched) as archive:
        names = archive.namelist()
        assert archive.read(NEW_PATH).decode() == NEW
        info = archive.getinfo(NEW_PATH)
        assert stat.S_IMODE(info.external_attr >> 16) == 0o644
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = archive.read(record).decode()
    assert OLD_PATH not in names and OLD_PATH not in rows
    assert f"{NEW_PATH},sha256=" in rows


def test_an_install_is_not_given_a_new_or_deleted_file() -> None:
    """Refused before anything of the install is read: revert could not
    give a deleted module back, nor take a new one away."""
    from deepstack_patch.engine.inplace import apply_in_place
    from deepstack_patch.engine.plan import FileEdit

    added = FileEdit(NEW_PATH, b"", NEW.encode(), ["local#F2"], action="add")
    with pytest.raises(DeepstackError) as refused:
        apply_in_place(None, [added], [])  # type: ignore[arg-type]
    assert f"local#F2 adds {NEW_PATH}" in refused.value.message
    assert "--skip local#F2" in refused.value.hint


def test_a_repacked_sdist_holds_the_new_module_and_not_the_deleted_one(
    tmp_path: Path,
) -> None:
    import io
    import tarfile

    from deepstack_patch.distribution.sdist import repack_sdist
    from deepstack_patch.engine.plan import FileEdit

    archive = tmp_path / "vllm-0.1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as out:
        for path, text in {"PKG-INFO": "Name: vllm\n", **BASE_FILES}.items():
            member = tarfile.TarInfo(f"vllm-0.1.0/{path}")
            member.size = len(text.encode())
            out.addfile(member, io.BytesIO(text.encode()))
    edits = [
        FileEdit(NEW_PATH, b"", NEW.encode(), ["local#F2"], action="add"),
        FileEdit(OLD_PATH, OLD.encode(), b"", ["local#F2"], action="delete"),
        FileEdit(USER, USER_BEFORE.encode(), USER_AFTER.encode(), ["local#F2"]),
    ]
    repacked = repack_sdist(archive, edits, "0.1.0+x", tmp_path / "out.tar.gz", 0)
    with tarfile.open(repacked) as result:
        names = result.getnames()
        new = result.getmember(f"vllm-0.1.0+x/{NEW_PATH}")
        assert new.mode == 0o644
        assert result.extractfile(new).read().decode() == NEW  # type: ignore[union-attr]
        user = result.extractfile(f"vllm-0.1.0+x/{USER}")
        assert user.read().decode() == USER_AFTER  # type: ignore[union-attr]
    assert f"vllm-0.1.0+x/{OLD_PATH}" not in names


# -- a real release: vllm#41813's new modules, carried into 0.22.1 ---------------

#: The modules vllm#41813 adds, which vLLM's maintainers carried whole from
#: 0.22.0 to 0.22.1 (one imports another: both are new).
ZENTORCH = (
    "vllm/model_executor/kernels/linear/zentorch_utils.py",
    "vllm/model_executor/kernels/linear/mixed_precision/zentorch.py",
    "vllm/model_executor/kernels/linear/scaled_mm/zentorch.py",
)


@pytest.mark.release
def test_vllm_41813s_new_modules_carried_as_the_maintainers_did(
    tmp_path: Path,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
) -> None:
    from tests.support.upstream_diff import new_file_diff

    later = release_tree("0.22.1")
    diff = tmp_path / "41813.diff"
    diff.write_text(
        "".join(new_file_diff(p, (later / p).read_text()) for p in ZENTORCH)
    )
    out = tmp_path / "patches"
    code, output = run(
        "derive", "--diff", str(diff), "--base", "0.22.0", "--id", "local#41813",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    patch = load_derived(out / "local-41813.toml")
    assert [u.kind for u in patch.units] == ["new-file"] * 3
    target = patched_copy("0.22.0")
    assert state_on(patch, target) == (PatchState.NEEDED, "")
    code, output = run("apply", "--vllm-src", str(target), "--patches", str(out))
    assert code == 0, output
    for path in ZENTORCH:
        assert (target / path).read_bytes() == (later / path).read_bytes()
    assert state_on(patch, target) == (PatchState.APPLIED, "")
    assert state_on(patch, later) == (PatchState.APPLIED, "")
    # Without the module it imports, a new module is refused, naming it.
    alone = new_file_diff(ZENTORCH[1], (later / ZENTORCH[1]).read_text())
    with pytest.raises(DeepstackError, match="which this release lacks") as refused:
        derive_patch_from_text(alone, VllmTree.open(release_tree("0.22.0")), "x#1")
    assert "vllm.model_executor.kernels.linear.zentorch_utils" in str(refused.value)

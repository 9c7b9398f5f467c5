"""Patches from elsewhere: ``--patches`` folders and entry points join the series.

A toy patch module, written here into a temporary folder, stands for a
vendor's hand-written patch: it turns ``return 41`` into ``return 42`` in
``vllm/toy.py`` of a small synthetic tree. No network, no proof environment
(except the tests marked ``verify``).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.engine import series as series_module
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import Patch, RecordedTest
from deepstack_patch.engine.series import (
    ENTRY_POINT_GROUP,
    assemble_series,
    patches_from_folder,
)
from deepstack_patch.patches import SERIES

TOY_FILE = "vllm/toy.py"

#: A vendor's patch module: one patch per id given to ``toy_module``.
TOY_MODULE = '''
"""A toy patch: answer() returns 42."""

import ast

from deepstack_patch.engine import syntax
from deepstack_patch.engine.protocol import Patch, PatchState


class ToyPatch(Patch):
    title = "answer() returns 42"
    upstream_url = "https://example.com/acme/12"
    fixed_in = "99.0.0"
    symptom = "answer() returns 41"
    paths = ("vllm/toy.py",)
    markers = (b"def answer",)
    parts = {{"": "answer() in vllm/toy.py"}}

    def __init__(self, patch_id, requires=()):
        self.id = patch_id
        self.requires = tuple(requires)

    def recognise(self, tree, path):
        for name, function in syntax.iter_functions(tree):
            if name != "answer":
                continue
            match function.body:
                case [ast.Return(value=ast.Constant(value=41))]:
                    state = PatchState.NEEDED
                case [ast.Return(value=ast.Constant(value=42))]:
                    state = PatchState.APPLIED
                case _:
                    return [syntax.finding(
                        PatchState.DRIFTED, name, function, "expected return 41"
                    )]
            return [syntax.finding(state, name, function)]
        return []

    def rewrite(self, module, needed):
        import libcst

        class Answer(libcst.CSTTransformer):
            def leave_Integer(self, original, updated):
                if updated.value == "41":
                    return updated.with_changes(value="42")
                return updated

        return module.visit(Answer())


{declaration}
'''


def toy_module(folder: Path, name: str, *ids: str, requires: str = "") -> Path:
    """Write a patch module ``name`` declaring a toy patch per id."""
    made = [
        f"ToyPatch({patch_id!r}, {[requires] if requires else []!r})"
        for patch_id in ids
    ]
    declaration = (
        f"PATCH = {made[0]}" if len(made) == 1 else f"PATCHES = [{', '.join(made)}]"
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(TOY_MODULE.format(declaration=declaration))
    return path


def make_tree(root: Path, answer: int = 41) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (root / TOY_FILE).write_text(f"def answer():\n    return {answer}\n")
    return root


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def vendor(tmp_path: Path) -> Path:
    folder = tmp_path / "vendor"
    toy_module(folder, "acme12.py", "acme#12")
    return folder


@pytest.fixture
def toy_tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree")


# -- a folder joins every command that reads the series ----------------------


def test_folder_patch_joins_list_with_its_origin(vendor: Path) -> None:
    code, out, _ = run("list", "--format", "json", "--patches", str(vendor))
    assert code == 0, out
    patches = json.loads(out)["patches"]
    assert [p["id"] for p in patches] == [*(p.id for p in SERIES), "acme#12"]
    assert patches[-1]["origin"] == str((vendor / "acme12.py").absolute())
    assert {p["origin"] for p in patches[:-1]} == {"built-in"}
    code, text, _ = run("list", "--patches", str(vendor))
    assert code == 0 and f"from:     {(vendor / 'acme12.py').absolute()}" in text
    assert "from:     built-in" in text


def test_folder_patch_status_apply_and_export(
    vendor: Path, toy_tree: Path, tmp_path: Path
) -> None:
    base = ["--vllm-src", str(toy_tree), "--patches", str(vendor)]
    code, out, _ = run("status", *base, "--format", "json")
    assert code == 0, out
    toy = [p for p in json.loads(out)["patches"] if p["id"] == "acme#12"]
    assert len(toy) == 1 and toy[0]["state"] == "needed"
    assert toy[0]["origin"].endswith("acme12.py")
    assert toy[0]["locations"][0]["path"] == TOY_FILE

    series_dir = tmp_path / "series"
    code, out, _ = run("export", *base, "--series", str(series_dir))
    assert code == 0, out
    exported = [p for p in series_dir.iterdir() if p.suffix == ".patch"]
    assert len(exported) == 1 and "-    return 41" in exported[0].read_text()
    assert (toy_tree / TOY_FILE).read_text().endswith("return 41\n")  # not modified

    code, out, _ = run("apply", *base, "--only", "acme#12", "--format", "json")
    assert code == 0, out
    assert json.loads(out)["applied"] == ["acme#12"]
    assert (toy_tree / TOY_FILE).read_text() == "def answer():\n    return 42\n"
    code, out, _ = run("apply", *base, "--check")
    assert code == 0, out  # applied: nothing needed


def test_without_the_folder_the_patch_is_unknown(vendor: Path, toy_tree: Path) -> None:
    code, _, err = run("status", "--vllm-src", str(toy_tree), "--only", "acme#12")
    assert code == 2 and "unknown patch id 'acme#12'" in err


def test_ids_joined_by_a_comma_are_told_to_repeat_the_option(toy_tree: Path) -> None:
    """``--skip vllm#38933,vllm#40932`` (as other tools take a list) names
    the option and says how to give two ids."""
    code, _, err = run(
        "status", "--vllm-src", str(toy_tree), "--skip", "vllm#38933, vllm#40932"
    )
    assert code == 2
    assert (
        "error: unknown patch id 'vllm#38933, vllm#40932': --skip takes one id" in err
    )
    assert (
        "hint: repeat the option, one id each: --skip vllm#38933 --skip vllm#40932"
        in err
    )


def test_only_and_skip_select_patches_from_elsewhere(
    vendor: Path, toy_tree: Path
) -> None:
    base = ["status", "--vllm-src", str(toy_tree), "--patches", str(vendor)]
    code, out, _ = run(*base, "--only", "acme#12", "--format", "json")
    chosen = {p["id"]: p["selected"] for p in json.loads(out)["patches"]}
    assert (
        code == 0
        and chosen["acme#12"]
        and not any(
            selected for patch_id, selected in chosen.items() if patch_id != "acme#12"
        )
    )
    code, out, _ = run(*base, "--skip", "acme#12", "--format", "json")
    chosen = {p["id"]: p["selected"] for p in json.loads(out)["patches"]}
    assert code == 0 and not chosen["acme#12"] and chosen[SERIES[0].id]
    code, _, err = run(*base, "--only", "acme#13")
    assert code == 2 and "unknown patch id 'acme#13'" in err


@pytest.mark.parametrize(
    "command",
    ["list", "status", "apply", "export", "backport", "wheel", "matrix", "verify",
     "doctor", "watch"],
)  # fmt: skip
def test_every_command_that_reads_the_series_takes_patches(command: str) -> None:
    code, out, _ = run(command, "--help")
    assert code == 0 and "--patches DIR" in out
    assert "deepstack_patch.patches" in " ".join(out.split())


def test_apply_installed_takes_patches(vendor: Path, tmp_path: Path) -> None:
    """--installed is an option of apply: the folder is read before the
    interpreter is asked anything (a broken folder refuses first)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run("apply", "--installed", "--patches", str(empty))
    assert code == 2 and "holds no patch" in err


# -- order, collisions and bad folders ---------------------------------------


def test_order_puts_each_patch_after_what_it_requires(tmp_path: Path) -> None:
    first = tmp_path / "first"
    toy_module(first, "a.py", "acme#2", requires="acme#1")
    second = tmp_path / "second"
    toy_module(second, "b.py", "acme#1")
    toy_module(second, "c.py", "acme#3")
    extra = patches_from_folder(first) + patches_from_folder(second)
    assert [p.id for p in extra] == ["acme#2", "acme#1", "acme#3"]
    ordered = assemble_series(SERIES, extra)
    assert ordered[: len(SERIES)] == tuple(SERIES)
    assert [p.id for p in ordered[len(SERIES) :]] == ["acme#1", "acme#2", "acme#3"]
    code, out, _ = run(
        "list", "--format", "json", "--patches", str(first), "--patches", str(second)
    )
    assert code == 0
    ids = [p["id"] for p in json.loads(out)["patches"]]
    assert ids[len(SERIES) :] == ["acme#1", "acme#2", "acme#3"]


def test_a_requirement_outside_the_series_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "vendor"
    toy_module(folder, "a.py", "acme#2", requires="acme#404")
    with pytest.raises(DeepstackError) as raised:
        assemble_series(SERIES, patches_from_folder(folder))
    assert "requires acme#404, which is not in the series" in raised.value.message
    assert raised.value.hint


def test_a_requirement_cycle_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "vendor"
    toy_module(folder, "a.py", "acme#1", requires="acme#2")
    toy_module(folder, "b.py", "acme#2", requires="acme#1")
    with pytest.raises(DeepstackError, match="require each other"):
        assemble_series(SERIES, patches_from_folder(folder))


def test_collision_with_a_built_in_id_is_refused_nothing_written(
    tmp_path: Path, toy_tree: Path
) -> None:
    folder = tmp_path / "vendor"
    builtin = SERIES[0].id
    toy_module(folder, "mine.py", builtin)
    before = (toy_tree / TOY_FILE).read_text()
    code, out, err = run(
        "apply", "--vllm-src", str(toy_tree), "--patches", str(folder),
        "--format", "json",
    )  # fmt: skip
    assert code == 2
    error = json.loads(out)["error"]
    assert (
        f"patch id {builtin!r} of {(folder / 'mine.py').absolute()}" in error["message"]
    )
    assert "already in the series, from built-in" in error["message"]
    assert error["hint"] and "hint:" in err
    assert (toy_tree / TOY_FILE).read_text() == before


def test_collision_between_two_folders_names_both(
    tmp_path: Path, toy_tree: Path
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    toy_module(one, "x.py", "acme#12")
    toy_module(two, "y.py", "acme#12")
    code, _, err = run(
        "apply", "--vllm-src", str(toy_tree), "--patches", str(one),
        "--patches", str(two),
    )  # fmt: skip
    flat = " ".join(err.split())
    assert code == 2
    assert (
        str((two / "y.py").absolute()) in flat
        and str((one / "x.py").absolute()) in flat
    )
    assert (toy_tree / TOY_FILE).read_text().endswith("return 41\n")


def test_empty_folder_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.txt").write_text("not a patch")
    (empty / "_helpers.py").write_text("X = 1\n")  # a helper: never read as a patch
    code, _, err = run("list", "--patches", str(empty))
    assert code == 2
    assert "error:" in err and "holds no patch" in err and "hint:" in err


def test_a_file_is_not_a_folder(tmp_path: Path, vendor: Path) -> None:
    code, _, err = run("list", "--patches", str(vendor / "acme12.py"))
    assert code == 2 and "not a folder" in err and "hint:" in err


def test_missing_folder_is_an_error(tmp_path: Path) -> None:
    code, _, err = run("list", "--patches", str(tmp_path / "nowhere"))
    assert code == 2 and "no such folder" in err and "hint:" in err


def test_broken_module_names_its_line(tmp_path: Path) -> None:
    folder = tmp_path / "vendor"
    folder.mkdir()
    (folder / "broken.py").write_text(
        "import os\n\nraise RuntimeError('half-written')\n"
    )
    code, out, err = run("list", "--patches", str(folder), "--format", "json")
    assert code == 2
    error = json.loads(out)["error"]
    assert (
        error["path"] == str((folder / "broken.py").absolute()) and error["line"] == 3
    )
    assert "RuntimeError: half-written" in error["message"]
    assert "hint:" in err
    assert not [name for name in sys.modules if name.endswith("_broken")]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("acme-5.toml", 'schema = 1\nid = "acme#5"\n[[units]]\nkind = "bogus"\n'),
        ("half.toml", "schema = 1\nid =\n"),
        ("broken.py", "import a_module_nobody_has\n"),
        # The failing line is in a helper it imports: the file is still named.
        ("uses_helper.py", "from _helper import X\n"),
    ],
)
def test_a_broken_file_is_named_with_the_way_to_leave_it_out(
    tmp_path: Path, vendor: Path, name: str, content: str
) -> None:
    """One broken file stops the command for the whole folder (safe), and
    the error names it and says how to go on without it (issue 41, item 6)."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "acme12.py").write_text((vendor / "acme12.py").read_text())
    (folder / "_helper.py").write_text("raise ImportError('helper broke')\n")
    (folder / name).write_text(content)
    code, out, err = run("list", "--patches", str(folder), "--format", "json")
    assert code == 2, out
    error = json.loads(out)["error"]
    assert name in f"{error['path']} {error['message']}", error
    assert (
        f"rename it to _{name} (a file whose name starts with _ is not read) or "
        f"move it out of {folder}"
    ) in error["hint"], error["hint"]
    # Renamed as the hint says, the folder's other patch is read.
    (folder / name).rename(folder / f"_{name}")
    code, out, err = run("list", "--patches", str(folder), "--format", "json")
    assert code == 0, err
    assert "acme#12" in [patch["id"] for patch in json.loads(out)["patches"]]


def test_syntax_error_names_its_line(tmp_path: Path) -> None:
    folder = tmp_path / "vendor"
    folder.mkdir()
    (folder / "typo.py").write_text("PATCH = (\n")
    with pytest.raises(DeepstackError) as raised:
        patches_from_folder(folder)
    assert raised.value.path == str((folder / "typo.py").absolute())
    assert raised.value.line == 1 and "SyntaxError" in raised.value.message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("X = 1\n", "defines neither PATCH nor PATCHES"),
        ("PATCH = 'acme#1'\n", "PATCH is a str"),
        ("PATCHES = []\n", "not a non-empty list of patches"),
        (
            "from deepstack_patch.engine.protocol import Patch\n"
            "class Mine(Patch):\n    id = 'acme#1'\nPATCH = Mine\n",
            "PATCH is the class Mine, not a patch",
        ),
        (
            "from deepstack_patch.engine.protocol import Patch\n"
            "class Mine(Patch):\n    id = 'acme 1'\n    title = paths = markers = "
            "parts = ()\nPATCH = Mine()\n",
            "a patch id is short text without spaces",
        ),
        (
            "from deepstack_patch.engine.protocol import Patch\n"
            "class Mine(Patch):\n    id = 'acme#1'\nPATCH = Mine()\n",
            "Mine lacks title, paths, markers, parts",
        ),
    ],
)
def test_a_module_without_a_patch_is_refused(
    tmp_path: Path, source: str, expected: str
) -> None:
    folder = tmp_path / "vendor"
    folder.mkdir()
    (folder / "mine.py").write_text(source)
    with pytest.raises(DeepstackError) as raised:
        patches_from_folder(folder)
    assert expected in raised.value.message
    assert raised.value.hint and raised.value.path == str(
        (folder / "mine.py").absolute()
    )


def test_patches_module_declares_several(tmp_path: Path) -> None:
    folder = tmp_path / "vendor"
    toy_module(folder, "two.py", "acme#1", "acme#2")
    found = patches_from_folder(folder)
    assert [p.id for p in found] == ["acme#1", "acme#2"]
    assert {p.origin for p in found} == {str((folder / "two.py").absolute())}


def test_a_folder_patch_survives_a_spawned_process(vendor: Path) -> None:
    """matrix checks releases in spawned processes: the patch travels there."""
    import multiprocessing
    import pickle

    (patch,) = patches_from_folder(vendor)
    again = pickle.loads(pickle.dumps(patch))
    assert again.id == "acme#12" and again.origin == patch.origin
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        assert pool.apply(_origin_of, (patch,)) == patch.origin


def _origin_of(patch: Patch) -> str:
    return patch.origin


# -- entry points ------------------------------------------------------------


def install_entry_point(site: Path, value: str, name: str = "acme") -> None:
    """A distribution ``acme-patches 1.2`` in ``site`` with one entry point."""
    dist_info = site / "acme_patches-1.2.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-patches\nVersion: 1.2\n"
    )
    (dist_info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{name} = {value}\n"
    )


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in [n for n in sys.modules if n.split(".")[0] == "acme_patches"]:
        del sys.modules[name]


def test_an_entry_point_is_found_and_listed_with_its_origin(site: Path) -> None:
    package = site / "acme_patches"
    toy_module(package, "__init__.py", "acme#7")
    install_entry_point(site, "acme_patches:PATCH")
    code, out, err = run("list", "--format", "json")
    assert code == 0, err
    patches = json.loads(out)["patches"]
    assert patches[-1]["id"] == "acme#7"
    assert patches[-1]["origin"] == "entry point acme (acme-patches 1.2)"
    code, text, _ = run("list")
    assert "from:     entry point acme (acme-patches 1.2)" in text


def test_an_entry_point_callable_and_folder(site: Path, tmp_path: Path) -> None:
    package = site / "acme_patches"
    package.mkdir()
    folder = tmp_path / "data"
    toy_module(folder, "f.py", "acme#8")
    (package / "__init__.py").write_text(
        f"def patches():\n    return {str(folder)!r}\n"
    )
    install_entry_point(site, "acme_patches:patches")
    found = series_module.patches_from_entry_points()
    assert [p.id for p in found] == ["acme#8"]
    assert found[0].origin == (
        f"entry point acme (acme-patches 1.2): {(folder / 'f.py').absolute()}"
    )
    import pickle  # matrix's spawned processes get it through its file

    assert pickle.loads(pickle.dumps(found[0])).origin == found[0].origin


def test_a_broken_entry_point_is_an_error_naming_it(site: Path, toy_tree: Path) -> None:
    package = site / "acme_patches"
    package.mkdir()
    (package / "__init__.py").write_text("import not_a_module_anywhere\n")
    install_entry_point(site, "acme_patches:PATCH", name="broken")
    code, _, err = run("status", "--vllm-src", str(toy_tree))
    flat = " ".join(err.split())
    assert code == 2
    assert "entry point broken (acme-patches 1.2) = acme_patches:PATCH" in flat
    assert "ModuleNotFoundError" in flat and "hint:" in flat


def test_an_entry_point_that_is_not_a_patch(site: Path) -> None:
    package = site / "acme_patches"
    package.mkdir()
    (package / "__init__.py").write_text("PATCH = 42\n")
    install_entry_point(site, "acme_patches:PATCH")
    with pytest.raises(DeepstackError) as raised:
        series_module.patches_from_entry_points()
    assert "entry point acme (acme-patches 1.2)" in raised.value.message
    assert "int" in raised.value.message and raised.value.hint


def test_the_runner_finds_patches_from_elsewhere(site: Path, vendor: Path) -> None:
    """The proof runner loads the same patches in its own process, from the
    sources verify passes it (the entry point's package need not be installed
    there)."""
    package = site / "acme_patches"
    toy_module(package, "__init__.py", "acme#7")
    install_entry_point(site, "acme_patches:PATCH")
    extra = [*series_module.patches_from_entry_points(), *patches_from_folder(vendor)]
    sources = series_module.patch_sources([*SERIES, *extra])
    assert len(sources) == 2
    script = textwrap.dedent(
        """
        import json, sys
        from deepstack_patch.proof import runner
        sources = json.loads(sys.argv[1])
        found = [runner.patch_by_id(i, sources).origin for i in sys.argv[2:]]
        print(json.dumps(found))
        """
    )
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(sources), "acme#7", "acme#12"],
        capture_output=True,
        text=True,
        check=True,
    )  # site is not on this process's path: only the sources lead there
    origins = json.loads(done.stdout)
    assert origins[1] == str((vendor / "acme12.py").absolute())
    assert origins[0].startswith("entry point acme")


def test_the_live_check_sees_entry_points(site: Path) -> None:
    from deepstack_patch.liveness import live_plugin

    package = site / "acme_patches"
    toy_module(package, "__init__.py", "acme#7")
    install_entry_point(site, "acme_patches:PATCH")
    live_plugin.live_series.cache_clear()
    try:
        ids = [patch.id for patch in live_plugin.live_series()]
        needing = make_tree(site.parent / "needing", 41)
        state, files, _ = live_plugin._full_check(needing, set())
        fixed = make_tree(site.parent / "fixed", 42)
        live, _, _ = live_plugin._full_check(fixed, set())
    finally:
        live_plugin.live_series.cache_clear()
    assert ids == [*(p.id for p in SERIES), "acme#7"]
    assert state.missing == {"acme#7": f"needed in {TOY_FILE}"} and files == [TOY_FILE]
    assert live.live == ["acme#7"] and not live.missing


# -- recorded tests: verify's proof of a patch without prove() --------------

#: A recorded test as a fix's pull request would add it.
TOY_TEST = """
from vllm.toy import answer


def test_answer_is_42():
    assert answer() == 42
"""

#: One that cannot run on the CPU.
NEEDS_CUDA = """
import pytest


def test_on_the_gpu():
    pytest.skip("needs CUDA")
"""


def with_recorded_test(folder: Path, patch_id: str, source: str) -> Path:
    """A toy patch module whose patch records ``source`` as its test."""
    path = toy_module(folder, "recorded.py", patch_id)
    path.write_text(
        path.read_text()
        + "\nfrom deepstack_patch.engine.protocol import RecordedTest\n"
        + f"PATCH.recorded_tests = (RecordedTest('tests/test_toy.py', {source!r}),)\n"
    )
    return folder


def verify_toy(tmp_path: Path, source: str, python: Path | None = None) -> object:
    """verify_tree on a toy tree with the fix applied, against its pristine tree."""
    from deepstack_patch.engine.tree import VllmTree
    from deepstack_patch.proof import envs, verify

    from tests.support import TARGETS

    folder = with_recorded_test(tmp_path / "vendor", "acme#12", source)
    series = assemble_series(SERIES, patches_from_folder(folder))
    pristine = make_tree(tmp_path / "pristine", 41)
    fixed = make_tree(tmp_path / "fixed", 42)
    report = verify.verify_tree(
        VllmTree.open(fixed),
        series,
        {"acme#12"},
        envs.ProofEnv(python or Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(pristine),
    )
    for tree in (pristine, fixed):  # the tests ran in copies
        assert not (tree / "tests").exists()
    (verdict,) = report.verdicts
    return report, verdict


def test_verify_runs_recorded_tests_fail_to_pass(tmp_path: Path) -> None:
    report, verdict = verify_toy(tmp_path, TOY_TEST)
    assert verdict.state.value == "applied" and verdict.pristine_state.value == "needed"
    assert verdict.pristine_proof.status == "failed", verdict.pristine_proof.message
    assert "tests/test_toy.py::test_answer_is_42: failed" in (
        verdict.pristine_proof.message
    )
    assert verdict.proof.status == "passed", verdict.proof.message
    assert verdict.proof.message == "recorded tests: 1 passed"
    assert verdict.fail_to_pass == "proven" and report.ok and report.exit_code == 0


def test_recorded_tests_that_cannot_run_are_no_proof(tmp_path: Path) -> None:
    report, verdict = verify_toy(tmp_path, NEEDS_CUDA)
    # Could not run, in words and status (issue 36 item 3): not "missing".
    assert verdict.proof.status == "could-not-run"
    assert verdict.proof.message.startswith(
        "could not run here: skipped in the CPU proof environment"
    )
    assert "needs CUDA" in verdict.proof.message
    assert verdict.fail_to_pass == "could-not-run"
    assert not report.ok and report.exit_code == 1  # never a silent pass


def test_a_patch_with_neither_prove_nor_recorded_tests_has_no_proof(
    tmp_path: Path, vendor: Path
) -> None:
    from deepstack_patch.engine.tree import VllmTree
    from deepstack_patch.proof import envs, verify

    from tests.support import TARGETS

    series = assemble_series(SERIES, patches_from_folder(vendor))
    report = verify.verify_tree(
        VllmTree.open(make_tree(tmp_path / "fixed", 42)),
        series,
        {"acme#12"},
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
    )
    (verdict,) = report.verdicts
    assert verdict.proof.status == "missing"
    assert verdict.proof.message.startswith(
        "no proof: ToyPatch (" + str((vendor / "acme12.py").absolute())
    )
    assert "no prove() method and no recorded tests" in verdict.proof.message
    assert report.exit_code == 1


@pytest.mark.parametrize(
    ("outcomes", "pristine", "status"),
    [
        (["passed"], False, "passed"),
        (["passed", "skipped"], False, "passed"),
        (["failed", "passed"], False, "failed"),
        (["error"], False, "could-not-run"),  # an import fails: cannot run here
        (["skipped"], False, "could-not-run"),
        ([], False, "could-not-run"),
        (["error"], True, "failed"),  # before the fix: what it adds is absent
        (["failed"], True, "failed"),
        (["passed"], True, "passed"),
        (["skipped"], True, "could-not-run"),
    ],
)
def test_recorded_test_verdicts(
    outcomes: list[str], pristine: bool, status: str
) -> None:
    from deepstack_patch.proof.recorded_tests import verdict
    from deepstack_patch.proof.results import TestCase
    from deepstack_patch.proof.tree_tests import TestRun

    run = TestRun(command=["pytest"])
    run.cases = [
        TestCase(f"tests/test_toy.py::test_{n}", outcome, f"E  {outcome} here")
        for n, outcome in enumerate(outcomes)
    ]
    result = verdict(run, "acme#12", pristine)
    assert result.status == status, result.message
    could_not_run = status == "could-not-run"
    assert result.message.startswith("could not run here: ") == could_not_run


@pytest.mark.verify
def test_verify_command_proves_a_folder_patch_by_its_recorded_tests(
    tmp_path: Path, proof_env: object
) -> None:
    """The command line, in the managed proof environment: --patches on verify."""
    folder = with_recorded_test(tmp_path / "vendor", "acme#12", TOY_TEST)
    pristine = make_tree(tmp_path / "pristine", 41)
    fixed = make_tree(tmp_path / "fixed", 42)
    code, out, err = run(
        "verify", "--vllm-src", str(fixed), "--patches", str(folder),
        "--only", "acme#12", "--against-pristine", "--pristine", str(pristine),
        "--format", "json",
    )  # fmt: skip
    assert code == 0, out + err
    (patch,) = json.loads(out)["patches"]
    assert patch["id"] == "acme#12" and patch["fail_to_pass"] == "proven"
    assert patch["pristine_proof"]["status"] == "failed"


# -- derived patches (*.toml, written by `derive`) ----------------------------

#: A derived patch's data file (docs/derive.md), as `derive` writes it for the
#: toy fix; its recorded test is the pull request's.
DERIVED_TOML = """\
schema = 1
id = "acme#5"
title = "answer() returns 42"
symptom = "answer() returns 41"
base = "0.20.2"
base_tree = ""
paths = ["vllm/toy.py"]
requires = []

[[tests]]
path = "tests/test_toy.py"
content = '''
from vllm.toy import answer


def test_answer_is_42():
    assert answer() == 42
'''

[[units]]
path = "vllm/toy.py"
kind = "function"
name = "answer"
before = '''
def answer():
    return 41
'''
after = '''
def answer():
    return 42
'''

[[units.edits]]
kind = "body"
block = [{header = "def answer():\\n", field = "body"}]
removed = '''
return 41
'''
inserted = '''
return 42
'''
"""


@pytest.fixture
def derived_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "acme-5.toml").write_text(DERIVED_TOML)
    return folder


def test_a_derived_patch_joins_list_status_apply_and_export(
    derived_folder: Path, toy_tree: Path, tmp_path: Path
) -> None:
    data_file = str((derived_folder / "acme-5.toml").absolute())
    code, out, err = run("list", "--format", "json", "--patches", str(derived_folder))
    assert code == 0, err
    (derived,) = [p for p in json.loads(out)["patches"] if p["id"] == "acme#5"]
    assert derived["origin"] == data_file

    base = ["--vllm-src", str(toy_tree), "--patches", str(derived_folder)]
    code, out, err = run("status", *base, "--only", "acme#5", "--format", "json")
    assert code == 0, err
    (derived,) = [p for p in json.loads(out)["patches"] if p["id"] == "acme#5"]
    assert derived["state"] == "needed" and derived["origin"] == data_file
    code, out, err = run("export", *base, "--series", str(tmp_path / "series"))
    assert code == 0, err
    code, out, err = run("apply", *base, "--only", "acme#5", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["applied"] == ["acme#5"]
    assert (toy_tree / TOY_FILE).read_text() == "def answer():\n    return 42\n"


def test_a_folder_of_both_kinds(derived_folder: Path) -> None:
    toy_module(derived_folder, "acme12.py", "acme#12")
    found = patches_from_folder(derived_folder)
    assert [p.id for p in found] == ["acme#5", "acme#12"]  # by file name
    assert [Path(p.origin).name for p in found] == ["acme-5.toml", "acme12.py"]


def test_a_broken_data_file_is_refused(derived_folder: Path, toy_tree: Path) -> None:
    broken = derived_folder / "acme-5.toml"
    broken.write_text(DERIVED_TOML.replace('title = "', "title = "))
    code, out, err = run(
        "apply", "--vllm-src", str(toy_tree), "--patches", str(derived_folder),
        "--format", "json",
    )  # fmt: skip
    assert code == 2 and "hint:" in err
    error = json.loads(out)["error"]
    assert Path(error["path"]).name == "acme-5.toml" and error["line"] == 3
    assert (toy_tree / TOY_FILE).read_text().endswith("return 41\n")


def test_a_data_file_without_derived_patches_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before `derive` is installed, a *.toml says so, never a traceback."""
    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "acme-5.toml").write_text(DERIVED_TOML)
    monkeypatch.setitem(sys.modules, "deepstack_patch.engine.derived", None)
    with pytest.raises(DeepstackError) as raised:
        patches_from_folder(folder)
    assert "this deepstack-patch has no derived patches" in raised.value.message
    assert raised.value.hint and raised.value.path.endswith("acme-5.toml")


def test_verify_proves_a_derived_patch_by_its_recorded_tests(
    derived_folder: Path, tmp_path: Path
) -> None:
    """The diff's test file, copied into copies of the trees: it fails on the
    pristine tree and passes after apply."""
    from deepstack_patch.engine.tree import VllmTree
    from deepstack_patch.proof import envs, verify

    from tests.support import TARGETS

    series = assemble_series(SERIES, patches_from_folder(derived_folder))
    pristine = make_tree(tmp_path / "pristine", 41)
    fixed = make_tree(tmp_path / "fixed", 41)
    code, out, err = run(
        "apply", "--vllm-src", str(fixed), "--patches", str(derived_folder)
    )
    assert code == 0, out + err
    report = verify.verify_tree(
        VllmTree.open(fixed),
        series,
        {"acme#5"},
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(pristine),
    )
    (verdict,) = report.verdicts
    assert verdict.pristine_proof.status == "failed", verdict.pristine_proof.message
    assert verdict.proof.status == "passed", verdict.proof.message
    assert verdict.fail_to_pass == "proven" and report.exit_code == 0


def test_a_prove_of_an_engine_class_is_no_proof_of_a_fix() -> None:
    """A patch kind the engine defines (a derived patch) may say in prove()
    that its recorded tests prove it: verify then runs them."""
    from deepstack_patch.proof.proofs import has_proof
    from deepstack_patch.proof.recorded_tests import proven_by_recorded_tests

    class EnginePatchKind(Patch):
        def prove(self, tree: Path) -> None:
            raise NotImplementedError("proved by its recorded tests")

    EnginePatchKind.__module__ = "deepstack_patch.engine.kind"
    patch = EnginePatchKind()
    assert not has_proof(patch) and not proven_by_recorded_tests(patch)
    patch.recorded_tests = (RecordedTest("tests/test_toy.py", TOY_TEST),)
    assert proven_by_recorded_tests(patch)
    assert all(has_proof(builtin) for builtin in SERIES)


def test_matrix_compares_a_patch_from_elsewhere_only_where_targets_has_it(
    vendor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """targets.toml has no table for a vendor's patch: its state is shown,
    not counted as a difference (a --targets FILE with its table compares it)."""
    from deepstack_patch.distribution import matrix

    from tests.support import TARGETS

    release = TARGETS.releases[0]
    expected = {i: s.value for i, s in TARGETS.expected(release).items()}
    states = {**expected, "acme#12": "not-applicable"}
    monkeypatch.setattr(
        matrix, "run_matrix", lambda *a, **k: [matrix.ReleaseResult(release, states)]
    )
    series = assemble_series(SERIES, patches_from_folder(vendor))
    ids = {patch.id for patch in series}
    result = matrix.check_matrix([release], series, ids, TARGETS, jobs=1, verify=False)
    assert result.differences == [] and len(expected) == len(SERIES)
    states[SERIES[0].id] = "drifted"  # the built-in ones are still compared
    again = matrix.check_matrix([release], series, ids, TARGETS, jobs=1, verify=False)
    assert [(d.patch_id, d.found) for d in again.differences] == [
        (SERIES[0].id, "drifted")
    ]


def test_the_recognition_cache_knows_a_folder_patch_by_its_file(
    tmp_path: Path,
) -> None:
    """A changed byte of a vendor's module is a new cache key; so is another
    folder's patch of the same class (derived patches share one)."""
    from deepstack_patch.engine import recognition_cache

    one = tmp_path / "one"
    path = toy_module(one, "toy.py", "acme#1")
    first = recognition_cache._code_fingerprint(patches_from_folder(one))
    assert first is not None
    assert recognition_cache._code_fingerprint(patches_from_folder(one)) == first
    path.write_text(path.read_text() + "\n# a vendor's edit\n")
    assert recognition_cache._code_fingerprint(patches_from_folder(one)) != first
    two = tmp_path / "two"
    toy_module(two, "toy.py", "acme#1")
    other = recognition_cache._code_fingerprint(patches_from_folder(two))
    assert other not in (None, first)


def test_the_code_fingerprint_covers_the_engines_subpackages() -> None:
    """A change to the code that recognises derived patches (engine/derived)
    makes new keys: the kept plans and recognitions were once keyed by the
    engine's top modules alone, and stayed stale after a change there."""
    from deepstack_patch.engine import recognition_cache

    engine = Path(recognition_cache.__file__).parent
    sources = recognition_cache.engine_sources()
    assert engine / "derived" / "runtime.py" in sources
    assert engine / "recognition_cache.py" in sources


def test_verify_runs_the_prove_of_a_folder_patch_in_the_proof_process(
    tmp_path: Path,
) -> None:
    """A vendor's hand-written prove() runs in verify's proof process, which
    loads the patch from the folder's file (fail-to-pass)."""
    from deepstack_patch.engine.tree import VllmTree
    from deepstack_patch.proof import envs, verify

    from tests.support import TARGETS

    folder = tmp_path / "vendor"
    path = toy_module(folder, "proven.py", "acme#12")
    path.write_text(
        path.read_text().replace(
            "\n\nPATCH = ",
            "\n\n    def prove(self, tree):\n"
            "        from vllm.toy import answer\n\n"
            "        assert answer() == 42, f'answer() is {answer()}'\n"
            "\n\nPATCH = ",
        )
    )
    series = assemble_series(SERIES, patches_from_folder(folder))
    report = verify.verify_tree(
        VllmTree.open(make_tree(tmp_path / "fixed", 42)),
        series,
        {"acme#12"},
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(make_tree(tmp_path / "pristine", 41)),
    )
    (verdict,) = report.verdicts
    assert verdict.pristine_proof.status == "failed"
    assert verdict.pristine_proof.message == "answer() is 41"
    assert verdict.proof.status == "passed", verdict.proof.message
    assert verdict.fail_to_pass == "proven" and report.exit_code == 0


def test_an_entry_point_callable_that_fails_names_it(site: Path) -> None:
    package = site / "acme_patches"
    package.mkdir()
    (package / "__init__.py").write_text("def patches():\n    return 1 / 0\n")
    install_entry_point(site, "acme_patches:patches")
    with pytest.raises(DeepstackError) as raised:
        series_module.patches_from_entry_points()
    assert raised.value.message.startswith("entry point acme (acme-patches 1.2)")
    assert "ZeroDivisionError" in raised.value.message and raised.value.hint


@pytest.mark.release
def test_a_folder_patch_applies_with_the_series_on_a_release(
    patched_copy: object, vendor: Path, tmp_path: Path
) -> None:
    """On a copy of 0.20.2 (with the toy's file added): the built-in series
    and the folder's patch, one write; the export lists it last."""
    tree = patched_copy("0.20.2")  # type: ignore[operator]
    (tree / TOY_FILE).write_text("def answer():\n    return 41\n")
    base = ["--vllm-src", str(tree), "--patches", str(vendor)]
    code, out, err = run("export", *base, "--series", str(tmp_path / "series"))
    assert code == 0, out + err
    names = (tmp_path / "series" / "series").read_text().split()
    assert names[-1].endswith(".patch") and "acme" in names[-1]
    code, out, err = run("apply", *base, "--format", "json")
    assert code == 0, out + err
    applied = json.loads(out)["applied"]
    assert applied[-1] == "acme#12" and len(applied) > 1
    assert (tree / TOY_FILE).read_text().endswith("return 42\n")


def test_a_derived_patch_without_url_or_release_says_nothing_empty(
    tmp_path: Path, toy_tree: Path
) -> None:
    """A derived patch whose author named no URL, first fixed release or
    symptom: every output leaves those out and says where the fix came from,
    and the SBOM stays valid CycloneDX."""
    import subprocess

    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from deepstack_patch.distribution.provenance import (
        AppliedPatch,
        UpstreamArtefact,
        sbom_document,
    )

    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "acme-5.toml").write_text(
        DERIVED_TOML.replace('symptom = "answer() returns 41"', 'symptom = ""')
    )
    (patch,) = patches_from_folder(folder)
    assert (patch.upstream_url, patch.fixed_in, patch.symptom) == ("", "", "")
    empty = (" ()", "vLLM )", "in )", ": \n", "Bug:", "Applied-Upstream:")

    def says_nothing_empty(text: str) -> None:
        assert "derived" in text
        assert not [words for words in empty if words in text], text

    code, out, err = run("list", "--patches", str(folder))
    assert code == 0, err
    says_nothing_empty(out[out.index("acme#5") :])
    assert "upstream: none named (derived from a diff against vLLM 0.20.2)" in out
    base = ["--vllm-src", str(toy_tree), "--patches", str(folder), "--only", "acme#5"]
    for command in (["status"], ["apply", "--check"]):
        code, out, err = run(*command, *base)
        assert code in (0, 1), err
        says_nothing_empty(out)
        assert "(derived on 0.20.2)" in out
    code, out, err = run("export", *base, "--series", str(tmp_path / "series"))
    assert code == 0, err
    (mail,) = (tmp_path / "series").glob("0001-*.patch")
    header = mail.read_text().split("\n---\n")[0]
    says_nothing_empty(header)
    assert "Origin: backport\n" in header and "Backport-of: acme#5" in header

    def git(*words: str) -> str:
        return subprocess.run(
            ["git", "-C", str(toy_tree), *words],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "vLLM")
    code, out, err = run("apply", *base, "--commit")
    assert code == 0, err
    message = git("log", "-1", "--format=%B")
    says_nothing_empty(message)
    assert message.splitlines()[:3] == [
        "answer() returns 42",
        "",
        "Backport of acme#5",
    ]
    assert git("log", "-1", "--format=%(trailers:only)").strip() == (
        "Backport-of: acme#5"
    )

    sbom = sbom_document(
        release="0.20.2",
        local_version="0.20.2+deepstack.1",
        upstream=UpstreamArtefact("vllm-0.20.2.tar.gz", "ab" * 32, "sdist"),
        applied=[AppliedPatch(patch, "series/0001-acme-5.patch", mail.read_bytes())],
    )
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(sbom) is None
    (entry,) = json.loads(sbom)["metadata"]["component"]["pedigree"]["patches"]
    (issue,) = entry["resolves"]
    assert "references" not in issue
    assert issue["description"] == "(derived from a diff against vLLM 0.20.2)"


def test_a_patch_module_with_only_the_required_metadata_runs_everywhere(
    tmp_path: Path, toy_tree: Path
) -> None:
    """A vendor's patch module that names no URL, release or symptom (only
    id, title, paths, markers and parts are required) is listed, planned and
    exported without an empty field."""
    folder = tmp_path / "bare"
    module = toy_module(folder, "bare.py", "acme#12")
    text = module.read_text()
    for line in (
        '    upstream_url = "https://example.com/acme/12"\n',
        '    fixed_in = "99.0.0"\n',
        '    symptom = "answer() returns 41"\n',
    ):
        assert line in text
        text = text.replace(line, "")
    module.write_text(text)
    code, out, err = run("list", "--patches", str(folder))
    assert code == 0, err
    assert "acme#12  answer() returns 42\n  upstream: none named\n" in out
    base = ["--vllm-src", str(toy_tree), "--patches", str(folder), "--only", "acme#12"]
    code, out, err = run("status", *base)
    assert code == 0, err
    assert "answer() returns 42\n" in out and " ()" not in out
    code, out, err = run("export", *base, "--series", str(tmp_path / "series"))
    assert code == 0, err
    (mail,) = (tmp_path / "series").glob("0001-*.patch")
    header = mail.read_text().split("\n---\n")[0]
    assert "Origin: backport\n" in header and "Bug:" not in header


def test_every_built_in_patch_names_its_pull_request_and_release() -> None:
    assert SERIES
    for patch in SERIES:
        assert patch.upstream_url.startswith("https://github.com/"), patch.id
        assert patch.fixed_in and patch.symptom, patch.id

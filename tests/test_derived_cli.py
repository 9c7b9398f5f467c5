"""Derived patches at the command line, as a new user meets them (issue 31,
items 4, 8 and 9).

A toy tree serves where the tool's own wording is tested (``derive``'s next
steps, ``verify`` of a patch without tests, one change under two ids, the
JSON documents); upstream's vllm#49397 derived on 0.20.2 serves the
80-column terminal, whose long qualified names the issue saw cut.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.derived_cli import cli, derived_folder
from tests.test_json_schemas import errors
from tests.test_text_output import ANSI, WIDTH

TOY = "vllm/toy.py"
FIX = (
    f"--- a/{TOY}\n+++ b/{TOY}\n@@ -1,2 +1,2 @@\n"
    " def answer():\n-    return 41\n+    return 42\n"
)


def toy_tree(folder: Path) -> Path:
    (folder / "vllm").mkdir(parents=True)
    (folder / "vllm/__init__.py").write_text("")
    (folder / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (folder / TOY).write_text("def answer():\n    return 41\n")
    return folder


def derive_toy(work: Path, patch_id: str, out: str, *options: str) -> str:
    """``derive`` of the toy fix, run in ``work`` with a relative ``--out``."""
    (work / "fix.diff").write_text(FIX)
    if not (work / "tree").exists():
        toy_tree(work / "tree")
    made = cli(
        "derive", "--diff", "fix.diff", "--base-src", "tree", "--id", patch_id,
        "--out", out, *options, cwd=work,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    return made.stdout


# -- item 8: what derive and verify say ---------------------------------------------


def test_derive_says_what_to_run_next_and_it_runs(tmp_path: Path) -> None:
    out = derive_toy(tmp_path, "acme#5", "my-patches")
    folder = tmp_path / "my-patches"
    lines = out.splitlines()
    commands = [line.split() for line in lines if "deepstack-patch" in line]
    assert commands == [
        ["deepstack-patch", verb, "--vllm-src", "PATH", "--patches", str(folder)]
        for verb in ("apply", "verify")
    ], out
    # the first, with the user's tree for PATH, applies the patch
    apply = commands[0][1:]
    apply[apply.index("PATH")] = str(tmp_path / "tree")
    applied = cli(*apply, cwd="/")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "return 42" in (tmp_path / "tree" / TOY).read_text()


def stub_python(folder: Path) -> Path:
    """An interpreter ``verify --python`` accepts (torch and pytest are
    found: torch is an empty package here), for the checks that need no
    torch: a patch without a proof never reaches it."""
    (folder / "stub/torch").mkdir(parents=True)
    (folder / "stub/torch/__init__.py").write_text("")
    python = folder / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={folder / "stub"} exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return python


def test_verify_says_plainly_that_a_derived_patch_has_no_tests(tmp_path: Path) -> None:
    derive_toy(tmp_path, "acme#5", "out")
    tree, folder = str(tmp_path / "tree"), str(tmp_path / "out")
    assert cli("apply", "--vllm-src", tree, "--patches", folder).returncode == 0
    python = stub_python(tmp_path)
    result = cli(
        "verify", "--vllm-src", tree, "--patches", folder, "--only", "acme#5",
        "--python", str(python),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DerivedPatch" not in result.stdout + result.stderr
    assert "acme#5 is a derived patch" in result.stdout
    assert "changed no test file" in result.stdout
    hints = [line for line in result.stdout.splitlines() if line.startswith("hint: ")]
    assert len(hints) == 1 and "derive it again" in hints[0], result.stdout


def test_two_derived_patches_of_one_change_are_named(tmp_path: Path) -> None:
    derive_toy(tmp_path, "vllm#1", "upstream")
    derive_toy(tmp_path, "local#1", "ours")
    tree = str(tmp_path / "tree")
    both = [
        "--patches",
        str(tmp_path / "upstream"),
        "--patches",
        str(tmp_path / "ours"),
    ]
    status = cli("status", "--vllm-src", tree, *both)
    assert status.returncode == 0, status.stderr
    assert "warning: vllm#1 and local#1 make the same change" in status.stderr
    applied = cli("apply", "--vllm-src", tree, *both, "--format", "json")
    assert applied.returncode == 0, applied.stderr
    assert "vllm#1 and local#1 make the same change" in applied.stderr
    assert json.loads(applied.stdout)["applied"] == ["vllm#1"]
    # one of them alone: nothing to say
    alone = cli("status", "--vllm-src", tree, "--patches", str(tmp_path / "ours"))
    assert "warning" not in alone.stderr, alone.stderr


# -- item 9: the JSON documents -------------------------------------------------------


def test_derives_document_has_its_tree_and_an_absolute_data_file(
    tmp_path: Path,
) -> None:
    document = json.loads(derive_toy(tmp_path, "acme#5", "out", "--format", "json"))
    assert errors("derive", document) == []
    assert document["data_file"] == str(tmp_path / "out" / "acme-5.toml")
    assert Path(document["data_file"]).is_file()
    assert document["tree"] == {
        "path": str(tmp_path / "tree"),
        "version": "0.20.2",
        "version_source": "PKG-INFO",
    }


def test_list_and_status_give_a_derived_patchs_base(tmp_path: Path) -> None:
    derive_toy(tmp_path, "acme#5", "out")
    patches = ["--patches", str(tmp_path / "out"), "--format", "json"]
    listed = cli("list", *patches)
    status = cli("status", "--vllm-src", str(tmp_path / "tree"), *patches)
    for name, result in (("list", listed), ("status", status)):
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert errors(name, document) == []
        bases = {patch["id"]: patch["base"] for patch in document["patches"]}
        assert bases.pop("acme#5") == "0.20.2"
        assert bases and set(bases.values()) == {""}  # the built-in ones


# -- item 4: 80 columns -------------------------------------------------------------


@pytest.fixture(scope="module")
def derived_on_0_20_2(
    release_tree: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """vllm#49397 derived from upstream's diff, and the release 0.20.2."""
    work = tmp_path_factory.mktemp("derived-80")
    folder = derived_folder("vllm#49397", "local#49397", release_tree, work)
    return release_tree("0.20.2"), folder


@pytest.mark.release
@pytest.mark.skipif(shutil.which("script") is None, reason="no `script` here")
@pytest.mark.parametrize("words", [["status"], ["apply", "--check"]])
def test_an_80_column_terminal_shows_a_derived_patch_whole(
    words: list[str], derived_on_0_20_2: tuple[Path, Path]
) -> None:
    """Every word the pipe gets (a qualified name, a ``file:line``, a
    path) stands whole on the terminal, none wider than a line."""
    tree, folder = derived_on_0_20_2
    args = [*words, "--patches", str(folder), "--vllm-src", str(tree)]
    piped = cli(*args)
    assert piped.returncode in (0, 1), piped.stdout + piped.stderr
    line = subprocess.list2cmdline([sys.executable, "-m", "deepstack_patch", *args])
    result = subprocess.run(
        ["script", "-qec", line, "/dev/null"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": str(WIDTH), "LINES": "50", "TERM": "xterm"},
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    assert result.returncode == piped.returncode, result.stdout
    shown = ANSI.sub("", result.stdout).replace("\r", "")
    assert [line for line in shown.split("\n") if len(line) > WIDTH] == []
    words_piped = piped.stdout.split()
    assert "Qwen3VLMoeForConditionalGeneration.__init__" in words_piped  # the issue's
    assert [word for word in words_piped if len(word) > WIDTH] == []
    shown_words = set(shown.split())
    assert [word for word in words_piped if word not in shown_words] == []


# -- issue 41, item 6: a unit of unnamed statements ----------------------------------

TRY_BEFORE = (
    "X = 1\n\n\ntry:\n    import json\nexcept ImportError:\n    json = None\n\n\n"
    "def answer():\n    return 41\n"
)
TRY_FIX = (
    f"--- a/{TOY}\n+++ b/{TOY}\n@@ -1,10 +1,7 @@\n X = 1\n \n \n"
    "-try:\n-    import json\n-except ImportError:\n-    json = None\n+import json\n"
    " \n \n def answer():\n"
)


def test_a_unit_of_unnamed_statements_is_shown_by_its_code_and_line(
    tmp_path: Path,
) -> None:
    """A module-level ``try`` the fix removes goes by its code, at its own
    line (4), not by the word ``try`` at the module's first line."""
    tree = toy_tree(tmp_path / "tree")
    (tree / TOY).write_text(TRY_BEFORE)
    (tmp_path / "fix.diff").write_text(TRY_FIX)
    made = cli(
        "derive", "--diff", "fix.diff", "--base-src", "tree", "--id", "acme#9",
        "--out", "out", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    label = "`try: import json …`"
    assert f"  module-statement {label} ({TOY})" in made.stdout, made.stdout
    patches = ["--patches", str(tmp_path / "out"), "--only", "acme#9"]
    status = cli("status", "--vllm-src", str(tree), *patches)
    assert f"{TOY}:4 {label}" in status.stdout, status.stdout
    document = json.loads(
        cli("status", "--vllm-src", str(tree), *patches, "--format", "json").stdout
    )
    (patch,) = [p for p in document["patches"] if p["id"] == "acme#9"]
    (location,) = patch["locations"]
    # The data's name stays what it was: the label is for people.
    assert (location["symbol"], location["line"]) == ("try", 4)

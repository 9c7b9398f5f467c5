"""Derived patches: ``derive`` turns a diff into data; the engine reads it.

The fast tier uses small synthetic modules written here; the release tier
cuts a fix's diff from two cached releases at test time (no vLLM code is
committed) and checks the derived patch's states on the other releases.
"""

from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.authoring.derive import (
    apply_file_diff,
    derive_patch_from_text,
    parse_diff,
)
from deepstack_patch.cli import main
from deepstack_patch.engine.derived import (
    DerivedPatch,
    data_file_name,
    dump_derived,
    load_derived,
)
from deepstack_patch.engine.derived.units import units_of_change
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import plan_tree, rewrite_text
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import ASKED_FOR, VllmTree

PATH = "vllm/buffers.py"

BEFORE = '''"""Buffers for a made-up model."""
import os
from typing import Any

LIMIT = 4


class Buffer:
    size = 8

    def __init__(self, n):
        """Make it."""
        self.n = n
        if n > LIMIT:
            self.data = [0] * n
        self.ready = True

    def read(self):
        return self.n


@staticmethod
def helper(x):
    return x + 1
'''

AFTER = '''"""Buffers for a made-up model."""
import os
from typing import Any, Optional

LIMIT = 4


class Buffer:
    size = 16

    def __init__(self, n, device=None):
        """Make it."""
        self.n = n
        if n > LIMIT:
            # only on a real device
            if device != "meta":
                self.data = [0] * n
        self.ready = True

    def read(self):
        return self.n

    def close(self):
        self.ready = False


@staticmethod
def helper(x):
    return x + 2
'''


def derived(before: str = BEFORE, after: str = AFTER) -> DerivedPatch:
    units = units_of_change(PATH, before, after)
    return DerivedPatch(
        id="local#1",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units,
    )


def states(patch: DerivedPatch, source: str) -> dict[str, tuple[PatchState, str]]:
    return {
        f.symbol: (f.state, f.reason) for f in patch.recognise(ast.parse(source), PATH)
    }


# -- units and the four states ------------------------------------------------


def test_units_of_a_change_name_every_changed_definition_and_statement() -> None:
    units = {(u.kind, u.name): u for u in units_of_change(PATH, BEFORE, AFTER)}
    assert set(units) == {
        ("import", "imports"),
        ("class-attribute", "Buffer.size"),
        ("method", "Buffer.__init__"),
        ("method", "Buffer.close"),
        ("function", "helper"),
    }
    init = units[("method", "Buffer.__init__")]
    assert [e.kind for e in init.edits] == ["header", "body"]
    assert init.before.startswith("def __init__(self, n):")
    assert init.after.startswith("def __init__(self, n, device=None):")


def test_needed_becomes_the_diffs_result_then_stays_applied() -> None:
    patch = derived()
    assert {s for s, _ in states(patch, BEFORE).values()} == {PatchState.NEEDED}
    fixed = rewrite_text(patch, BEFORE, PATH)
    assert fixed == AFTER  # the text, comments and blank lines included
    assert {s for s, _ in states(patch, fixed).values()} == {PatchState.APPLIED}
    assert rewrite_text(patch, fixed, PATH) == fixed


def test_formatting_comments_docstrings_and_other_code_do_not_matter() -> None:
    patch = derived()
    vendor = BEFORE.replace(
        '        """Make it."""\n        self.n = n\n',
        "        # the vendor's comment\n        self.n = (n)\n"
        "        self.extra = 1\n",
    ).replace("    return x + 1", "    # still one\n    return x+1")
    assert {s for s, _ in states(patch, vendor).values()} == {PatchState.NEEDED}
    fixed = rewrite_text(patch, vendor, PATH)
    assert "self.extra = 1" in fixed and "# the vendor's comment" in fixed
    # A comment above a replaced statement stays above its replacement.
    assert "    # still one\n    return x + 2\n" in fixed
    assert {s for s, _ in states(patch, fixed).values()} == {PatchState.APPLIED}


def test_an_absent_unit_is_not_applicable_and_the_report_names_it(
    tmp_path: Path,
) -> None:
    before = "def helper(x):\n    return x + 1\n"
    after = "def helper(x):\n    return x + 2\n"
    patch = derived(before, after)
    assert patch.recognise(ast.parse("def other():\n    pass\n"), PATH) == []
    tree = _tree(tmp_path, {PATH: "def other():\n    pass\n"})
    report = plan_tree(tree, [patch], rewrite=False).report(patch.id)
    assert report.state is PatchState.NOT_APPLICABLE
    assert report.reason == f"target absent: no function helper in {PATH} in this tree"


def test_a_statement_not_found_or_found_twice_drifts_and_is_named() -> None:
    patch = derived()
    gone = BEFORE.replace("            self.data = [0] * n\n", "            pass\n")
    state, reason = states(patch, gone)["Buffer.__init__"]
    assert state is PatchState.DRIFTED
    assert reason == "`self.data = [0] * n` not found in the block at line 14"
    twice = BEFORE.replace(
        "            self.data = [0] * n\n",
        "            self.data = [0] * n\n            self.data = [0] * n\n",
    )
    state, reason = states(patch, twice)["Buffer.__init__"]
    assert state is PatchState.DRIFTED
    assert "`self.data = [0] * n` found 2 times" in reason


def test_a_drifted_block_is_shown_at_its_def_and_quoted_whole() -> None:
    """A block the fix changes inside, not found: the location is the
    unit's def (never line 1), and the reason quotes its whole first logical
    line, cut at 80 columns (issue 34 item 6)."""
    header = (
        "    if (\n"
        "        n > LIMIT  # large\n"
        "        and not self.some_rather_long_flag_name_of_the_vendor\n"
        "    ):\n"
    )
    before = f"LIMIT = 4\n\n\ndef make(self, n):\n{header}        a = 1\n"
    after = before.replace("n > LIMIT", "n >= LIMIT")  # a header edit
    patch = derived(before, after)
    assert patch.units[0].edits[0].header_before.startswith("if (\n")
    gone = before.replace(header, "    if n:\n")
    (finding,) = patch.recognise(ast.parse(gone), PATH)
    assert finding.state is PatchState.DRIFTED
    assert finding.line == 4  # def make
    quoted = "if (n > LIMIT and not self.some_rather_long_flag_name_of_the_vendor):"
    assert finding.reason == f"`{quoted}` not found in def make"
    longer = patch.units[0].edits[0].header_before.replace("vendor", "vendor_x" * 3)
    from deepstack_patch.engine.derived.shapes import quoted as quote

    whole = quoted.replace("vendor", "vendor_x" * 3)
    assert quote(longer) == whole[:77] + "..."
    assert len(quote(longer)) == 80


def test_the_fix_wrapped_in_another_block_since_is_applied() -> None:
    before = "def f(x):\n    a = x\n    return a\n"
    after = "def f(x):\n    a = x\n    check(a)\n    return a\n"
    patch = derived(before, after)
    wrapped = (
        "def f(x):\n    a = x\n    with lock:\n        check(a)\n    return a + 0\n"
    )
    assert states(patch, wrapped)["f"] == (PatchState.APPLIED, "")
    twice = wrapped.replace(
        "        check(a)\n", "        check(a)\n    with lock:\n        check(a)\n"
    )
    assert states(patch, twice)["f"][0] is PatchState.DRIFTED


def test_a_header_change_is_recognised_like_a_statement() -> None:
    before = "@compile(dynamic=True, backend=b)\ndef count(x):\n    return x\n"
    after = "@compile(backend=b)\ndef count(x):\n    return x\n"
    patch = derived(before, after)
    assert [e.kind for e in patch.units[0].edits] == ["header"]
    assert states(patch, before)["count"][0] is PatchState.NEEDED
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["count"][0] is PatchState.APPLIED
    other = before.replace("dynamic=True", "dynamic=False")
    state, reason = states(patch, other)["count"]
    assert state is PatchState.DRIFTED and "header of count" in reason


def test_a_class_bases_change_is_the_class_header() -> None:
    before = "from m import Base, Mixin\n\n\nclass A(Base):\n    x = 1\n"
    after = "from m import Base, Mixin\n\n\nclass A(Base, Mixin):\n    x = 1\n"
    patch = derived(before, after)
    assert [(u.kind, u.name) for u in patch.units] == [("class", "A")]
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["A"][0] is PatchState.APPLIED


def test_changes_inside_elif_else_try_and_nested_defs() -> None:
    before = (
        "def f(x):\n"
        "    if x == 1:\n        a = 1\n"
        "    elif x == 2:\n        a = 2\n"
        "    else:\n        a = 3\n"
        "    try:\n        b = a\n    finally:\n        c = 0\n"
        "    def inner():\n        return a\n"
        "    return inner\n"
    )
    after = (
        before.replace("        a = 2\n", "        a = 20\n")
        .replace("        a = 3\n", "        a = 30\n")
        .replace("        b = a\n", "        b = a + 1\n")
        .replace("        c = 0\n", "        c = 0\n        d = 0\n")
        .replace("        return a\n", "        return a * 2\n")
    )
    patch = derived(before, after)
    assert [(u.kind, u.name, len(u.edits)) for u in patch.units] == [
        ("function", "f", 5)
    ]
    assert states(patch, before)["f"][0] is PatchState.NEEDED
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["f"][0] is PatchState.APPLIED


def test_imports_are_added_where_missing_in_upstreams_order() -> None:
    before = "import os\nfrom typing import Any, Dict\n\n\ndef f():\n    return 1\n"
    after = (
        "import os\nfrom typing import Any, Callable, Dict\n\n\n"
        "def f():\n    return Callable\n"
    )
    patch = derived(before, after)
    assert rewrite_text(patch, before, PATH) == after
    # Where the file already imports it, nothing is added.
    vendor = before.replace("import os\n", "import os\nfrom typing import Callable\n")
    assert states(patch, vendor)["imports"][0] is PatchState.APPLIED
    assert rewrite_text(patch, vendor, PATH).count("Callable") == 2


def test_an_import_the_fix_drops_stays_where_something_still_uses_it() -> None:
    before = "from typing import Any, Dict\n\n\ndef f():\n    return Dict\n"
    after = "from typing import Any\n\n\ndef f():\n    return None\n"
    patch = derived(before, after)
    assert rewrite_text(patch, before, PATH) == after
    vendor = before + '\n\n__all__ = ["Dict"]\n'
    assert "from typing import Any, Dict" in rewrite_text(patch, vendor, PATH)
    # Where the fix is in, an import it dropped that is still there stays.
    stale = after.replace("import Any", "import Any, Dict")
    assert {state for state, _ in states(patch, stale).values()} == {PatchState.APPLIED}


def test_a_new_method_goes_after_the_sibling_that_precedes_it_upstream() -> None:
    before = (
        "class A:\n    def a(self):\n        pass\n\n    def c(self):\n        pass\n"
    )
    after = (
        "class A:\n    def a(self):\n        pass\n\n    def b(self):\n"
        "        return 2\n\n    def c(self):\n        pass\n"
    )
    patch = derived(before, after)
    assert [(u.kind, u.name) for u in patch.units] == [("method", "A.b")]
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["A.b"][0] is PatchState.APPLIED


def test_module_statements_and_functions_added_and_removed() -> None:
    before = (
        "LIMIT = 4\n\n\ndef a():\n    return LIMIT\n\n\n"
        "def old():\n    return 0\n\n\ndef c():\n    return 3\n"
    )
    after = (
        "LIMIT = 8\n\n\ndef a():\n    return LIMIT\n\n\n"
        "def b():\n    return 2\n\n\ndef c():\n    return 3\n"
    )
    patch = derived(before, after)
    assert [(u.kind, u.name) for u in patch.units] == [
        ("module-statement", "LIMIT"),
        ("function", "old"),
    ]
    assert states(patch, before) == {
        "LIMIT": (PatchState.NEEDED, ""),
        "old": (PatchState.NEEDED, ""),
    }
    assert rewrite_text(patch, before, PATH) == after
    assert {s for s, _ in states(patch, after).values()} == {PatchState.APPLIED}


def test_a_patch_applies_whole_or_not_at_all_in_a_file() -> None:
    before = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"
    after = "def f():\n    return 2\n\n\ndef g():\n    return 2\n"
    patch = derived(before, after)
    only_f = "def f():\n    return 1\n"
    state, reason = states(patch, only_f)["f"]
    assert state is PatchState.DRIFTED
    assert "function g in vllm/buffers.py is absent while f is there" in reason


def test_an_applied_unit_beside_an_absent_one_drifts() -> None:
    # Issue 30, item 3: some code units there and some absent drift, in
    # every state (applied with the other half gone is not the fix).
    before = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"
    after = "def f():\n    return 2\n\n\ndef g():\n    return 2\n"
    patch = derived(before, after)
    state, reason = states(patch, "def f():\n    return 2\n")["f"]
    assert state is PatchState.DRIFTED
    assert "function g in vllm/buffers.py is absent while f is there" in reason


def test_a_patch_needed_in_one_file_and_absent_from_another_drifts(
    tmp_path: Path,
) -> None:
    other = "vllm/other.py"
    units = [
        *units_of_change(PATH, "def f():\n    return 1\n", "def f():\n    return 2\n"),
        *units_of_change(other, "def g():\n    return 1\n", "def g():\n    return 2\n"),
    ]
    patch = DerivedPatch(
        id="local#2", title="", symptom="", base="", paths=[PATH, other], units=units
    )
    tree = _tree(tmp_path, {PATH: "def f():\n    return 1\n", other: "x = 1\n"})
    report = plan_tree(tree, [patch]).report(patch.id)
    assert report.state is PatchState.DRIFTED
    assert report.reason == (
        "vllm/other.py::g: function g in vllm/other.py is absent while f is "
        "needed: it applies whole or not at all"
    )
    # Shown at its own file, not at f's line in the other one.
    (absent,) = [loc for loc in report.locations if loc.finding.part.endswith("::g")]
    assert (absent.path, absent.finding.line) == (other, 0)
    whole = _tree(
        tmp_path / "whole",
        {PATH: "def f():\n    return 1\n", other: "def g():\n    return 1\n"},
    )
    assert plan_tree(whole, [patch]).report(patch.id).state is PatchState.NEEDED


def test_the_recognition_cache_keys_on_a_derived_patchs_data() -> None:
    from deepstack_patch.engine.recognition_cache import _fingerprint

    one = derived()
    other = derived(BEFORE, AFTER.replace("x + 2", "x + 3"))
    assert _fingerprint([one]) != _fingerprint([other])
    assert _fingerprint([one]) == _fingerprint([derived()])


def test_partly_applied_unit_drifts() -> None:
    before = "def f():\n    a = 1\n    b = 1\n    c = 1\n    d = 1\n    return a\n"
    after = "def f():\n    a = 2\n    b = 1\n    c = 1\n    d = 2\n    return a\n"
    patch = derived(before, after)
    half = before.replace("a = 1", "a = 2")
    state, reason = states(patch, half)["f"]
    assert state is PatchState.DRIFTED and "part of the fix is there" in reason


# -- the data file ---------------------------------------------------------------


def test_the_data_file_reads_back_as_the_same_patch(tmp_path: Path) -> None:
    patch = derived()
    path = tmp_path / data_file_name("vllm#49397")
    assert path.name == "vllm-49397.toml"
    path.write_text(dump_derived(patch))
    loaded = load_derived(path)
    assert loaded.units == patch.units
    assert loaded.origin == str(path)
    assert rewrite_text(loaded, BEFORE, PATH) == AFTER
    text = path.read_text()
    assert "after = '''\ndef __init__(self, n, device=None):" in text


@pytest.mark.parametrize(
    ("content", "message", "line"),
    [
        ("schema = 1\nid = = 2\n", "not a valid TOML file", 2),
        ("schema = 2\nid = 'x'\n", "schema is 2, expected 1", None),
        ("schema = 1\nid = 'x'\n", "missing field 'units'", None),
        (None, "path '../x.py' is not a .py file inside the tree", None),
    ],
)
def test_a_broken_data_file_names_itself(
    tmp_path: Path, content: str | None, message: str, line: int | None
) -> None:
    path = tmp_path / "bad.toml"
    if content is None:  # a whole file whose paths leave the tree
        content = dump_derived(derived()).replace(
            f'paths = ["{PATH}"]', 'paths = ["../x.py"]'
        )
    path.write_text(content)
    with pytest.raises(DeepstackError) as caught:
        load_derived(path)
    assert message in caught.value.message
    assert caught.value.path == str(path) and caught.value.line == line
    assert "derive" in caught.value.hint


# -- diffs -----------------------------------------------------------------------


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


def test_diffs_as_git_github_and_format_patch_write_them() -> None:
    diff = git_diff(PATH, BEFORE, AFTER)
    format_patch = (
        "From 0123 Mon Sep 17 00:00:00 2001\nFrom: A <a@b>\nSubject: [PATCH] x\n\n"
        "---\n vllm/buffers.py | 2 +-\n\n" + diff + "-- \n2.40.0\n"
    )
    plain = diff.split("\n", 2)[2]  # diff -u: no git header
    for text in (diff, format_patch, plain):
        (file_diff,) = parse_diff(text)
        assert file_diff.path == PATH
        assert apply_file_diff(file_diff, BEFORE) == AFTER


def test_a_series_that_changes_a_file_twice_applies_in_order(
    tmp_path: Path, base: Path
) -> None:
    middle = BEFORE.replace("size = 8", "size = 16")
    series = git_diff(PATH, BEFORE, middle) + git_diff(PATH, middle, AFTER)
    result = derive_patch_from_text(series, VllmTree.open(base), "local#3")
    assert rewrite_text(result.patch, BEFORE, PATH) == AFTER


def test_no_newline_at_end_of_file() -> None:
    diff = (
        "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n\\ No newline at end of file\n"
        "+a = 2\n\\ No newline at end of file\n"
    )
    (file_diff,) = parse_diff(diff)
    assert apply_file_diff(file_diff, "a = 1") == "a = 2"


def test_what_unidiff_reads_otherwise_is_read_as_git_reads_it() -> None:
    """unidiff (which parses the diffs) calls a file whose only hunk starts
    at line 0 added, and reads a line that opens like a hunk but is not one
    as text between files: an empty file that gains lines is changed, not
    added, and a malformed hunk header is refused, never skipped."""
    empty = (
        "diff --git a/vllm/e.py b/vllm/e.py\nindex e69de29..1111111 100644\n"
        "--- a/vllm/e.py\n+++ b/vllm/e.py\n@@ -0,0 +1 @@\n+a = 1\n"
    )
    (file_diff,) = parse_diff(empty)
    assert not file_diff.new_file and file_diff.line == 1
    assert apply_file_diff(file_diff, "") == "a = 1\n"
    (added,) = parse_diff(empty.replace("--- a/vllm/e.py", "--- /dev/null"))
    assert added.new_file
    malformed = "--- a/x.py\n+++ b/x.py\n@@ -1 +1@@\n-a = 1\n+a = 2\n"
    with pytest.raises(DeepstackError) as caught:
        parse_diff(malformed, "fix.diff")
    assert "a malformed hunk header" in caught.value.message
    assert (caught.value.path, caught.value.line) == ("fix.diff", 3)
    cut = "--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a = 0\n-a = 1\n+a = 2\n"
    with pytest.raises(DeepstackError) as caught:
        parse_diff(cut, "fix.diff")
    assert "a malformed diff" in caught.value.message
    assert caught.value.line == 6 and "unchanged" in caught.value.hint
    binary = (
        "diff --git a/vllm/x.bin b/vllm/x.bin\nnew file mode 100644\n"
        "index 0000000..1111111\nGIT binary patch\nliteral 3\nKcmZ>A00001\n\n"
        "literal 0\nHcmV?d00001\n\n"
    )
    (file_diff,) = parse_diff(binary + empty)[:1]
    assert file_diff.binary and file_diff.path == "vllm/x.bin"


# -- the command: written, and every refusal ---------------------------------


def _tree(root: Path, files: dict[str, str], *, partial: bool = False) -> VllmTree:
    """A vLLM tree of ``files``: whole (as any folder without this tool's
    list of what it extracted is), or with ``partial`` this tool's partial
    extraction that lists nothing: no file known absent, and the runtime
    names of a derived patch not checked (toy code whose attributes no toy
    package defines)."""
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.0.1\n"
    )
    if partial:
        (root / ASKED_FOR).write_text("")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return VllmTree.open(root)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return _tree(tmp_path / "base", {PATH: BEFORE}).root


def derive_args(
    diff: Path, base: Path, out: Path, patch_id: str = "local#F1"
) -> list[str]:
    return [
        "derive",
        "--diff",
        str(diff),
        "--base-src",
        str(base),
        "--id",
        patch_id,
        "--out",
        str(out),
    ]


def test_derive_writes_one_checked_data_file(tmp_path: Path, base: Path) -> None:
    diff = tmp_path / "fix.diff"
    test_path = "tests/test_buffers.py"
    diff.write_text(
        git_diff(PATH, BEFORE, AFTER)
        + git_diff(test_path, "", "def test_it():\n    assert True\n").replace(
            f"--- a/{test_path}", "--- /dev/null"
        )
    )
    out = tmp_path / "out"
    code, output = run(*derive_args(diff, base, out), "--format", "json")
    assert code == 0, output
    document = json.loads(output)
    assert document["round_trip"] == "text"
    assert document["tests"] == [test_path]
    patch = load_derived(out / "local-F1.toml")
    assert patch.recorded_tests[0].content == "def test_it():\n    assert True\n"
    assert patch.base == "0.0.1"
    assert [f.name for f in out.iterdir()] == ["local-F1.toml"]


def _refused(
    tmp_path: Path, diff_text: str, base: Path, *extra: str, patch_id: str = "local#F1"
) -> str:
    diff = tmp_path / "input.diff"
    diff.write_text(diff_text)
    out = tmp_path / "refused-out"
    code, output = run(*derive_args(diff, base, out, patch_id), *extra)
    assert code == 2, output
    assert "error:" in output and "hint:" in output
    assert not out.exists() or not any(out.iterdir())
    return output


def test_not_a_diff_is_refused(tmp_path: Path, base: Path) -> None:
    assert "not a diff" in _refused(tmp_path, "just some text\n", base)
    diff = tmp_path / "input.diff"
    out = tmp_path / "json-out"
    result = CliRunner().invoke(
        main, [*derive_args(diff, base, out), "--format", "json"]
    )
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["command"] == "derive"
    assert document["error"]["message"].startswith("not a diff")
    assert not out.exists()


def test_a_binary_file_is_left_out_with_a_note(tmp_path: Path, base: Path) -> None:
    """Inverted (issue 34 item 5): a binary file (a commit's test asset) is
    left out with a note, as other non-Python files are, not refused."""
    text = (
        "diff --git a/tests/assets/x.bin b/tests/assets/x.bin\nindex 1..2 100644\n"
        "Binary files a/tests/assets/x.bin and b/tests/assets/x.bin differ\n"
    )
    output = _refused(tmp_path, text, base)
    assert (
        "the diff changes no Python code: tests/assets/x.bin: a binary file, "
        "left out" in " ".join(output.split())
    )
    diff = tmp_path / "fix.diff"
    diff.write_text(text + git_diff(PATH, BEFORE, AFTER))
    out = tmp_path / "out"
    code, output = run(*derive_args(diff, base, out), "--format", "json")
    assert code == 0, output
    assert json.loads(output)["notes"] == [
        "tests/assets/x.bin: a binary file, left out"
    ]


def test_a_rename_only_diff_is_refused(tmp_path: Path, base: Path) -> None:
    text = (
        f"diff --git a/{PATH} b/vllm/renamed.py\nsimilarity index 100%\n"
        f"rename from {PATH}\nrename to vllm/renamed.py\n"
    )
    assert "a rename without a change of code" in _refused(tmp_path, text, base)


def test_a_diff_against_a_file_the_base_lacks_is_refused(
    tmp_path: Path, base: Path
) -> None:
    text = git_diff("vllm/other.py", BEFORE, AFTER)
    output = _refused(tmp_path, text, base)
    assert "the diff changes vllm/other.py, which tree" in output
    assert "the pull request was made against" in output


def test_hunks_that_do_not_apply_are_refused_naming_hunk_and_file(
    tmp_path: Path, base: Path
) -> None:
    text = git_diff(PATH, BEFORE.replace("size = 8", "size = 9"), AFTER)
    output = _refused(tmp_path, text, base)
    assert f"hunk 1 (@@ -1,24 +1,29 @@) of {PATH} does not apply" in output
    assert "line 9 is 'size = 8', the hunk expects 'size = 9'" in output


def test_a_diff_without_python_code_is_refused(tmp_path: Path, base: Path) -> None:
    docs = git_diff("docs/x.md", "a\n", "b\n").replace("--- a/docs", "--- /dev/null\n#")
    only_docs = "--- /dev/null\n+++ b/docs/x.md\n@@ -0,0 +1 @@\n+b\n"
    assert "changes no Python code" in _refused(tmp_path, only_docs, base)
    only_tests = (
        "--- /dev/null\n+++ b/tests/test_x.py\n@@ -0,0 +1,2 @@\n"
        "+def test_x():\n+    pass\n"
    )
    assert "only test files" in _refused(tmp_path, only_tests, base)
    comment_only = git_diff(
        PATH, BEFORE, BEFORE.replace("LIMIT = 4", "LIMIT = 4  # max")
    )
    # A comment at a line's end is not carried (comment lines are).
    assert "comments at the end of a line" in _refused(tmp_path, comment_only, base)
    assert docs  # built from the same helper: a sanity check of the helper


def format_patch_mail(number: int, total: int, diff: str) -> str:
    """One mail of a ``git format-patch`` series, as ``--stdout`` writes it."""
    return (
        f"From {number:040x} Mon Sep 17 00:00:00 2001\nFrom: A <a@b>\n"
        f"Subject: [PATCH {number}/{total}] part {number}\n\n---\n"
        f" {PATH} | 2 +-\n\n{diff}-- \n2.40.0\n\n"
    )


def test_a_format_patch_series_whose_later_patch_counts_shifted_lines(
    tmp_path: Path, base: Path
) -> None:
    """Patch 1 adds lines above patch 2's change: patch 2's hunk header
    counts the lines of the file as patch 1 left it, not the base's."""
    middle = BEFORE.replace(
        "        self.n = n\n", "        self.n = n\n        self.m = n\n" * 3
    )
    after = middle.replace("return x + 1", "return x + 2")
    series = format_patch_mail(1, 2, git_diff(PATH, BEFORE, middle))
    series += format_patch_mail(2, 2, git_diff(PATH, middle, after))
    result = derive_patch_from_text(series, VllmTree.open(base), "local#4")
    assert [u.name for u in result.units] == ["Buffer.__init__", "helper"]
    assert rewrite_text(result.patch, BEFORE, PATH) == after


def test_form_feeds_and_unicode_line_separators_stay_inside_their_line(
    tmp_path: Path,
) -> None:
    """Python ends a line only at \\n, \\r\\n or \\r; str.splitlines also
    splits at a form feed or U+2028, which code (and git's hunk header,
    which quotes the line above the hunk) may hold."""
    before = 'SEP = "a\u2028b"\n\x0c\n\ndef answer():\n    return 41\n'
    after = before.replace("41", "42")
    root = _tree(tmp_path / "ff", {PATH: before}).root
    diff = (  # as git writes it (difflib splits as str.splitlines does)
        f'--- a/{PATH}\n+++ b/{PATH}\n@@ -2,4 +2,4 @@ SEP = "a\u2028b"\n'
        " \x0c\n \n def answer():\n-    return 41\n+    return 42\n"
    )
    result = derive_patch_from_text(diff, VllmTree.open(root), "local#5")
    assert [u.name for u in result.units] == ["answer"]
    assert result.round_trip == "text"
    assert rewrite_text(result.patch, before, PATH) == after


def test_a_crlf_diff_and_a_file_without_final_newline(
    tmp_path: Path, base: Path
) -> None:
    crlf = git_diff(PATH, BEFORE, AFTER).replace("\n", "\r\n")
    result = derive_patch_from_text(crlf, VllmTree.open(base), "local#6")
    assert rewrite_text(result.patch, BEFORE, PATH) == AFTER
    before, after = "def f():\n    return 1", "def f():\n    return 2"
    root = _tree(tmp_path / "no-newline", {PATH: before}).root
    diff = (
        f"--- a/{PATH}\n+++ b/{PATH}\n@@ -1,2 +1,2 @@\n def f():\n"
        "-    return 1\n\\ No newline at end of file\n"
        "+    return 2\n\\ No newline at end of file\n"
    )
    result = derive_patch_from_text(diff, VllmTree.open(root), "local#7")
    assert rewrite_text(result.patch, before, PATH) == after


def test_a_file_outside_the_vllm_package_is_left_out(
    tmp_path: Path, base: Path
) -> None:
    setup = "def f():\n    return 1\n"
    root = _tree(tmp_path / "outside", {PATH: BEFORE, "setup_helper.py": setup}).root
    outside = git_diff("setup_helper.py", setup, setup.replace("1", "2"))
    output = _refused(tmp_path, outside, root)
    assert "setup_helper.py: outside the vllm package, left out" in output
    both = git_diff(PATH, BEFORE, AFTER) + outside
    result = derive_patch_from_text(both, VllmTree.open(root), "local#8")
    assert result.patch.paths == (PATH,)
    assert result.notes == ["setup_helper.py: outside the vllm package, left out"]


def test_an_empty_diff_a_folder_and_a_bad_base_src_are_named(
    tmp_path: Path, base: Path
) -> None:
    empty = _refused(tmp_path, "", base)
    assert "the file is empty" in empty
    out = tmp_path / "out"
    code, output = run(*derive_args(tmp_path, base, out))
    assert code == 2 and "cannot read" in output and "hint:" in output
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, BEFORE, AFTER))
    code, output = run(*derive_args(diff, tmp_path / "absent", out))
    assert code == 2 and "--base-src" in output and "--vllm-src" not in output
    assert not out.exists()


def test_an_id_already_taken_is_refused(tmp_path: Path, base: Path) -> None:
    text = git_diff(PATH, BEFORE, AFTER)
    output = _refused(tmp_path, text, base, patch_id="vllm#49397")
    assert "already taken by a patch of the series" in output
    out = tmp_path / "out"
    diff = tmp_path / "fix.diff"
    diff.write_text(text)
    assert run(*derive_args(diff, base, out))[0] == 0
    before = (out / "local-F1.toml").read_text()
    code, output = run(*derive_args(diff, base, out))
    assert code == 2 and "already exists" in output
    assert (out / "local-F1.toml").read_text() == before


def test_an_id_of_a_patches_folder_or_an_entry_point_is_taken(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The series a derived patch joins is the whole one: built-in, installed
    packages' (entry points) and the --patches folders'."""
    from deepstack_patch.engine import series as series_module

    text = git_diff(PATH, BEFORE, AFTER)
    folder = tmp_path / "vendor"
    diff = tmp_path / "fix.diff"
    diff.write_text(text)
    assert run(*derive_args(diff, base, folder, "acme#7"))[0] == 0
    output = _refused(tmp_path, text, base, "--patches", str(folder), patch_id="acme#7")
    assert "--id acme#7: already taken by a patch of the series" in output
    installed = load_derived(folder / "acme-7.toml")
    installed.id = "pkg#1"
    monkeypatch.setattr(series_module, "patches_from_entry_points", lambda: [installed])
    output = _refused(tmp_path, text, base, patch_id="pkg#1")
    assert "--id pkg#1: already taken by a patch of the series" in output
    assert run(*derive_args(diff, base, tmp_path / "new", "acme#8"))[0] == 0


def test_fixed_in_and_upstream_url_are_kept_in_the_data_file(
    tmp_path: Path, base: Path
) -> None:
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, BEFORE, AFTER))
    url = "https://git.example/acme/vllm/merge_requests/12"
    args = ["--fixed-in", "0.31.0", "--upstream-url", url]
    assert run(*derive_args(diff, base, tmp_path / "out"), *args)[0] == 0
    patch = load_derived(tmp_path / "out" / "local-F1.toml")
    assert (patch.fixed_in, patch.upstream_url) == ("0.31.0", url)
    assert run(*derive_args(diff, base, tmp_path / "pr", "vllm#123"))[0] == 0
    patch = load_derived(tmp_path / "pr" / "vllm-123.toml")
    assert patch.upstream_url == "https://github.com/vllm-project/vllm/pull/123"
    assert patch.fixed_in == ""
    text = diff.read_text()
    bad_url = _refused(tmp_path, text, base, "--upstream-url", "github.com/x y")
    assert "--upstream-url 'github.com/x y': not an http(s) URL" in bad_url
    bad_version = _refused(tmp_path, text, base, "--fixed-in", "soon")
    assert "--fixed-in 'soon': not a version" in bad_version


def test_an_id_with_spaces_is_refused(tmp_path: Path, base: Path) -> None:
    output = _refused(tmp_path, git_diff(PATH, BEFORE, AFTER), base, patch_id="a b")
    assert "an id is short text without spaces" in output


def test_an_out_folder_that_cannot_be_written_is_refused(
    tmp_path: Path, base: Path
) -> None:
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, BEFORE, AFTER))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out in (a_file, a_file / "below"):
        code, output = run(*derive_args(diff, base, out))
        assert code == 2 and "error:" in output and "--out" in output
    assert a_file.read_text() == ""


def test_a_diff_whose_site_is_ambiguous_on_the_base_fails_the_self_check(
    tmp_path: Path,
) -> None:
    # Both `x = 1` sit between the same neighbours: nothing tells them apart.
    before = "def f(x):\n    a = 0\n    x = 1\n    a = 0\n    x = 1\n    a = 0\n"
    after = "def f(x):\n    a = 0\n    x = 1\n    a = 0\n    a = 0\n"
    root = _tree(tmp_path / "ambiguous", {PATH: before}).root
    output = _refused(tmp_path, git_diff(PATH, before, after), root)
    assert "self-check" in output and "found 2 times" in output


def test_derive_from_text_writes_nothing(tmp_path: Path, base: Path) -> None:
    tree = VllmTree.open(base)
    result = derive_patch_from_text(git_diff(PATH, BEFORE, AFTER), tree, "local#2")
    assert result.data_file is None and result.round_trip == "text"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


# -- real releases: diffs cut from two cached releases -------------------------

MODELS = "vllm/model_executor/models/"

#: vllm#49397's change (0.27.1 -> 0.28.0): the three deepstack-buffer
#: __init__s and the import of StageMissingLayer they use.
DEEPSTACK_BUFFERS = {
    MODELS + "qwen3_vl.py": (
        ["Qwen3VLForConditionalGeneration.__init__"],
        ["StageMissingLayer"],
    ),
    MODELS + "qwen3_vl_moe.py": (
        ["Qwen3VLMoeForConditionalGeneration.__init__"],
        ["StageMissingLayer"],
    ),
    MODELS + "qwen3_omni_moe_thinker.py": (
        ["Qwen3OmniMoeThinkerForConditionalGeneration.__init__"],
        ["StageMissingLayer"],
    ),
}

#: vllm#38933's change (0.19.1 -> 0.20.0).
SAMPLER_RECOMPILE = {
    "vllm/v1/sample/ops/logprobs.py": (["batched_count_greater_than"], []),
    "vllm/v1/sample/sampler.py": (["Sampler.gather_logprobs"], []),
}


def _states_on(patch: DerivedPatch, versions: list[str]) -> dict[str, PatchState]:
    from tests.support.upstream_diff import release_files

    found = {}
    for version in versions:
        tree = release_files(version, list(patch.paths))
        found[version] = plan_tree(tree, [patch], rewrite=False).report(patch.id).state
    return found


@pytest.mark.release
def test_vllm_49397_derived_from_its_diff(tmp_path: Path) -> None:
    from tests.support.upstream_diff import release_files, upstream_diff

    diff = tmp_path / "49397.diff"
    diff.write_text(upstream_diff("0.27.1", "0.28.0", DEEPSTACK_BUFFERS))
    out = tmp_path / "patches"
    code, output = run(
        "derive", "--diff", str(diff), "--base", "0.27.1", "--id", "local#49397",
        "--out", str(out), "--format", "json",
    )  # fmt: skip
    assert code == 0, output
    document = json.loads(output)
    print(f"derive vllm#49397's change: {document['seconds']} s")
    assert document["round_trip"] == "text"
    patch = load_derived(out / "local-49397.toml")
    assert sorted((u.kind, u.name) for u in patch.units) == sorted(
        [("import", "imports")] * 3
        + [("method", names[0]) for names, _ in DEEPSTACK_BUFFERS.values()]
    )
    needed = ["0.20.0", "0.20.2", "0.22.1", "0.23.0", "0.25.0", "0.27.1"]
    found = _states_on(patch, [*needed, "0.28.0", "0.30.0", "0.19.1"])
    assert found == {
        **dict.fromkeys(needed, PatchState.NEEDED),
        "0.28.0": PatchState.APPLIED,
        "0.30.0": PatchState.APPLIED,
        # The buffers' block has another shape there: refused, never guessed.
        "0.19.1": PatchState.DRIFTED,
    }
    # On 0.20.2 the rewrite builds the buffers outside the tower block.
    tree = release_files("0.20.2", list(patch.paths))
    plan = plan_tree(tree, [patch])
    assert {e.relpath for e in plan.edits} == set(DEEPSTACK_BUFFERS)
    for edit in plan.edits:
        module = ast.parse(edit.new)
        assert any(
            isinstance(node, ast.ImportFrom)
            and "StageMissingLayer" in [a.name for a in node.names]
            for node in module.body
        )
        (name,) = DEEPSTACK_BUFFERS[edit.relpath][0]
        init = _definition(module, name)
        at_top = [
            node
            for node in init.body
            if isinstance(node, ast.If)
            and ast.unparse(node.test) == "self.use_deepstack"
        ]
        assert len(at_top) == 1, name
        for node in init.body:
            if isinstance(node, ast.With):
                assert "deepstack_input_embeds" not in ast.unparse(node), name
        assert _states_on_text(patch, edit.relpath, edit.new.decode()) == {
            PatchState.APPLIED
        }


@pytest.mark.release
def test_vllm_38933_derived_from_its_diff(tmp_path: Path) -> None:
    from tests.support.upstream_diff import (
        new_file_diff,
        release_files,
        upstream_diff,
    )

    test_path = "tests/v1/sample/test_batched_count_greater_than.py"
    test_content = Path(
        release_files("0.20.0", [test_path]).root, test_path
    ).read_text()
    diff_text = upstream_diff("0.19.1", "0.20.0", SAMPLER_RECOMPILE) + new_file_diff(
        test_path, test_content
    )
    base = release_files("0.19.1", list(SAMPLER_RECOMPILE))
    result = derive_patch_from_text(diff_text, base, "local#38933")
    print(f"derive vllm#38933's change: {result.seconds:.2f} s")
    assert result.round_trip == "text"
    # The test the fix added is recorded whole, as the fixed release has it.
    assert [(t.path, t.content) for t in result.tests] == [(test_path, test_content)]
    assert result.patch.paths == tuple(SAMPLER_RECOMPILE)
    header = next(e for u in result.units for e in u.edits if e.kind == "header")
    assert "dynamic=True" in header.header_before
    assert "dynamic=True" not in header.header_after
    earlier = ["0.17.0", "0.18.0", "0.19.0"]
    later = ["0.20.0", "0.20.2", "0.22.1", "0.25.0", "0.27.1"]
    # 0.28.0 moved the fix's statements into a `with` block: still there,
    # together and once in the unit, so applied.
    found = _states_on(result.patch, [*earlier, *later, "0.28.0", "0.30.0"])
    assert found == {
        **dict.fromkeys(earlier, PatchState.NEEDED),
        **dict.fromkeys([*later, "0.28.0", "0.30.0"], PatchState.APPLIED),
    }


def _definition(module: ast.Module, qualified: str) -> ast.FunctionDef:
    body: list[ast.stmt] = module.body
    node: ast.stmt | None = None
    for name in qualified.split("."):
        node = next(
            n
            for n in body
            if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name
        )
        body = node.body
    assert isinstance(node, ast.FunctionDef)
    return node


def _states_on_text(patch: DerivedPatch, path: str, text: str) -> set[PatchState]:
    return {f.state for f in patch.recognise(ast.parse(text), path)}


@pytest.mark.verify
@pytest.mark.release
def test_derived_vllm_49397_passes_the_hand_written_proof(
    tmp_path: Path, proof_env: object, patched_copy: object
) -> None:
    """The issue's bar: derived from 0.27.1's diff and applied, the three
    __init__s build no buffers on the meta device: vllm#49397's CPU proof
    fails on pristine 0.25.0 and passes there patched, and passes on 0.20.2
    patched (whose pristine code hides the crash: it returns None until
    vllm#43617 is applied, so only the patched half is asked there)."""
    from deepstack_patch.engine.transaction import write_edits
    from deepstack_patch.proof.proofs import run_proofs

    from tests.support.upstream_diff import release_files, upstream_diff

    diff_text = upstream_diff("0.27.1", "0.28.0", DEEPSTACK_BUFFERS)
    base = release_files("0.27.1", list(DEEPSTACK_BUFFERS))
    patch = derive_patch_from_text(diff_text, base, "local#49397").patch

    def proof(root: Path) -> object:
        return run_proofs(proof_env, root, ["vllm#49397"])["vllm#49397"]  # type: ignore[arg-type]

    for release, fails_before in (("0.25.0", True), ("0.20.2", False)):
        root = patched_copy(release)  # type: ignore[operator]
        if fails_before:
            before = proof(root)
            assert before.status == "failed", before.message  # type: ignore[attr-defined]
        plan = plan_tree(VllmTree.open(root), [patch])
        assert plan.report(patch.id).state is PatchState.NEEDED
        write_edits(root, plan.edits)
        after = proof(root)
        assert after.status == "passed", (release, after.message)  # type: ignore[attr-defined]


RELEASES = [
    *("0.17.0", "0.18.0", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2"),
    *("0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.25.0", "0.27.1", "0.28.0"),
    "0.30.0",
]


@pytest.mark.release
@pytest.mark.parametrize(
    ("fix", "earlier", "later", "changes", "refused"),
    [
        ("vllm#49397", "0.27.1", "0.28.0", DEEPSTACK_BUFFERS, 4),
        ("vllm#38933", "0.19.1", "0.20.0", SAMPLER_RECOMPILE, 0),
    ],
)
def test_derived_and_hand_written_write_the_same_code_or_derived_refuses(
    fix: str, earlier: str, later: str, changes: dict, refused: int
) -> None:
    """On every release: where the derived patch is needed, both patches
    write the same code (ast, whole files); elsewhere the states agree, or the
    derived patch drifts (refused), never the other way round."""
    from deepstack_patch.patches import patch_by_id

    from tests.support.upstream_diff import release_files, upstream_diff

    diff_text = upstream_diff(earlier, later, changes)
    derived_patch = derive_patch_from_text(
        diff_text, release_files(earlier, list(changes)), "local#" + fix
    ).patch
    hand = patch_by_id(fix)
    compared, drifted = 0, 0
    for version in RELEASES:
        tree = release_files(version, list(derived_patch.paths))
        ours = plan_tree(tree, [derived_patch])
        theirs = plan_tree(tree, [hand])
        state = ours.report(derived_patch.id).state
        if state is PatchState.DRIFTED:
            drifted += 1
            continue
        assert state is theirs.report(fix).state, version
        if state is PatchState.NEEDED:
            written = {e.relpath: ast.dump(ast.parse(e.new)) for e in ours.edits}
            expected = {e.relpath: ast.dump(ast.parse(e.new)) for e in theirs.edits}
            assert written == expected, version
            compared += 1
    assert compared >= 4
    assert drifted == refused


def test_exactly_one_base_and_an_existing_diff(tmp_path: Path, base: Path) -> None:
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, BEFORE, AFTER))
    out = tmp_path / "out"
    common = ["derive", "--diff", str(diff), "--id", "local#F1", "--out", str(out)]
    for extra in ([], ["--base", "0.27.1", "--base-src", str(base)]):
        code, output = run(*common, *extra)
        assert (
            code == 2
            and "give exactly one of --base VERSION and --base-src PATH" in output
        )
    code, output = run(*derive_args(tmp_path / "missing.diff", base, out))
    assert code == 2 and "no such file" in output and "hint:" in output
    assert not out.exists()


def test_a_statement_of_an_empty_module_drifts_without_a_traceback() -> None:
    """vllm#46203 changes a statement of ``vllm/device_allocator/__init__.py``,
    which 0.13.0 to 0.22.1 ship empty: drifted, with the statement named
    (it was an IndexError on six releases of the held-out corpus)."""
    patch = derived(BEFORE, BEFORE.replace("LIMIT = 4", "LIMIT = 5"))
    for empty in ("", "# SPDX-License-Identifier: Apache-2.0\n"):
        assert states(patch, empty) == {
            "LIMIT": (PatchState.DRIFTED, "`LIMIT = 4` not found in the module")
        }


TRY_BEFORE = """import logging

logger = logging.getLogger(__name__)


def convert(items):
    try:
        out = [str(i) for i in items]
        return out
    except Exception as e:
        logger.exception("failed")
        raise RuntimeError(str(e)) from e
"""
#: The fix changes a statement of the ``try``'s body only.
TRY_AFTER = TRY_BEFORE.replace(
    "out = [str(i) for i in items]", "out = [str(i) for i in items if i]"
)


@pytest.mark.parametrize(
    ("target", "state"),
    [
        # Another fix rewrote the except body (vllm#45287 on 0.20.2).
        pytest.param(
            TRY_BEFORE.replace(
                "raise RuntimeError(str(e))", "raise RuntimeError(f(e))"
            ),
            PatchState.NEEDED,
            id="except-body-rewritten",
        ),
        # Another exception caught: not the same try.
        pytest.param(
            TRY_BEFORE.replace("except Exception as e:", "except ValueError as e:"),
            PatchState.DRIFTED,
            id="another-except-clause",
        ),
        # A finally added: not the same try either.
        pytest.param(
            TRY_BEFORE.replace(
                "        raise RuntimeError(str(e)) from e\n",
                "        raise RuntimeError(f(e)) from e\n    finally:\n        pass\n",
            ),
            PatchState.DRIFTED,
            id="a-finally-added",
        ),
    ],
)
def test_a_try_is_found_by_its_clauses_where_an_except_body_differs(
    target: str, state: PatchState
) -> None:
    """A step into a ``try``'s body finds the ``try`` by its whole text
    first; where an ``except`` body is not the fix's, by its clauses (the
    types and names it catches, its ``else`` and ``finally``): the fix's
    statements in the body are still found by their own shapes."""
    patch = derived(TRY_BEFORE, TRY_AFTER)
    (found,) = states(patch, target).values()
    assert found[0] is state, found
    if state is PatchState.NEEDED:
        written = rewrite_text(patch, target, PATH)
        assert written == target.replace(
            "out = [str(i) for i in items]", "out = [str(i) for i in items if i]"
        )
    else:
        assert "`try:" in found[1] and "not found" in found[1]

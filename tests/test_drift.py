"""The drift corpus: real releases, drifted the way vendor trees drift.

For every patch of the series and every release where targets.toml expects it
``needed``, the patch's target files are drifted in each of the kinds
``tests/support/drift.py`` lists (reformatted at two line lengths, commented,
a local renamed, a vendor's unrelated change), and the patch must still do the
right thing. The verdict of each case is one of:

``applied``  the patch is still ``needed`` on the drifted file, and the file it
             writes is the fix: its module AST equals the pristine patched
             file's after the same drift (``vendor``: after removing the
             vendor's additions). For ``rename`` the target functions must be
             alpha-equivalent (equal after renaming their locals canonically)
             to the pristine patched ones: renaming a local is meaningless,
             so the fix must be the same up to names. Where the fix binds a
             name the vendor renamed away (the fix's ``n`` next to the
             vendor's ``n_vendor``), the fix's name is fresh in the drifted
             function; it must then be the same code once that fresh name is
             merged with the renamed one.
``drifted``  the patch refuses, at a ``file:line`` inside the drifted target
             function, with a reason saying what was expected.
``wrong``    anything else: a rewrite that is not the fix, or a state other
             than needed/drifted. There must be none.

Formatting, comments and unrelated changes leave the code's AST unchanged, so
the patch must apply there (``drifted`` is accepted only for ``rename``).

The corpus itself (the drifts, the drifted copies, the series' plan of each)
is built once per test run in ``tests/support/drift.py`` and shared with
``tests/test_derived_vs_series.py``, which judges the derived patches on the
same inputs. Run ``python -m tests.test_drift`` for the table of verdicts per
patch, release and drift kind.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.syntax import iter_functions
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES, patch_by_id

from tests.support import TARGETS, link_copy, snapshot
from tests.support.drift import (
    COMMENT,
    KINDS,
    MUST_APPLY,
    DriftCorpus,
    DriftInput,
    DriftSet,
    add_comments,
    add_vendor_change,
    canonical,
    local_names,
    needed_cells,
    rename_local,
    ruff_format,
    selection,
    without_vendor_change,
)
from tests.support.facts import asserted
from tests.support.plans import ReleasePlans
from tests.support.same_ast import Source, same_code, same_node, same_statements

CELLS = [
    pytest.param(patch_id, release, kind, id=f"{patch_id}-{release}-{kind}")
    for patch_id, release in needed_cells()
    for kind in KINDS
]


# -- one cell ---------------------------------------------------------------------


@dataclass
class Case:
    """One drifted file set and what the tool did with it."""

    name: str
    verdict: str  # applied, drifted, wrong
    detail: str = ""


def run_cell(
    drift_set: DriftSet, kind: str, corpus: DriftCorpus, work: Path
) -> list[Case]:
    """Every input of one kind: the series' plan of it (made once a run, by
    the corpus), applied to a copy, and judged."""
    cases = [
        judge(drift, corpus.hand_plan(drift), work) for drift in drift_set.of_kind(kind)
    ]
    if kind == "rename":
        assert cases, (
            f"{drift_set.patch_id} on {drift_set.release}: no local variable to rename"
        )
    return cases


def judge(drift: DriftInput, plan: Plan, work: Path) -> Case:
    """The verdict on one drifted input, from the series' ``plan`` of it:
    a refusal is judged where it points; a rewrite is written into a copy of
    the input, planned again, and compared with the reference."""
    patch = patch_by_id(drift.patch_id)
    name = drift.case if drift.rename is None else f"rename {drift.case}"
    report = plan.report(patch.id)

    if report.state is PatchState.DRIFTED:
        return judge_drifted(plan, patch, name, drift.files)
    if report.state is not PatchState.NEEDED:
        return Case(name, "wrong", f"{report.state} after drift: {report.reason}")

    root = link_copy(drift.root, work / f"case{len(list(work.iterdir()))}")
    write_edits(root, plan.edits)
    if plan_tree(VllmTree.open(root), SERIES, selection(patch)).edits:
        return Case(name, "wrong", "a second apply would write again")
    for rel in drift.files:
        got = Source((root / rel).read_text())
        want = Source(drift.reference[rel])
        if drift.kind == "vendor":
            without_vendor_change(got.module)
            without_vendor_change(want.module)
        if drift.rename is None:
            if not same_statements(got, got.module.body, want, want.module.body):
                return Case(name, "wrong", f"{rel}: the patched AST differs")
            continue
        verdict = judge_rename(got, want, rel, drift.rename)
        if verdict:
            return Case(name, "wrong", verdict)
    return Case(name, "applied")


def judge_rename(
    got: Source, want: Source, rel: str, rename: tuple[str, str, str, str]
) -> str:
    """Empty if ``got`` is the fix up to the vendor's rename, else why not."""
    renamed_rel, qualname, old, new = rename
    got_functions = dict(iter_functions(got.module))
    want_functions = dict(iter_functions(want.module))
    if set(got_functions) != set(want_functions):
        return f"{rel}: the functions differ"
    for function_name, want_function in want_functions.items():
        got_function = got_functions[function_name]
        if same_node(got, got_function, want, want_function):
            continue
        # Renaming a local changes nothing, in whatever function the fix put
        # the vendor's code (a new helper may take over the renamed local).
        if canonical(got_function) == canonical(want_function):
            continue
        # The fix binds `old` afresh where the vendor's code uses `new`.
        if (
            rel == renamed_rel
            and function_name == qualname
            and old in local_names(got_function)
            and canonical(got_function, {old: new})
            == canonical(want_function, {old: new})
        ):
            continue
        return f"{rel}: {function_name} is not the fix up to renaming {old}"
    # Everything outside functions must be untouched.
    for tree in (got.module, want.module):
        for _, function in iter_functions(tree):
            function.body = [ast.Pass()]
    if ast.dump(got.module) != ast.dump(want.module):
        return f"{rel}: code outside the functions differs"
    return ""


def judge_drifted(plan: Plan, patch: Patch, name: str, drifted: dict[str, str]) -> Case:
    """A refusal must say where (inside the drifted function) and why."""
    report = plan.report(patch.id)
    problems = []
    where = []
    for loc in report.locations:
        if loc.state is not PatchState.DRIFTED:
            continue
        text = drifted.get(loc.path)
        if text is None:
            problems.append(f"{loc.path}: drifted, but the drift did not touch it")
            continue
        functions = dict(iter_functions(ast.parse(text)))
        function = functions.get(loc.finding.symbol)
        holds = any(
            f.lineno <= loc.finding.line <= f.end_lineno for f in functions.values()
        )
        if function is not None:
            holds = function.lineno <= loc.finding.line <= function.end_lineno
        if not holds or not loc.finding.reason:
            problems.append(
                f"{loc.path}:{loc.finding.line} {loc.finding.symbol}: "
                f"location or reason missing ({loc.finding.reason!r})"
            )
        where.append(f"{loc.path}:{loc.finding.line}: {loc.finding.reason}")
    if not where:
        problems.append(f"drifted without a location: {report.reason}")
    if problems:
        return Case(name, "wrong", "; ".join(problems))
    return Case(name, "drifted", "; ".join(where))


# -- the tests --------------------------------------------------------------------


def test_corpus_covers_every_needed_patch() -> None:
    covered = {patch_id for patch_id, _ in needed_cells()}
    for patch in SERIES:
        expected = TARGETS.patches.get(patch.id)
        if expected and PatchState.NEEDED in expected.expected.values():
            assert patch.id in covered


def test_drifts_are_real() -> None:
    """The corpus's own drift functions do what they say (else it tests nothing)."""
    code = (
        "import os\n\n"
        "def f(a):\n"
        "    total = a\n\n"
        "    items = [\n"
        "        total,\n"
        "        f'{total}',\n"
        "    ]\n"
        '    text = """keep\n\n'
        '    this"""\n'
        "    return items, text\n"
    )
    function = ast.parse(code).body[1]
    commented = add_comments(code, [function])
    assert commented.count(COMMENT) == 6  # 4 statements + 2 bracket lines
    assert "\n\n    items" not in commented and '"""keep\n\n' in commented
    assert ast.dump(ast.parse(commented)) == ast.dump(ast.parse(code))
    renamed = rename_local(code, "f", "total", "total_vendor")
    assert renamed is not None and "total" not in renamed.replace("total_vendor", "")
    assert local_names(function) == ["total", "items", "text"]
    assert canonical(ast.parse(renamed).body[1]) == canonical(function)
    vendor = add_vendor_change(code)
    assert vendor.index("_vendor_telemetry") > vendor.index("import os")
    assert ruff_format(code, "--line-length", "60") != code


def test_rename_verdict_tells_renames_from_wrong_code() -> None:
    """judge_rename accepts only the fix up to names (else it proves nothing)."""
    fixed = (
        "class M:\n"
        "    def f(self, x):\n"
        "        n = x.size(0)\n"
        "        out = [b[:n] for b in self.bufs]\n"
        "        n = self.count\n"
        "        return out, n\n"
    )
    rename = ("m.py", "M.f", "n", "n_vendor")

    def verdict(got: str) -> str:
        return judge_rename(Source(got), Source(fixed), "m.py", rename)

    assert verdict(fixed.replace("out", "result")) == ""
    # The fix's own `n` is fresh next to the vendor's renamed one: accepted.
    vendor = fixed.replace("n = self", "n_vendor = self").replace(
        "out, n\n", "out, n_vendor\n"
    )
    assert verdict(vendor) == ""
    assert verdict(fixed.replace("b[:n]", "b[:x]")) != ""
    assert verdict(fixed.replace("out, n\n", "out, x\n")) != ""
    assert verdict(fixed.replace("return out, n", "return n, out")) != ""


def test_same_code_is_ast_dump_equality() -> None:
    """The corpus's cheap comparison (tests/support/same_ast.py) answers as
    ``ast.dump`` does, on pairs built to catch a comparison by text: other
    formatting, a decorator, two statements on a line, a class whose header
    or one method differs, characters beyond ASCII."""
    base = (
        "import os\n\n"
        "@dec(1)\n"
        "class A(Base):\n"
        '    """Doc."""\n'
        "    x = 'é'; y = 2\n\n"
        "    @property\n"
        "    def f(self):\n"
        "        return [\n            1,\n        ]\n\n"
        "    def g(self): return 1\n\n"
        "def h(a, b):\n"
        "    if a:\n"
        "        return b\n"
        "    return a\n"
    )
    variants = [
        base,
        base.replace("return [\n            1,\n        ]", "return [1]"),
        base.replace("# ", "#") + "# a comment\n",
        base.replace("'é'", '"é"'),
        base.replace("y = 2", "y = 3"),
        base.replace("@dec(1)", "@dec(2)"),
        base.replace("@property\n    ", ""),
        base.replace("class A(Base)", "class A(Other)"),
        base.replace("return 1\n", "return 2\n"),
        base.replace("        return b\n", "        return a\n"),
        base.replace("'é'", "'e'"),
        base.replace("def h(a, b):\n", "def h(a, b):\n    pass\n"),
        base.replace("import os\n", "import os; import sys\n"),
    ]
    verdicts = []
    for other in variants:
        expected = ast.dump(ast.parse(base)) == ast.dump(ast.parse(other))
        assert same_code(base, other) is expected, other
        assert same_code(other, base) is expected, other
        verdicts.append(expected)
    assert verdicts.count(True) == 4 and verdicts.count(False) == len(variants) - 4


@pytest.mark.release
@pytest.mark.parametrize(("patch_id", "release", "kind"), CELLS)
def test_drift(
    patch_id: str,
    release: str,
    kind: str,
    drift_corpus: DriftCorpus,
    tmp_path: Path,
) -> None:
    """One patch on one release, drifted one way: no wrong rewrite, a
    refusal only where the code changed, and a rewrite that is the fix and
    that a second apply leaves alone. The fact per patch, release and kind
    (and per renamed local) is this test's alone; the inputs and the series'
    plan of each are shared with test_derived_vs_series."""
    cases = run_cell(drift_corpus(patch_id, release), kind, drift_corpus, tmp_path)
    wrong = [f"{c.name}: {c.detail}" for c in cases if c.verdict == "wrong"]
    assert not wrong, "wrong rewrites:\n" + "\n".join(wrong)
    if kind in MUST_APPLY:
        refused = [f"{c.name}: {c.detail}" for c in cases if c.verdict != "applied"]
        assert not refused, "refused code-preserving drift:\n" + "\n".join(refused)
    for case in cases:
        asserted(f"drift {case.name}: {case.verdict}", release, patch_id)


RELEASES_WITH_REWRITES = sorted({release for _, release in needed_cells()})


@pytest.mark.release
@pytest.mark.parametrize("release", RELEASES_WITH_REWRITES)
def test_skeleton_rewrite_equals_whole_module(
    release: str, release_tree: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's fast path (patches rewrite a skeleton of the file) writes
    exactly what rewriting the whole module writes, on every release."""
    from deepstack_patch.engine import plan as plan_module

    tree = VllmTree.open(release_tree(release))
    used = []
    real = plan_module._rewrite_skeleton

    def spy(*args: object) -> object:
        used.append(result := real(*args))  # type: ignore[arg-type]
        return result

    monkeypatch.setattr(plan_module, "_rewrite_skeleton", spy)
    fast = plan_tree(tree, SERIES)
    monkeypatch.setenv(plan_module.FULL_REWRITE_ENV, "1")
    whole = plan_tree(tree, SERIES)
    assert [(e.relpath, e.new) for e in fast.edits] == [
        (e.relpath, e.new) for e in whole.edits
    ]
    assert [r.state for r in fast.reports] == [r.state for r in whole.reports]
    assert any(result is not None for result in used), "the fast path never ran"
    asserted("the skeleton rewrite equals the whole module's", release, "series")


# -- hand edits around a recognised target ----------------------------------------
#
# A vendor edits the code right around what a patch recognises (wraps the
# target in a call, moves it into another statement). A patch may rewrite
# only in a context it knows: each edit below must read `drifted` at the
# edited code, saying what it found, with `apply` refusing and writing
# nothing; a vendor's own form of the fix reads `applied` and is left alone.

MODELS = "vllm/model_executor/models"
GRANITE_VALUE = '                    f"ds_{llm_layer}": self._ds_buffers[lvl]\n'
BOUNDS_CHECK = """\
        if num_tokens > self.deepstack_input_embeds_num_tokens:
            raise ValueError(
                "Requested more deepstack tokens than available in buffer: "
                f"{num_tokens=} > {self.deepstack_input_embeds_num_tokens=}"
            )
"""


@dataclass(frozen=True)
class HandEdit:
    """``old`` replaced by ``new`` (each once) in one file of a release."""

    name: str
    patch_id: str
    release: str
    relpath: str
    old: str
    new: str
    state: PatchState
    #: What the drifted reason must quote of the edited code.
    found: str = ""


HAND_EDITS = [
    HandEdit(
        "granite narrowed to the rows",
        "vllm#40917",
        "0.20.2",
        f"{MODELS}/granite4_vision.py",
        GRANITE_VALUE,
        GRANITE_VALUE.replace(
            "[lvl]\n", "[lvl].narrow(0, 0, inputs_embeds.shape[0])\n"
        ),
        PatchState.APPLIED,
    ),
    HandEdit(
        "granite buffer cloned",
        "vllm#40917",
        "0.20.2",
        f"{MODELS}/granite4_vision.py",
        GRANITE_VALUE,
        GRANITE_VALUE.replace("[lvl]\n", "[lvl].clone()\n"),
        PatchState.DRIFTED,
        "found `self._ds_buffers[lvl].clone()`",
    ),
    HandEdit(
        "granite buffer times zero",
        "vllm#40917",
        "0.20.2",
        f"{MODELS}/granite4_vision.py",
        GRANITE_VALUE,
        GRANITE_VALUE.replace("[lvl]\n", "[lvl] * 0\n"),
        PatchState.DRIFTED,
        "found `self._ds_buffers[lvl] * 0`",
    ),
    HandEdit(
        "bounds check inside a try",
        "vllm#40932",
        "0.20.0",
        f"{MODELS}/qwen3_vl.py",
        BOUNDS_CHECK,
        "        try:\n"
        + "".join(f"    {line}" for line in BOUNDS_CHECK.splitlines(keepends=True))
        + "        except ValueError:\n            return None\n",
        PatchState.DRIFTED,
        "sits in a `try` statement",
    ),
    HandEdit(
        "rank count under a condition",
        "vllm#38933",
        "0.19.1",
        "vllm/v1/sample/sampler.py",
        "token_ranks = batched_count_greater_than(logprobs, token_logprobs)\n",
        "token_ranks = batched_count_greater_than(logprobs, token_logprobs) "
        "if logprobs.numel() else None\n",
        PatchState.DRIFTED,
        "batched_count_greater_than is called inside `token_ranks = ",
    ),
    HandEdit(
        "modalities changed after the pruning branch",
        "vllm#38040",
        "0.20.2",
        f"{MODELS}/qwen3_vl.py",
        '            modalities.append("video")\n\n',
        '            modalities.append("video")\n'
        '        modalities.append("audio")\n\n',
        PatchState.DRIFTED,
        "`modalities` is used as modalities.append",
    ),
    HandEdit(
        "reallocation reads the setter's parameter",
        "vllm#43617",
        "0.20.2",
        f"{MODELS}/qwen3_vl.py",
        "                    self.config.text_config.hidden_size,\n",
        "                    deepstack_input_embeds.size(2),\n",
        PatchState.DRIFTED,
        "reads deepstack_input_embeds, bound in _set_deepstack_input_embeds",
    ),
    HandEdit(
        "tower built with an attribute the fix moves",
        "vllm#49397",
        "0.20.2",
        f"{MODELS}/qwen3_vl.py",
        '                prefix=maybe_prefix(prefix, "visual"),\n',
        "                out_dim=self.visual_dim,\n"
        '                prefix=maybe_prefix(prefix, "visual"),\n',
        PatchState.DRIFTED,
        "reads self.visual_dim",
    ),
]


def hand_edit(root: Path, edit: HandEdit) -> int:
    """Make the edit in a hard-link copy; returns the first edited line."""
    path = root / edit.relpath
    text = path.read_text()
    assert text.count(edit.old) == 1, f"{edit.relpath}: the edit's anchor moved"
    path.unlink()  # a hard link to the cached release: never write through it
    path.write_text(text.replace(edit.old, edit.new))
    return text[: text.index(edit.old)].count("\n") + 1


def test_every_patch_has_a_hand_edit() -> None:
    assert {edit.patch_id for edit in HAND_EDITS} == {patch.id for patch in SERIES}
    for edit in HAND_EDITS:
        expected = TARGETS.patches[edit.patch_id].expected[edit.release]
        assert expected is PatchState.NEEDED, f"{edit.name}: not needed there"


@pytest.mark.release
@pytest.mark.parametrize("edit", HAND_EDITS, ids=[e.name for e in HAND_EDITS])
def test_hand_edit_around_the_target(
    edit: HandEdit, patched_copy: Callable[[str], Path]
) -> None:
    """A vendor's edit right around what the patch recognises: ``drifted``
    at the edited line, saying what it found, and ``apply`` refusing and
    writing nothing; a vendor's own form of the fix ``applied`` and left
    alone. One fact per edit, this test's alone (the drift corpus changes
    no code, or only a name)."""
    root = patched_copy(edit.release)
    line = hand_edit(root, edit)
    report = plan_tree(VllmTree.open(root), SERIES).report(edit.patch_id)
    at_edit = [loc for loc in report.locations if loc.path == edit.relpath]
    assert report.state is edit.state, report.reason
    assert at_edit, f"no location of {edit.patch_id} in {edit.relpath}"

    before = snapshot(root)
    result = CliRunner().invoke(
        main, ["apply", "--vllm-src", str(root), "--only", edit.patch_id]
    )
    if edit.state is PatchState.APPLIED:
        assert result.exit_code == 0, result.output
        assert snapshot(root)[edit.relpath] == before[edit.relpath]
        asserted(f"hand edit: {edit.name}", edit.release, edit.patch_id)
        return
    assert result.exit_code == 2, result.output
    assert snapshot(root) == before, "a refused apply wrote something"
    drifted = [loc for loc in at_edit if loc.state is PatchState.DRIFTED]
    assert drifted, f"{edit.relpath} is not where it drifted"
    functions = dict(iter_functions(ast.parse((root / edit.relpath).read_text())))
    for loc in drifted:
        function = functions[loc.finding.symbol]
        assert function.lineno <= loc.finding.line <= function.end_lineno
        first, last = loc.finding.span  # the methods the patch reads
        assert first <= line <= last, f"the edit is outside {loc.finding.span}"
        assert edit.found in loc.finding.reason, loc.finding.reason
    if edit.patch_id == "vllm#40917":
        # What was found is named at its own line, not only its function's.
        assert [loc.finding.line for loc in drifted] == [line]
    asserted(f"hand edit: {edit.name}", edit.release, edit.patch_id)


# -- the table --------------------------------------------------------------------


def corpus_table(release_root: Callable[[str], Path], work: Path) -> Iterator[str]:
    """Rows ``patch release kind applied drifted wrong`` for every cell."""
    corpus = DriftCorpus(release_root, ReleasePlans(release_root), work / "corpus")
    for patch_id, release in needed_cells():
        for kind in KINDS:
            cell = work / f"{patch_id.replace('#', '')}-{release}-{kind}"
            cell.mkdir(parents=True)
            cases = run_cell(corpus(patch_id, release), kind, corpus, cell)
            counts = Counter(case.verdict for case in cases)
            yield (
                f"{patch_id:11} {release:7} {kind:10} {counts['applied']:7} "
                f"{counts['drifted']:7} {counts['wrong']:5}"
            )
            for case in cases:
                if case.verdict != "applied":
                    yield f"    {case.verdict}: {case.name}: {case.detail}"


if __name__ == "__main__":
    import tempfile

    from deepstack_patch.fetch.releases import fetch_release

    with tempfile.TemporaryDirectory() as scratch:

        def release_root(version: str) -> Path:
            out = Path(scratch) / "releases" / version
            return out if out.is_dir() else fetch_release(version, out).root

        print("patch       release kind       applied drifted wrong")
        for row in corpus_table(release_root, Path(scratch) / "work"):
            print(row, flush=True)

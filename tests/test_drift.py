"""The drift corpus: real releases, drifted the way vendor trees drift.

For every patch of the series and every release where targets.toml expects it
``needed``, the patch's target files are drifted in one of these ways:

``format-120``  reformatted by ruff at line length 120 with single quotes;
``format-60``   reformatted by ruff at line length 60 (many lines re-wrapped);
``comments``    a comment line before every statement and inside every bracket
                continuation of each target function, its blank lines removed;
``rename``      one local variable of a target function renamed, every use of
                it (one sub-case per local variable of each target function);
``vendor``      an unrelated vendor change elsewhere in the file: a helper
                after the imports (every line below shifts) and a constant at
                the end.

The verdict of each case is one of:

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

Run ``python tests/test_drift.py`` for the table of verdicts per patch,
release and drift kind.
"""

from __future__ import annotations

import ast
import difflib
import os
import subprocess
import sys
import tokenize
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
from deepstack_patch.engine.targets import load_targets
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES

from tests.support.facts import asserted

TARGETS = load_targets()
KINDS = ("format-120", "format-60", "comments", "rename", "vendor")
#: Kinds that change no code: the patch has no excuse to refuse them.
MUST_APPLY = {"format-120", "format-60", "comments", "vendor"}
COMMENT = "# vendor-drift: reviewed"
VENDOR_HELPER = '''

def _vendor_telemetry(event: str) -> None:
    """A vendor's own addition, unrelated to any fix."""
    return None
'''
VENDOR_TAIL = '\n_VENDOR_BUILD = "vendor-1"\n'


def needed_cells() -> list[tuple[str, str]]:
    """(patch id, release) for every patch targets.toml expects needed."""
    return [
        (patch.id, release)
        for patch in SERIES
        if patch.id in TARGETS.patches
        for release, state in TARGETS.patches[patch.id].expected.items()
        if state is PatchState.NEEDED
    ]


CELLS = [
    pytest.param(patch_id, release, kind, id=f"{patch_id}-{release}-{kind}")
    for patch_id, release in needed_cells()
    for kind in KINDS
]


# -- the drifts -------------------------------------------------------------------


def functions_at(
    text: str, names: set[str], lines: set[int]
) -> list[tuple[str, ast.AST]]:
    """Target functions: named by a finding, or holding a finding's line.

    Only the innermost function holding a line is taken, so a finding on a
    method does not make its whole class (or outer function) the target.
    """
    found = []
    functions = list(iter_functions(ast.parse(text)))
    for qualname, node in functions:
        inner = [
            line
            for line in lines
            if node.lineno <= line <= node.end_lineno
            and not any(
                other is not node
                and node.lineno <= other.lineno <= line <= other.end_lineno
                for _, other in functions
            )
        ]
        if qualname in names or inner:
            found.append((qualname, node))
    return found


def ruff_format(text: str, *options: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", *options, "--stdin-filename", "x.py"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def string_interior_lines(text: str) -> set[int]:
    """Lines inside a multi-line string token (never edit these)."""
    inside: set[int] = set()
    readline = iter(text.splitlines(keepends=True)).__next__
    for token in tokenize.generate_tokens(readline):
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            inside.update(range(token.start[0] + 1, token.end[0] + 1))
    return inside


def bracket_continuation_lines(text: str) -> set[int]:
    """Lines ending inside brackets (a comment line may follow them)."""
    readline = iter(text.splitlines(keepends=True)).__next__
    return {
        token.start[0]
        for token in tokenize.generate_tokens(readline)
        if token.type == tokenize.NL and token.line.strip()
    }


def add_comments(text: str, functions: list[ast.AST]) -> str:
    """A comment line before each statement and bracket line; no blank lines."""
    lines = text.splitlines(keepends=True)
    in_string = string_interior_lines(text)
    continued = bracket_continuation_lines(text)
    before: set[int] = set()
    after: set[int] = set()
    drop: set[int] = set()
    for function in functions:
        body = range(function.body[0].lineno, function.end_lineno + 1)
        for node in ast.walk(function):
            if (
                isinstance(node, ast.stmt)
                and node is not function
                and node.lineno in body
                and node.lineno not in in_string
            ):
                before.add(node.lineno)
        after.update(n for n in continued if n in body and n + 1 in body)
        drop.update(n for n in body if not lines[n - 1].strip() and n not in in_string)
    out = []
    for number, line in enumerate(lines, start=1):
        if number in drop:
            continue
        indent = line[: len(line) - len(line.lstrip())]
        if number in before:
            out.append(f"{indent}{COMMENT}\n")
        out.append(line)
        if number in after and number not in before:
            following = lines[number]
            out.append(following[: len(following) - len(following.lstrip())])
            out[-1] += f"{COMMENT}\n"
    return "".join(out)


def add_vendor_change(text: str) -> str:
    """A helper after the last top-level import and a constant at the end."""
    module = ast.parse(text)
    imports = [n for n in module.body if isinstance(n, ast.Import | ast.ImportFrom)]
    at = imports[-1].end_lineno if imports else 0
    lines = text.splitlines(keepends=True)
    return "".join(lines[:at]) + VENDOR_HELPER + "".join(lines[at:]) + VENDOR_TAIL


def without_vendor_change(module: ast.Module) -> ast.Module:
    def vendor(node: ast.stmt) -> bool:
        return (
            isinstance(node, ast.FunctionDef) and node.name == "_vendor_telemetry"
        ) or (
            isinstance(node, ast.Assign)
            and any(
                isinstance(t, ast.Name) and t.id == "_VENDOR_BUILD"
                for t in node.targets
            )
        )

    assert sum(map(vendor, module.body)) == 2, "the vendor change is gone"
    module.body = [node for node in module.body if not vendor(node)]
    return module


def local_names(function: ast.AST) -> list[str]:
    """Names the function binds itself: its locals, parameters excluded.

    Names used by a nested function or class, or declared global/nonlocal,
    are left out: renaming those is not a local change.
    """
    args = function.args
    params = {
        a.arg
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
        + [a for a in (args.vararg, args.kwarg) if a]
    }
    excluded = set(params)
    for node in ast.walk(function):
        if isinstance(node, ast.Global | ast.Nonlocal):
            excluded.update(node.names)
        if node is not function and isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
        ):
            excluded.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    stored = []
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Store)
            and node.id not in excluded
            and node.id not in stored
        ):
            stored.append(node.id)
    return stored


class Rename(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.Name:  # noqa: N802 - ast's name
        node.id = self.mapping.get(node.id, node.id)
        return node


def rename_local(text: str, qualname: str, old: str, new: str) -> str | None:
    """Rename ``old`` to ``new`` in one function, every use, by position.

    Returns None if the text edit cannot be proven to be exactly that rename
    (the parse of the result must equal the original AST with the names
    changed), so a faulty corpus case is never used.
    """
    module = ast.parse(text)
    function = dict(iter_functions(module))[qualname]
    uses = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == old]
    lines = [line.encode() for line in text.splitlines(keepends=True)]
    for use in sorted(uses, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        line = lines[use.lineno - 1]
        if line[use.col_offset : use.end_col_offset] != old.encode():
            return None
        lines[use.lineno - 1] = (
            line[: use.col_offset] + new.encode() + line[use.end_col_offset :]
        )
    renamed = b"".join(lines).decode()
    Rename({old: new}).visit(function)
    try:
        if ast.dump(ast.parse(renamed)) != ast.dump(module):
            return None
    except SyntaxError:
        return None
    return renamed


#: Locals renamed per target function (one case each): enough to cover the
#: names the fix reads or writes, without a case for every loop index.
RENAMES_PER_FUNCTION = 4


def renamed_locals(function: ast.AST, before: str, after: str) -> list[str]:
    """The locals to rename, those on lines the fix changes first."""
    changed: set[int] = set()
    matcher = difflib.SequenceMatcher(
        a=before.splitlines(), b=after.splitlines(), autojunk=False
    )
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag != "equal":
            changed.update(range(i1, max(i2, i1 + 1) + 2))  # and the next line
    near_fix = {
        node.id
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and node.lineno in changed
    }
    names = local_names(function)
    ranked = sorted(names, key=lambda name: (name not in near_fix, names.index(name)))
    return ranked[:RENAMES_PER_FUNCTION]


def canonical(function: ast.AST, merge: dict[str, str] | None = None) -> str:
    """The function with its locals renamed by order of first appearance."""
    function = ast.parse(ast.unparse(function)).body[0]  # a private copy
    if merge:
        Rename(merge).visit(function)
    names = {name: f"_local{i}" for i, name in enumerate(local_names(function))}
    Rename(names).visit(function)
    return ast.dump(function)


# -- one cell ---------------------------------------------------------------------


@dataclass
class Case:
    """One drifted file set and what the tool did with it."""

    name: str
    verdict: str  # applied, drifted, wrong
    detail: str = ""


def light_copy(source: Path, destination: Path, relpaths: list[str]) -> Path:
    """A tree of just the drifted files plus what opens it: fast to make.

    The other files a patch globs only add findings on code the drift did
    not touch, which the pristine plan already covered.
    """
    for relpath in ["vllm/__init__.py", "PKG-INFO", "vllm/_version.py", *relpaths]:
        if (source / relpath).is_file():
            (destination / relpath).parent.mkdir(parents=True, exist_ok=True)
            os.link(source / relpath, destination / relpath)
    return destination


def selection(patch: Patch) -> set[str]:
    return {patch.id, *patch.requires}


def run_cell(
    patch_id: str, release: str, kind: str, pristine: Path, work: Path
) -> list[Case]:
    patch = next(p for p in SERIES if p.id == patch_id)
    selected = selection(patch)
    plan = plan_tree(VllmTree.open(pristine), SERIES, selected)
    report = plan.report(patch_id)
    assert report.state is PatchState.NEEDED, f"{patch_id} not needed on {release}"
    targets: dict[str, tuple[set[str], set[int]]] = {}
    for loc in report.locations:
        if loc.state is PatchState.NEEDED:
            names, lines = targets.setdefault(loc.path, (set(), set()))
            names.update({loc.finding.symbol, *loc.finding.rewrites})
            lines.add(loc.finding.line)
    patched = {e.relpath: e.new.decode() for e in plan.edits}
    original = {rel: (pristine / rel).read_text() for rel in targets}

    if kind != "rename":
        drift = drift_function(kind, targets)
        drifted = {rel: drift(rel, text) for rel, text in original.items()}
        reference = {rel: drift(rel, patched[rel]) for rel in targets}
        return [judge(patch, kind, drifted, reference, kind, selected, pristine, work)]

    cases = []
    for rel, (names, lines) in targets.items():
        for qualname, function in functions_at(original[rel], names, lines):
            for old in renamed_locals(function, original[rel], patched[rel]):
                new = f"{old}_vendor"
                renamed = rename_local(original[rel], qualname, old, new)
                if renamed is None or new in original[rel]:
                    continue
                drifted = {**original, rel: renamed}
                name = f"rename {qualname}:{old}"
                cases.append(
                    judge(
                        patch,
                        name,
                        drifted,
                        patched,
                        kind,
                        selected,
                        pristine,
                        work,
                        rename=(rel, qualname, old, new),
                    )
                )
    assert cases, f"{patch_id} on {release}: no local variable to rename"
    return cases


def drift_function(
    kind: str, targets: dict[str, tuple[set[str], set[int]]]
) -> Callable[[str, str], str]:
    def drift(rel: str, text: str) -> str:
        if kind == "format-120":
            return ruff_format(
                text, "--line-length", "120", "--config", "format.quote-style='single'"
            )
        if kind == "format-60":
            return ruff_format(text, "--line-length", "60")
        if kind == "comments":
            names, lines = targets[rel]
            # The reference (the patched file) has moved lines: find the
            # functions by name there, and by line in the original.
            functions = [node for _, node in functions_at(text, names, lines)]
            return add_comments(text, functions)
        if kind == "vendor":
            return add_vendor_change(text)
        raise AssertionError(kind)

    return drift


def judge(
    patch: Patch,
    name: str,
    drifted: dict[str, str],
    reference: dict[str, str],
    kind: str,
    selected: set[str],
    pristine: Path,
    work: Path,
    rename: tuple[str, str, str, str] | None = None,
) -> Case:
    """Plan the drifted files in a fresh tree, apply, and give the verdict."""
    root = work / f"case{len(list(work.iterdir()))}"
    light_copy(pristine, root, list(drifted))
    for rel, text in drifted.items():
        (root / rel).unlink()
        (root / rel).write_text(text)
    plan = plan_tree(VllmTree.open(root), SERIES, selected)
    report = plan.report(patch.id)

    if report.state is PatchState.DRIFTED:
        return judge_drifted(plan, patch, name, drifted)
    if report.state is not PatchState.NEEDED:
        return Case(name, "wrong", f"{report.state} after drift: {report.reason}")

    write_edits(root, plan.edits)
    if plan_tree(VllmTree.open(root), SERIES, selected).edits:
        return Case(name, "wrong", "a second apply would write again")
    for rel in drifted:
        got = ast.parse((root / rel).read_text())
        want = ast.parse(reference[rel])
        if kind == "vendor":
            got, want = without_vendor_change(got), without_vendor_change(want)
        if rename is None:
            if ast.dump(got) != ast.dump(want):
                return Case(name, "wrong", f"{rel}: the patched AST differs")
            continue
        verdict = judge_rename(got, want, rel, rename)
        if verdict:
            return Case(name, "wrong", verdict)
    return Case(name, "applied")


def judge_rename(
    got: ast.Module, want: ast.Module, rel: str, rename: tuple[str, str, str, str]
) -> str:
    """Empty if ``got`` is the fix up to the vendor's rename, else why not."""
    renamed_rel, qualname, old, new = rename
    got_functions = dict(iter_functions(got))
    want_functions = dict(iter_functions(want))
    if set(got_functions) != set(want_functions):
        return f"{rel}: the functions differ"
    for function_name, want_function in want_functions.items():
        got_function = got_functions[function_name]
        if ast.dump(got_function) == ast.dump(want_function):
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
    for tree in (got, want):
        for _, function in iter_functions(tree):
            function.body = [ast.Pass()]
    if ast.dump(got) != ast.dump(want):
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
        return judge_rename(ast.parse(got), ast.parse(fixed), "m.py", rename)

    assert verdict(fixed.replace("out", "result")) == ""
    # The fix's own `n` is fresh next to the vendor's renamed one: accepted.
    vendor = fixed.replace("n = self", "n_vendor = self").replace(
        "out, n\n", "out, n_vendor\n"
    )
    assert verdict(vendor) == ""
    assert verdict(fixed.replace("b[:n]", "b[:x]")) != ""
    assert verdict(fixed.replace("out, n\n", "out, x\n")) != ""
    assert verdict(fixed.replace("return out, n", "return n, out")) != ""


@pytest.mark.release
@pytest.mark.parametrize(("patch_id", "release", "kind"), CELLS)
def test_drift(
    patch_id: str,
    release: str,
    kind: str,
    release_tree: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    cases = run_cell(patch_id, release, kind, release_tree(release), tmp_path)
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
    # Imported here: `python tests/test_drift.py` (the table) runs without
    # the repository root on sys.path.
    from tests.support import snapshot

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
    for patch_id, release in needed_cells():
        for kind in KINDS:
            cell = work / f"{patch_id.replace('#', '')}-{release}-{kind}"
            cell.mkdir(parents=True)
            cases = run_cell(patch_id, release, kind, release_root(release), cell)
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

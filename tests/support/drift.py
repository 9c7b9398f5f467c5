"""The drift corpus: real releases, drifted the way vendor trees drift.

Built once per test run and shared by every file that judges a patch on
drifted code (``tests/test_drift.py`` the hand-written patches,
``tests/test_derived_vs_series.py`` the derived ones next to them): for each
patch and release where targets.toml expects it ``needed``, the pristine plan
(made once, by :class:`tests.support.plans.ReleasePlans`), the drifted copies
of the patch's target files, each in a light tree of its own, and the
hand-written series' plan of each copy, made on first use (issue 35).

The kinds of drift:

``format-120``  reformatted by ruff at line length 120 with single quotes;
``format-60``   reformatted by ruff at line length 60 (many lines re-wrapped);
``comments``    a comment line before every statement and inside every bracket
                continuation of each target function, its blank lines removed;
``rename``      one local variable of a target function renamed, every use of
                it (one sub-case per local variable of each target function);
``vendor``      an unrelated vendor change elsewhere in the file: a helper
                after the imports (every line below shifts) and a constant at
                the end.

What a patch must do with each is ``tests/test_drift.py``'s docstring.
"""

from __future__ import annotations

import ast
import difflib
import os
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.syntax import iter_functions
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES, patch_by_id

from tests.support import TARGETS
from tests.support.plans import ReleasePlans

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


# -- the corpus, built once ------------------------------------------------------

#: Where a patch rewrites in one file: the symbols its findings name, and
#: their lines.
Targets = dict[str, tuple[set[str], set[int]]]
#: For a rename: (the file, the function, the old name, the new name).
Renaming = tuple[str, str, str, str]


@dataclass(frozen=True)
class DriftInput:
    """One drifted copy of a release's target files, for one patch."""

    patch_id: str
    release: str
    kind: str
    #: The kind, or for a rename ``Class.method:local``.
    case: str
    #: Every target file, drifted (a rename drifts one, the others as released).
    files: dict[str, str]
    #: The pristine patched files after the same drift (a rename: as patched).
    reference: dict[str, str]
    #: A light tree holding ``files``: read it, never write into it.
    root: Path
    rename: Renaming | None = None


@dataclass(frozen=True)
class DriftSet:
    """One patch on one release: every drifted input."""

    patch_id: str
    release: str
    inputs: tuple[DriftInput, ...]

    def of_kind(self, kind: str) -> list[DriftInput]:
        return [drift for drift in self.inputs if drift.kind == kind]


@dataclass
class DriftCorpus:
    """``corpus(patch_id, release)``: the patch's drift set on the release,
    built on first use; ``corpus.hand_plan(drift)``: the series' plan of one
    drifted input (the patch and what it requires), made once."""

    release_root: Callable[[str], Path]
    plans: ReleasePlans
    work: Path
    _sets: dict[tuple[str, str], DriftSet] = field(default_factory=dict)
    _hand_plans: dict[Path, Plan] = field(default_factory=dict)

    def __call__(self, patch_id: str, release: str) -> DriftSet:
        key = (patch_id, release)
        if key not in self._sets:
            self._sets[key] = self._build(patch_id, release)
        return self._sets[key]

    def hand_plan(self, drift: DriftInput) -> Plan:
        """The series' plan of one drifted input: its patch and what that
        requires selected (what ``test_drift`` judges, and the hand-written
        side of ``test_derived_vs_series``)."""
        if drift.root not in self._hand_plans:
            selected = selection(patch_by_id(drift.patch_id))
            tree = VllmTree.open(drift.root)
            self._hand_plans[drift.root] = plan_tree(tree, SERIES, selected)
        return self._hand_plans[drift.root]

    def _build(self, patch_id: str, release: str) -> DriftSet:
        pristine = self.release_root(release)
        plan = self.plans(release, selection(patch_by_id(patch_id)))
        report = plan.report(patch_id)
        assert report.state is PatchState.NEEDED, f"{patch_id} not needed on {release}"
        targets: Targets = {}
        for loc in report.locations:
            if loc.state is PatchState.NEEDED:
                names, lines = targets.setdefault(loc.path, (set(), set()))
                names.update({loc.finding.symbol, *loc.finding.rewrites})
                lines.add(loc.finding.line)
        patched = {e.relpath: e.new.decode() for e in plan.edits}
        original = {rel: (pristine / rel).read_text() for rel in targets}
        folder = self.work / f"{patch_id.replace('#', '')}-{release}"
        inputs = []
        for number, (kind, case, files, reference, rename) in enumerate(
            drifts(targets, original, patched)
        ):
            root = light_copy(pristine, folder / f"case{number}", list(files))
            for rel, text in files.items():
                (root / rel).unlink()  # a hard link to the release: replace it
                (root / rel).write_text(text)
            drift = DriftInput(
                patch_id, release, kind, case, files, reference, root, rename
            )
            inputs.append(drift)
        return DriftSet(patch_id, release, tuple(inputs))


def drifts(
    targets: Targets, original: dict[str, str], patched: dict[str, str]
) -> Iterator[tuple[str, str, dict[str, str], dict[str, str], Renaming | None]]:
    """``(kind, case, drifted files, reference, renaming)`` for every kind:
    one input per kind, and a rename per local of each target function (up
    to :data:`RENAMES_PER_FUNCTION`) whose rename is provably only that."""
    for kind in KINDS:
        if kind != "rename":
            drift = drift_function(kind, targets)
            files = {rel: drift(rel, text) for rel, text in original.items()}
            reference = {rel: drift(rel, patched[rel]) for rel in targets}
            yield kind, kind, files, reference, None
            continue
        for rel, (names, lines) in targets.items():
            for qualname, function in functions_at(original[rel], names, lines):
                for old in renamed_locals(function, original[rel], patched[rel]):
                    new = f"{old}_vendor"
                    renamed = rename_local(original[rel], qualname, old, new)
                    if renamed is None or new in original[rel]:
                        continue
                    files = {**original, rel: renamed}
                    yield (
                        kind,
                        f"{qualname}:{old}",
                        files,
                        patched,
                        (rel, qualname, old, new),
                    )

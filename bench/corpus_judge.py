"""Judging one cell of the derive corpus (bench/derive_corpus.py): what a
derived patch wrote on a release, against ``git apply`` of the commit.

A cell is one derived patch on one release. Its verdict:

- ``same``: it writes, ``git apply`` applies the commit's diff (restricted
  to the patch's files), and every file has the same text as ``git
  apply``'s result;
- ``same-ast``: the same, but a file's text differs where its AST does not
  (comments, quotes, blank lines: the ``text`` check);
- ``beyond``: it writes where ``git apply`` fails, or where ``git apply``'s
  own result gains an undefined name that the write does not (vllm#50533 on
  0.25.1 drops an import the release still uses elsewhere), and none of the
  checks below finds it wrong;
- ``wrong``: a check below finds the write wrong;
- ``refused-where-git-applies``: nothing written (drifted, not-applicable,
  an error) where ``git apply`` applies and does not say applied;
- ``applied-wrongly``: it says ``applied`` where ``git apply`` applies and
  ``git apply -R`` does not;
- ``applied``, ``not-applicable``, ``drifted``, ``error``: nothing written,
  and ``git apply`` does not apply either;
- ``traceback``: the command ended in an exception.

The checks of a write, each with its own verdict in ``Cell.checks``
(``ok`` or ``wrong``; absent where it does not apply):

- ``ast``: where ``git apply`` applies, every file has its result's AST
  (but a file where that result gains an undefined name and the write does
  not: ``Cell.git_broken``, judged by ``beyond``);
- ``text``: where ``git apply`` applies, every file has its result's text
  (a ``wrong`` here makes the cell ``same-ast``, not ``wrong``: the code is
  right, the bytes around it are not kept);
- ``beyond``: where ``git apply`` fails (or its result is broken, above),
  a written file compiles, gains no
  undefined name (ruff F821/F822/F823, before vs after), imports from a
  ``vllm`` module only names (and modules) the release has, and equals a
  clean 3-way merge where there is one (``git merge-file``: the release's
  file, the parent's, the commit's) that gains no undefined name itself;
- ``types``: a real type checker, ty, finds no new error on a written file
  (its diagnostics on the release's file and on the written one, in the
  release tree with every written file in place, compared without their
  lines; an unresolved import of a module outside ``vllm`` is not counted:
  torch and the other third-party packages are absent on purpose; nor an
  error on a line its author marked ``# type: ignore[...]``, which vLLM
  writes with mypy's codes and ty honours only with its own);
- ``envs``: every ``envs.X`` the write newly reads (``vllm.envs`` answers
  every name through its module ``__getattr__``) is declared by the
  release's ``vllm/envs.py``: bound at its top level, under ``if
  TYPE_CHECKING:``, or a key of its ``environment_variables`` dict;
- ``attributes``: every attribute name the write newly reads (not read off
  a module or class imported from outside ``vllm``) is defined somewhere in
  the release's ``vllm/`` or the written files (an assignment to it, a
  ``def``, a ``class``, a field or class attribute, a module-level name, a
  ``setattr`` with its name) or is an attribute of a builtin or standard
  library class (a stream's ``isatty``, a logger's ``warning``); a name
  the write asks ``hasattr(x, "NAME")`` of is not counted either. A name
  defined nowhere that the release reads elsewhere (a tensor's method, a
  Hugging Face config field; ``getattr(x, "NAME")`` is a read too) is only
  noted (``Cell.external``): it comes from outside ``vllm``; one that the
  release neither defines nor reads is wrong.

The judge shares no code with the engine: it runs the command line
(``apply --dry-run``) and reads files, git and ruff's and ty's output.
ty is a bench requirement, not a dependency of the tool: ``pip install ty``
(measured with ty 0.0.108); without it the bench refuses to start and the
``types`` check is not run (``Cell.checks`` says ``not-run``).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_checks import (  # noqa: E402
    attribute_wrongs,
    envs_wrongs,
    type_wrongs,
)

#: Compiled extension modules of vLLM: not in a source tree, never judged.
_COMPILED = ("vllm._C", "vllm._moe_C", "vllm._rocm_C", "vllm.vllm_flash_attn")


@dataclass
class Commit:
    """What the judge needs of a commit, for the patch's files."""

    sha: str
    patch_id: str
    paths: list[str]
    #: The commit's diff, restricted to ``paths``.
    diff: str
    #: path -> the parent's text, and the commit's.
    parent_text: dict[str, str]
    commit_text: dict[str, str]


@dataclass
class Cell:
    sha: str
    patch_id: str
    release: str
    state: str = ""
    reason: str = ""
    written: list[str] = field(default_factory=list)
    git_forward: bool = False
    git_reverse: bool = False
    verdict: str = ""
    wrong: list[str] = field(default_factory=list)
    #: A write that changes only import statements (no code unit).
    imports_only: bool = False
    #: Each check's verdict on the write (module docstring): ok, wrong,
    #: not-run; absent where it does not apply.
    checks: dict[str, str] = field(default_factory=dict)
    #: Where the text differs from git apply's result (the ``text`` check).
    text_differs: list[str] = field(default_factory=list)
    #: Attribute names the write newly reads that the release defines
    #: nowhere but reads elsewhere: from outside vllm (not wrong).
    external: list[str] = field(default_factory=list)
    #: The files where git apply's own result gains an undefined name and
    #: the write does not: judged by the ``beyond`` checks there.
    git_broken: list[str] = field(default_factory=list)
    exit_code: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict:
        return asdict(self)


def judge(commit: Commit, release: str, tree: Path, folder: Path, out: Path) -> Cell:
    """The cell of ``commit``'s derived patch (in ``folder``) on ``tree``."""
    import time

    started = time.monotonic()
    cell = Cell(commit.sha, commit.patch_id, release)
    document, cell.exit_code, crashed = _dry_run(tree, folder, commit.patch_id)
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        pristine = _copy_files(tree, commit.paths, Path(scratch) / "pristine")
        git_result = _copy_files(tree, commit.paths, Path(scratch) / "git")
        cell.git_forward = _git_apply(git_result, commit.diff, "--check")
        cell.git_reverse = _git_apply(git_result, commit.diff, "--check", "-R")
        if cell.git_forward:
            _git_apply(git_result, commit.diff)
        if crashed:
            cell.verdict, cell.state = "traceback", "traceback"
            cell.reason = crashed
        else:
            _read_document(cell, document, commit.patch_id)
            ours = _copy_files(tree, commit.paths, Path(scratch) / "ours")
            diff = document.get("diff", "") if cell.written else ""
            if diff and not _git_apply(ours, diff):
                cell.wrong.append("its own dry-run diff does not apply")
            cell.verdict = _verdict(cell, commit, tree, pristine, ours, git_result)
    cell.seconds = round(time.monotonic() - started, 2)
    return cell


def _dry_run(tree: Path, folder: Path, patch_id: str) -> tuple[dict, int, str]:
    """``apply --dry-run`` in this process, as the command line runs it."""
    from click.testing import CliRunner
    from deepstack_patch.cli import main

    args = ["apply", "--vllm-src", str(tree), "--patches", str(folder)]
    args += ["--only", patch_id, "--dry-run", "--format", "json"]
    result = CliRunner().invoke(main, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        lines = traceback.format_exception(*result.exc_info)
        return {}, 1, "".join(lines[-3:]).strip()
    try:
        return json.loads(result.stdout), result.exit_code, ""
    except ValueError:
        return {}, result.exit_code, ""


def _read_document(cell: Cell, document: dict, patch_id: str) -> None:
    if "error" in document and not document.get("patches"):
        cell.state, cell.reason = "error", document["error"].get("message", "")
        return
    for patch in document.get("patches", []):
        if patch["id"] == patch_id:
            cell.state, cell.reason = patch["state"], patch.get("reason", "")
    # A refused run (drifted, exit 2) writes nothing, whatever diff it shows
    # of the parts it could rewrite.
    if document.get("diff") and cell.exit_code == 0 and "error" not in document:
        cell.written = sorted(
            line.split(" b/", 1)[1]
            for line in document["diff"].splitlines()
            if line.startswith("diff --git ")
        )


def _verdict(
    cell: Cell, commit: Commit, tree: Path, pristine: Path, ours: Path, git: Path
) -> str:
    if cell.written:
        cell.imports_only = all(
            _code_of(_without_imports(pristine / p))
            == _code_of(_without_imports(ours / p))
            for p in cell.written
        )
        if cell.git_forward:
            differing = [p for p in commit.paths if _code(ours / p) != _code(git / p)]
            # Where git apply's result reads a name it no longer has (an
            # import it drops that the release still uses elsewhere) and the
            # write does not, git apply is no reference: the beyond checks.
            cell.git_broken = [
                p
                for p in differing
                if _gains_undefined(pristine, git, p)
                and not _gains_undefined(pristine, ours, p)
            ]
            _check(cell, "ast", _ast_wrongs(differing, cell.git_broken))
            if cell.git_broken:
                beyond = [
                    wrong
                    for path in cell.git_broken
                    for wrong in _beyond_wrongs(commit, tree, pristine, ours, path)
                ]
                _check(cell, "beyond", beyond)
            kept = [p for p in commit.paths if p not in cell.git_broken]
            cell.text_differs = _text_wrongs(kept, ours, git)
            cell.checks["text"] = "wrong" if cell.text_differs else "ok"
        else:
            beyond = [
                wrong
                for path in cell.written
                for wrong in _beyond_wrongs(commit, tree, pristine, ours, path)
            ]
            _check(cell, "beyond", beyond)
        _check(cell, "types", type_wrongs(tree, ours, cell.written))
        _check(cell, "envs", envs_wrongs(tree, pristine, ours, cell.written))
        attributes, cell.external = attribute_wrongs(tree, pristine, ours, cell.written)
        _check(cell, "attributes", attributes)
        if cell.wrong:
            return "wrong"
        if not cell.git_forward or cell.git_broken:
            return "beyond"
        return "same-ast" if cell.text_differs else "same"
    if cell.state == "applied":
        wrongly = cell.git_forward and not cell.git_reverse
        return "applied-wrongly" if wrongly else "applied"
    if cell.git_forward and not cell.git_reverse:
        return "refused-where-git-applies"
    return cell.state or "error"


def _check(cell: Cell, name: str, wrongs: list[str] | None) -> None:
    """One check's verdict; None: it could not run."""
    if wrongs is None:
        cell.checks[name] = "not-run"
        return
    cell.checks[name] = "wrong" if wrongs else "ok"
    cell.wrong.extend(wrongs)


def _ast_wrongs(differing: list[str], git_broken: list[str]) -> list[str]:
    return [
        f"{path}: not the AST of git apply's result"
        for path in differing
        if path not in git_broken
    ]


def _gains_undefined(pristine: Path, result: Path, path: str) -> bool:
    """Whether ``result``'s file reads a name the release's does not leave
    undefined (ruff F821/F822/F823, before vs after)."""
    if not (result / path).is_file():
        return False
    before = _text(pristine / path)
    after = (result / path).read_text(encoding="utf-8")
    return bool(_new(_ruff_names(before, path), _ruff_names(after, path)))


def _text_wrongs(paths: list[str], ours: Path, git: Path) -> list[str]:
    """Each file whose text is not git apply's result, with the first line
    that differs."""
    differs = []
    for path in paths:
        mine, theirs = _text(ours / path), _text(git / path)
        if mine == theirs:
            continue
        mine_lines, their_lines = mine.splitlines(), theirs.splitlines()
        at = next(
            (
                n
                for n, (a, b) in enumerate(zip(mine_lines, their_lines, strict=False))
                if a != b
            ),
            min(len(mine_lines), len(their_lines)),
        )
        line = mine_lines[at] if at < len(mine_lines) else "(end of file)"
        differs.append(f"{path}:{at + 1}: {line.strip()[:70]!r}, not git apply's line")
    return differs


def _text(file: Path) -> str:
    return file.read_text(encoding="utf-8") if file.is_file() else ""


def _beyond_wrongs(
    commit: Commit, tree: Path, pristine: Path, ours: Path, path: str
) -> list[str]:
    """Where git apply fails: what makes a written file wrong."""
    before = (pristine / path).read_text(encoding="utf-8")
    after = (ours / path).read_text(encoding="utf-8")
    try:
        compile(after, path, "exec")
    except SyntaxError as exc:
        return [f"{path}: does not compile ({exc.msg}, line {exc.lineno})"]
    names = _new(_ruff_names(before, path), _ruff_names(after, path))
    wrongs = [f"{path}: {code} {message}" for code, message in names]
    imports = _missing_imports(before, after, path, [ours, tree])
    wrongs += [f"{path}: {what}" for what in imports]
    merged = _merge_file(pristine / path, commit, path)
    # A merge that itself reads a name it no longer has is no reference.
    if (
        merged is not None
        and _code_of(merged) != _code_of(after)
        and not _new(_ruff_names(before, path), _ruff_names(merged, path))
    ):
        wrongs.append(f"{path}: a clean 3-way merge (git merge-file) differs")
    return wrongs


def _new(before: Counter, after: Counter) -> list[tuple[str, str]]:
    return sorted((after - before).elements())


@functools.lru_cache(maxsize=64)
def _ruff_names(text: str, path: str) -> Counter:
    """ruff's undefined-name findings on ``text`` (kept: a cell asks the
    same file's several times, for git apply's result, the write and the
    3-way merge). Callers read the Counter, never change it."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "F821,F822,F823", "--output-format", "json",
         "--stdin-filename", path, "-"],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    try:
        found = json.loads(result.stdout or "[]")
    except ValueError:
        return Counter({("ruff", result.stderr.strip()[:200]): 1})
    return Counter((d["code"], d["message"]) for d in found)


def _missing_imports(
    before: str, after: str, path: str, trees: list[Path]
) -> list[str]:
    """``from vllm.x import y`` (or ``import vllm.x``) the fix adds, where the
    release lacks ``vllm.x`` or ``y`` in it (as the patch left it: the files
    it wrote come first in ``trees``)."""
    added = _vllm_imports(after, path) - _vllm_imports(before, path)
    missing = []
    for module, name in sorted(added, key=str):
        if module.startswith(_COMPILED):
            continue
        file = _module_file(trees, module)
        if file is None:
            missing.append(f"imports {module}, which this release lacks")
        elif name and not _defines(trees, module, file, name):
            missing.append(f"imports {name} from {module}, which lacks it here")
    return missing


def _vllm_imports(text: str, path: str) -> set[tuple[str, str]]:
    package = path.removesuffix(".py").split("/")[:-1]
    if path.endswith("/__init__.py"):
        package = path.split("/")[:-1]
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(text)):
        match node:
            case ast.ImportFrom(module=module, names=names, level=level):
                base = package[: len(package) - level + 1] if level else []
                full = ".".join([*base, *([module] if module else [])])
                if full.split(".")[0] == "vllm":
                    found.update((full, a.name) for a in names if a.name != "*")
            case ast.Import(names=names):
                found.update(
                    (a.name, "") for a in names if a.name.split(".")[0] == "vllm"
                )
    return found


def _module_file(trees: list[Path], module: str) -> Path | None:
    for tree in trees:
        base = tree.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _defines(trees: list[Path], module: str, file: Path, name: str) -> bool:
    if _module_file(trees, f"{module}.{name}") is not None:
        return True  # a submodule
    bound: set[str] = set()
    pending = list(ast.parse(file.read_text(encoding="utf-8")).body)
    while pending:
        node = pending.pop()
        match node:
            case (
                ast.FunctionDef(name=n)
                | ast.AsyncFunctionDef(name=n)
                | ast.ClassDef(name=n)
            ):
                bound.add(n)
            case ast.Import(names=names) | ast.ImportFrom(names=names):
                if any(a.name == "*" for a in names):
                    return True  # cannot decide: count it found
                bound.update((a.asname or a.name).split(".")[0] for a in names)
            case ast.Assign() | ast.AnnAssign() | ast.AugAssign():
                one = [node.target] if not isinstance(node, ast.Assign) else []
                for target in node.targets if isinstance(node, ast.Assign) else one:
                    bound.update(
                        n.id for n in ast.walk(target) if isinstance(n, ast.Name)
                    )
            case ast.If() | ast.Try() | ast.With() | ast.For() | ast.While():
                for block in ("body", "orelse", "finalbody", "handlers"):
                    pending.extend(getattr(node, block, []))
            case ast.ExceptHandler():
                pending.extend(node.body)
    return name in bound or "__getattr__" in bound


def _merge_file(release_file: Path, commit: Commit, path: str) -> str | None:
    """A clean ``git merge-file`` of the commit's change into the release's
    file; None where it conflicts or a side is missing."""
    if path not in commit.parent_text or path not in commit.commit_text:
        return None
    with tempfile.TemporaryDirectory(dir=release_file.parent) as scratch:
        folder = Path(scratch)
        (folder / "base").write_text(commit.parent_text[path], encoding="utf-8")
        (folder / "theirs").write_text(commit.commit_text[path], encoding="utf-8")
        shutil.copyfile(release_file, folder / "ours")
        result = subprocess.run(
            ["git", "merge-file", "-p", "--quiet", "ours", "base", "theirs"],
            cwd=folder,
            capture_output=True,
            text=True,
        )
    return result.stdout if result.returncode == 0 else None


def _copy_files(tree: Path, paths: list[str], folder: Path) -> Path:
    for path in paths:
        if (tree / path).is_file():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / path, folder / path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _git_apply(folder: Path, diff: str, *options: str) -> bool:
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(folder.parent)}
    result = subprocess.run(
        ["git", "apply", *options, "-"],
        cwd=folder,
        input=diff,
        capture_output=True,
        text=True,
        env=env,
    )
    return result.returncode == 0


def _without_imports(file: Path) -> str:
    """The file's code with its import statements left out (as text)."""
    module = ast.parse(file.read_text(encoding="utf-8"))

    class Drop(ast.NodeTransformer):
        def visit_Import(self, node: ast.AST) -> None:
            return None

        visit_ImportFrom = visit_Import

    return ast.unparse(Drop().visit(module))


def _code(file: Path) -> str:
    return _code_of(file.read_text(encoding="utf-8")) if file.is_file() else ""


def _code_of(text: str) -> str:
    try:
        return ast.dump(ast.parse(text))
    except SyntaxError:
        return text

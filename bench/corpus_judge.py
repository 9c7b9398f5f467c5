"""Judging one cell of the derive corpus (bench/derive_corpus.py): what a
derived patch wrote on a release, against ``git apply`` of the commit.

A cell is one derived patch on one release. Its verdict:

- ``same``: it writes, ``git apply`` applies the commit's diff (restricted
  to the patch's files), and every file has the same AST;
- ``beyond``: it writes where ``git apply`` fails, and none of the checks
  below finds it wrong;
- ``wrong``: it writes something that differs from ``git apply``'s clean
  result; or, where ``git apply`` fails, a written file does not compile,
  gains an undefined name (ruff F821/F822/F823, before vs after), imports
  from a ``vllm`` module a name (or module) the release lacks, or differs
  from a clean 3-way merge (``git merge-file``: the release's file, the
  parent's, the commit's);
- ``refused-where-git-applies``: nothing written (drifted, not-applicable,
  an error) where ``git apply`` applies and does not say applied;
- ``applied-wrongly``: it says ``applied`` where ``git apply`` applies and
  ``git apply -R`` does not;
- ``applied``, ``not-applicable``, ``drifted``, ``error``: nothing written,
  and ``git apply`` does not apply either;
- ``traceback``: the command ended in an exception.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
            for path in commit.paths:
                if _code(ours / path) != _code(git / path):
                    cell.wrong.append(f"{path}: not the AST of git apply's result")
        else:
            for path in cell.written:
                cell.wrong.extend(_beyond_wrongs(commit, tree, pristine, ours, path))
        return "wrong" if cell.wrong else ("same" if cell.git_forward else "beyond")
    if cell.state == "applied":
        wrongly = cell.git_forward and not cell.git_reverse
        return "applied-wrongly" if wrongly else "applied"
    if cell.git_forward and not cell.git_reverse:
        return "refused-where-git-applies"
    return cell.state or "error"


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
    if merged is not None and _code_of(merged) != _code_of(after):
        wrongs.append(f"{path}: a clean 3-way merge (git merge-file) differs")
    return wrongs


def _new(before: Counter, after: Counter) -> list[tuple[str, str]]:
    return sorted((after - before).elements())


def _ruff_names(text: str, path: str) -> Counter:
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

"""derive's diff reader against the hand-written parser it replaced: the
same files and hunks, the same applied text, and the time each takes.

    python bench/diff_parsers.py [--repo MIRROR] [--old REV] [--every-commit]

The diffs are those ``derive --commit`` reads (``git diff`` of each commit
against its parent, as rewriter/authoring/commit.py asks for it) of the
commits of bench/derive_corpus.toml, both windows; ``--every-commit`` takes
every first-parent commit of the windows' days instead (the files and hunks
only; the corpus's commits are applied too). The old parser is the module
``rewriter/authoring/unified_diff.py`` at ``--old`` (the last commit before
unidiff read the diffs), loaded from git; the new one is the installed
``deepstack_patch.authoring.unified_diff``.

For every file of every diff: its paths, binary, rename, added or deleted,
the line where it starts, and each hunk's header numbers, its lines and
whether its new side ends without a newline. For every Python file the
parent has: the text each parser's apply gives (or its error). One
difference is expected, and counted: a file added (deleted) without a hunk
(an empty file, a binary one) has no old (new) path now, where the old
parser took it from the ``diff --git`` line. Any other difference is
printed, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derive_corpus import DATA, GIT_ENV, default_repo, git  # noqa: E402

#: The last commit of this project whose diff reader was written by hand.
OLD = "c56aa22"
ROOT = Path(__file__).resolve().parent.parent


def old_parser(revision: str) -> types.ModuleType:
    path = "rewriter/authoring/unified_diff.py"
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("old_unified_diff")
    module.__dict__["__name__"] = "old_unified_diff"
    sys.modules["old_unified_diff"] = module  # dataclasses look it up
    exec(compile(source, f"{revision}:unified_diff.py", "exec"), module.__dict__)
    return module


def commit_diff(repo: Path, sha: str) -> str:
    """The diff ``derive --commit`` reads (rewriter/authoring/commit.py)."""
    result = subprocess.run(
        ["git", "--git-dir", str(repo), "diff", "--no-color", "--no-ext-diff",
         "--no-textconv", "--no-renames", "--unified=3", "--src-prefix=a/",
         "--dst-prefix=b/", f"{sha}~1", sha],
        capture_output=True, env=GIT_ENV,
    )  # fmt: skip
    return result.stdout.decode("utf-8", errors="replace")


def old_shape(files: list) -> list[tuple]:
    return [
        (f.path, f.old_path, f.new_path, f.binary, f.rename, f.new_file,
         f.deleted, f.line,
         [(h.old_start, h.old_count, h.new_start, h.new_count, h.lines,
           h.new_ends_without_newline) for h in f.hunks])
        for f in files
    ]  # fmt: skip


def new_shape(files: list, module: types.ModuleType) -> list[tuple]:
    return [
        (f.path, f.old_path, f.new_path, f.binary, f.rename, f.new_file,
         f.deleted, f.line,
         [(h.source_start, h.source_length, h.target_start, h.target_length,
           [(line.line_type, line.value[:-1]) for line in h
            if line.line_type in " -+"],
           module._new_side_ends_without_newline(h)) for h in f.hunks])
        for f in files
    ]  # fmt: skip


def parsed(module: types.ModuleType, text: str) -> tuple[list, str]:
    try:
        return module.parse_diff(text, "diff"), ""
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return [], f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"


def applied(module: types.ModuleType, file_diff: object, before: str) -> str:
    try:
        return module.apply_file_diff(file_diff, before)
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return f"error: {getattr(exc, 'message', exc)}"


def corpus(repo: Path, every_commit: bool) -> tuple[list[str], set[str]]:
    """The shas to parse, and those of the corpus (also applied)."""
    windows = tomllib.loads(DATA.read_text())["windows"]
    chosen = {c["sha"] for w in windows for c in w["commits"]}
    if not every_commit:
        return sorted(chosen), chosen
    shas = []
    for window in windows:
        head = next(h for h in window["heads"] if _has(repo, h))
        log = git(repo, "log", "--first-parent", "--no-merges", "--format=%H %cs", head)
        shas += [
            sha
            for sha, day in (line.split() for line in log.splitlines())
            if window["since"] <= day < window["until"]
        ]
    return shas, chosen


def _has(repo: Path, commit: str) -> bool:
    result = subprocess.run(
        ["git", "--git-dir", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
    )
    return result.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--old", default=OLD)
    parser.add_argument("--every-commit", action="store_true")
    args = parser.parse_args()
    from deepstack_patch.authoring import unified_diff as new

    old = old_parser(args.old)
    repo = args.repo or default_repo()
    shas, chosen = corpus(repo, args.every_commit)
    diffs = {sha: commit_diff(repo, sha) for sha in shas}
    seconds = {"old": 0.0, "new": 0.0}
    counts = {"diffs": 0, "files": 0, "hunks": 0, "applied": 0, "missing side": 0}
    differences = []
    for sha, text in diffs.items():
        results = {}
        for name, module in (("old", old), ("new", new)):
            started = time.perf_counter()
            results[name] = parsed(module, text)
            seconds[name] += time.perf_counter() - started
        (old_files, old_error), (new_files, new_error) = results["old"], results["new"]
        counts["diffs"] += 1
        counts["files"] += len(new_files)
        counts["hunks"] += sum(len(f.hunks) for f in new_files)
        if old_error or new_error:
            if old_error != new_error:
                differences.append(f"{sha[:12]}: old {old_error!r}, new {new_error!r}")
            continue
        old_shapes, new_shapes = old_shape(old_files), new_shape(new_files, new)
        if len(old_shapes) != len(new_shapes):
            differences.append(
                f"{sha[:12]}: {len(old_shapes)} files, now {len(new_shapes)}"
            )
            continue
        for before, after, file in zip(old_shapes, new_shapes, new_files, strict=True):
            if before == after:
                continue
            if _missing_side_only(before, after, file):
                counts["missing side"] += 1
                continue
            differences.append(f"{sha[:12]} {file.path}: the file or its hunks differ")
        if sha not in chosen:
            continue
        for old_file, new_file in zip(old_files, new_files, strict=True):
            if not new_file.path.endswith(".py") or new_file.new_file:
                continue
            before = _parent_text(repo, sha, new_file.path)
            if before is None:
                continue
            counts["applied"] += 1
            if applied(old, old_file, before) != applied(new, new_file, before):
                differences.append(f"{sha[:12]} {new_file.path}: applied differently")
    print(
        f"{counts['diffs']} diffs, {counts['files']} files, {counts['hunks']} hunks; "
        f"{counts['applied']} Python files applied to their parent's text"
    )
    print(
        f"parsing: old {seconds['old']:.2f} s, new {seconds['new']:.2f} s "
        f"(unidiff), {len(text_bytes(diffs)) / 1e6:.1f} MB of diffs"
    )
    print(
        f"{counts['missing side']} files added or deleted without a hunk: the old "
        "parser named their missing side after the git header, unidiff says "
        "/dev/null (derive reads neither: the path and the flags are the same)"
    )
    print("\n".join(differences) or "no other difference")
    return 1 if differences else 0


def _missing_side_only(before: tuple, after: tuple, file: object) -> bool:
    """The one difference expected: a file added (deleted) without a hunk has
    no old (new) path now; its path and everything else are the same."""
    side = 1 if file.new_file else 2 if file.deleted else None
    if side is None or file.hunks or after[side] is not None:
        return False
    return before[:side] + before[side + 1 :] == after[:side] + after[side + 1 :]


def text_bytes(diffs: dict[str, str]) -> bytes:
    return "".join(diffs.values()).encode()


def _parent_text(repo: Path, sha: str, path: str) -> str | None:
    result = subprocess.run(
        ["git", "--git-dir", str(repo), "show", f"{sha}~1:{path}"],
        capture_output=True, env=GIT_ENV,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    return result.stdout.decode("utf-8", errors="replace")


if __name__ == "__main__":
    sys.exit(main())

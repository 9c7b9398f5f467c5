"""vLLM's own backports as ground truth: deepstack-patch against ``git
apply`` and ``git apply --3way`` on the fixes the maintainers carried into
patch releases (issue 40 item 8).

    python bench/backports.py [--series 0.20 ...] [--jobs 1] [--tool PATH]
                              [--map] [--repo MIRROR] [--work DIR]
                              [--only SHA ...] [--format table|json]

vLLM's patch releases are cut from release branches onto which the
maintainers cherry-pick fixes from main, so the difference between two
sdists of one minor series (0.20.0 -> 0.20.1) is a set of human backports.

**The mapping** (``--map``, which rewrites bench/backports.toml's commit
lists; without it the lists there are used): for each pair of consecutive
releases of a series, the release diff is the files of ``vllm/**.py`` whose
text differs between the two sdists (``vllm/_version.py`` left out: the
build writes it). The candidates are the first-parent, non-merge commits of
upstream's main (the data file's ``head``, in the mirror) committed from
``lookback_days`` before the earlier release's upload to the later one's
upload, that change one of those files. A hunk of a candidate (``git diff
-U1`` of the commit, ``vllm/**.py`` only) is *carried* when its pre-image
is in the earlier release at a place where the later release holds its
post-image (the two releases aligned line by line, trailing blanks
ignored); an added file is carried when the later release has it and the
earlier one does not, a deleted one the reverse. A candidate is
*backported* when every hunk is carried, *partly* when at least half are;
both kinds are measured. A block of the release diff that no carried hunk
of a backported or partly backported commit touches is *unmapped*.

**The measurement**: each mapped commit, alone on the earlier release,
restricted to its ``vllm/**.py`` files:

- ``git apply`` of the commit's diff, on a copy of the release's files;
- ``git apply --3way`` of the same diff (``--full-index``) in a scratch
  git repository holding the release's files, with the parent's blobs
  written into its object store, so a hunk that does not apply is merged;
- deepstack-patch: ``derive --commit SHA --repo MIRROR --base-version
  PREV`` then ``apply --dry-run --only ID --format json`` on the earlier
  release, its diff applied to a copy (``--tool``: the deepstack-patch
  executable, or a python that has it, so the same corpus runs against
  another checkout).

A commit that deepstack-patch refuses alone for a name the release lacks
(the names stage, the runtime names, ty's verdict), or for a definition of
its code that is absent beside parts that are there, where a mapped commit
of the same pair earlier on main adds that name (it reads on more of its
added lines than removed ones), is judged as a vendor carrying both applies it:
after that *partner* in one series (both derived, ``--patches`` the
partner's folder first, ``--only`` both, both ``needed``). Only its own
changes count: the base it is compared from is the release with the
partner's dry-run alone applied, its hunks are found there, and the
partner's own effect counts neither for nor against it (a partner's write
beside its hunks counts against it, never for). The table says which were
judged so (``same (after vllm#N)``). ``git apply`` and ``--3way`` are then
judged after the same partner too, each applying the partner's diff first
with the same tool (the base their own changes are judged from is that
write; where the partner does not apply, the commit is refused), so that the
three tools carry the same pair. Where the series does not write both, the
refusal alone stands, and the textual tools are judged alone.

Each result is compared with the maintainers': the earlier release's files
with the later release's text in every region that the commit's carried
hunks or the tool's own changes touch (a region grows to every block of
either diff it meets), so another backport of the same release elsewhere in
the file is not held against the commit. Verdicts: ``same`` (every file the
same text), ``same-ast`` (the same code, other text), ``differs``,
``refused`` (nothing written: a refusal, a failed apply, a state other than
``needed``). A write whose text is not the maintainers' is also judged by
the corpus judge's checks (bench/runtime_checks.py: ty's new errors,
undeclared ``envs`` names, attributes the release defines nowhere) and its
text check (the first line that differs).

The releases come through the tool's fetch cache (bench/derive_corpus.py's
extraction); the work folder (default
``~/.cache/deepstack-patch-bench/backports``) keeps them; each run rewrites
``run/`` in it: the derived patches, ``cells.json`` and ``table.md``.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import datetime
import difflib
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_judge  # noqa: E402
import derive_corpus  # noqa: E402
import runtime_checks  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "backports.toml"
WORK = Path.home() / ".cache" / "deepstack-patch-bench" / "backports"
#: Written by the build, not by a commit.
GENERATED = ("vllm/_version.py",)
TOOLS = ("git apply", "git apply --3way", "deepstack-patch")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def git(repo: Path, *args: str) -> str:
    return derive_corpus.git(repo, *args)


# -- hunks and where they are ---------------------------------------------------


@dataclass
class Hunk:
    """One hunk of a commit's diff: its pre-image and post-image lines
    (trailing blanks dropped), and the part ``lo``..``hi`` of the pre-image
    it changes (``lo == hi`` for a pure insertion)."""

    pre: list[str]
    post: list[str]
    lo: int
    hi: int


@dataclass
class FileChange:
    path: str
    #: "added", "deleted" or "modified".
    kind: str = "modified"
    hunks: list[Hunk] = field(default_factory=list)


def parse_diff(diff: str) -> list[FileChange]:
    """A ``git diff`` as file changes with their hunks."""
    changes: list[FileChange] = []
    pre: list[str] = []
    post: list[str] = []
    touched: list[tuple[int, int]] = []

    def close() -> None:
        if changes and touched:
            lo = min(a for a, _ in touched)
            hi = max(b for _, b in touched)
            changes[-1].hunks.append(Hunk(pre[:], post[:], lo, hi))
        pre.clear(), post.clear(), touched.clear()

    in_hunk = False
    for line in diff.splitlines():
        # A file's header (---, +++, mode lines) comes before its first @@;
        # inside a hunk, a line of code may begin with "--" or "++" too.
        match line[:1]:
            case "d" if line.startswith("diff --git "):
                close()
                in_hunk = False
                changes.append(FileChange(line.split(" b/", 1)[1]))
            case _ if not changes:
                continue
            case "@" if line.startswith("@@"):
                close()
                in_hunk = True
            case "n" if not in_hunk and line.startswith("new file mode"):
                changes[-1].kind = "added"
            case "d" if not in_hunk and line.startswith("deleted file mode"):
                changes[-1].kind = "deleted"
            case "-" if in_hunk:
                touched.append((len(pre), len(pre) + 1))
                pre.append(line[1:].rstrip())
            case "+" if in_hunk:
                touched.append((len(pre), len(pre)))
                post.append(line[1:].rstrip())
            case " " if in_hunk:
                pre.append(line[1:].rstrip())
                post.append(line[1:].rstrip())
    close()
    return changes


class Alignment:
    """An old and a new text's lines aligned (difflib), trailing blanks
    ignored."""

    def __init__(self, old: list[str], new: list[str]) -> None:
        self.old = [line.rstrip() for line in old]
        self.new = [line.rstrip() for line in new]
        matcher = difflib.SequenceMatcher(None, self.old, self.new, autojunk=False)
        self.opcodes = matcher.get_opcodes()

    def to_new(self, at: int) -> int:
        """Where old line ``at`` is in the new text (the start of what
        replaced it, where it changed)."""
        for tag, i1, i2, j1, _ in self.opcodes:
            if i1 <= at < i2:
                return j1 + (at - i1) if tag == "equal" else j1
        return len(self.new)

    def blocks(self) -> list[tuple[int, int]]:
        """The old lines of each change (``i1 == i2``: an insertion)."""
        return [(i1, i2) for tag, i1, i2, _, _ in self.opcodes if tag != "equal"]

    def new_lines(self, lo: int, hi: int) -> list[str]:
        """The new text of old lines ``lo..hi``, every change inside them
        included (an insertion at either end too)."""
        starts, ends = [], []
        for tag, i1, i2, j1, j2 in self.opcodes:
            if tag == "equal" and i1 < hi and lo < i2:
                starts.append(j1 + max(lo, i1) - i1)
                ends.append(j1 + min(hi, i2) - i1)
            elif tag != "equal" and lo <= i1 and i2 <= hi:
                starts.append(j1)
                ends.append(j2)
        if not starts:
            return []
        return self.new[min(starts) : max(ends)]


@functools.lru_cache(maxsize=256)
def aligned(old: str, new: str) -> Alignment:
    """Two texts aligned once: every candidate of a pair is read against
    the same release files."""
    return Alignment(old.splitlines(), new.splitlines())


def occurrences(lines: list[str], block: list[str]) -> list[int]:
    if not block:
        return []
    return [
        at
        for at in range(len(lines) - len(block) + 1)
        if lines[at] == block[0] and lines[at : at + len(block)] == block
    ]


def carried_at(hunk: Hunk, release: Alignment) -> int | None:
    """Where the hunk's pre-image sits in the earlier release with its
    post-image at the same place in the later one; None: not carried."""
    for at in occurrences(release.old, hunk.pre):
        start = release.to_new(at)
        # An insertion whose pre-image still reads in its post-image (the
        # lines around it, one after the other) is found in an earlier
        # release that already has it: there nothing changed.
        already = release.old[at : at + len(hunk.post)] == hunk.post
        if release.new[start : start + len(hunk.post)] == hunk.post and not already:
            return at
    return None


def touches(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Two line ranges overlap or meet (an insertion at an edge counts)."""
    return a[0] <= b[1] and b[0] <= a[1]


def regions(
    seeds: list[tuple[int, int]], *alignments: Alignment
) -> list[tuple[int, int]]:
    """The seeds grown to every changed block of the alignments that they
    meet, until none is left that meets one; merged where they meet."""
    blocks = [block for alignment in alignments for block in alignment.blocks()]
    grown = sorted(seeds)
    while True:
        merged: list[tuple[int, int]] = []
        for region in sorted(
            grown + [b for b in blocks if any(touches(b, g) for g in grown)]
        ):
            if merged and touches(merged[-1], region):
                merged[-1] = (merged[-1][0], max(merged[-1][1], region[1]))
            else:
                merged.append(region)
        if merged == grown:
            return merged
        grown = merged


def maintainers_text(
    prev: str, next_: str, result: str, seeds: list[tuple[int, int]]
) -> str:
    """The earlier release's text with the later release's in every region
    that the seeds (the commit's hunks there) or the result's own changes
    touch: the maintainers' backport of this commit alone."""
    prev_lines = prev.splitlines()
    release = Alignment(prev_lines, next_.splitlines())
    written = Alignment(prev_lines, result.splitlines())
    out: list[str] = []
    at = 0
    for lo, hi in regions(seeds + written.blocks(), release, written):
        out += prev_lines[at:lo] + release.new_lines(lo, hi)
        at = hi
    out += prev_lines[at:]
    return "\n".join(out) + ("\n" if out else "")


# -- the mapping: release differences to main commits ----------------------------


def python_files(tree: Path) -> dict[str, str]:
    """The release's ``vllm/**.py`` texts, by path (the build's own left out)."""
    files = {}
    for file in sorted((tree / "vllm").rglob("*.py")):
        path = file.relative_to(tree).as_posix()
        if path not in GENERATED:
            files[path] = file.read_text(encoding="utf-8", errors="replace")
    return files


def differing(prev: dict[str, str], next_: dict[str, str]) -> list[str]:
    return sorted(p for p in prev.keys() | next_.keys() if prev.get(p) != next_.get(p))


@dataclass
class Carried:
    """How much of one commit the later release carries."""

    hunks: int = 0
    carried: int = 0
    #: path -> the earlier release's lines each carried hunk changes.
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: Files the commit adds or deletes that the later release does too.
    files: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.hunks and self.carried == self.hunks:
            return "backported"
        if self.carried and 2 * self.carried >= self.hunks:
            return "partly"
        return ""


def carried(
    changes: list[FileChange], prev: dict[str, str], next_: dict[str, str]
) -> Carried:
    """Which hunks of a commit's diff the later release carries."""
    found = Carried()
    for change in changes:
        if not _is_python(change.path):
            continue
        if change.kind in ("added", "deleted"):
            found.hunks += 1
            there = (change.path in next_, change.path in prev)
            if there == ((True, False) if change.kind == "added" else (False, True)):
                found.carried += 1
                found.files.append(change.path)
            continue
        found.hunks += len(change.hunks)
        if change.path not in prev or change.path not in next_:
            continue
        release = aligned(prev[change.path], next_[change.path])
        for hunk in change.hunks:
            at = carried_at(hunk, release)
            if at is not None:
                found.carried += 1
                found.spans.setdefault(change.path, []).append(
                    (at + hunk.lo, at + hunk.hi)
                )
    return found


def _is_python(path: str) -> bool:
    return path.startswith("vllm/") and path.endswith(".py") and path not in GENERATED


def unmapped(
    paths: list[str],
    prev: dict[str, str],
    next_: dict[str, str],
    mapped: list[Carried],
) -> list[str]:
    """Each block of the release diff that no mapped commit's carried hunk
    touches, as ``path:line`` (the earlier release's line, 1-based)."""
    left = []
    for path in paths:
        if path not in prev or path not in next_:
            if not any(path in m.files for m in mapped):
                left.append(f"{path} ({'added' if path in next_ else 'deleted'})")
            continue
        spans = [s for m in mapped for s in m.spans.get(path, [])]
        release = aligned(prev[path], next_[path])
        for block in release.blocks():
            if not any(touches(block, s) for s in spans):
                left.append(f"{path}:{block[0] + 1}")
    return left


def commit_diff(repo: Path, sha: str, *options: str) -> str:
    """The commit's diff of ``vllm/**.py`` (renames as a delete and an add)."""
    return git(
        repo, "diff", "--no-renames", *options, f"{sha}~1", sha, "--", "vllm/*.py"
    )


def candidates(
    repo: Path, head: str, since: str, until: str, paths: list[str]
) -> list[dict]:
    """First-parent, non-merge commits of ``head`` committed (their
    committer day, as text) from ``since`` to ``until`` that change one of
    ``paths``."""
    if not paths:
        return []
    log = git(
        repo, "log", "--first-parent", "--no-merges", "--format=%H %cs %s",
        f"--since={since}T00:00:00Z", head, "--", *paths,
    )  # fmt: skip
    found = []
    for line in log.splitlines():
        sha, day, subject = line.split(" ", 2)
        if since <= day <= until:
            found.append({"sha": sha, "date": day, "subject": subject})
    return found[::-1]


def day_before(day: str, days: int) -> str:
    return (
        datetime.date.fromisoformat(day) - datetime.timedelta(days=days)
    ).isoformat()


def map_pair(
    repo: Path, data: dict, prev_version: str, next_version: str, trees: dict[str, Path]
) -> dict:
    """The main commits behind the difference of two releases."""
    dates = data["release_dates"]
    prev, next_ = python_files(trees[prev_version]), python_files(trees[next_version])
    paths = differing(prev, next_)
    since = day_before(dates[prev_version], data["lookback_days"])
    found = candidates(repo, data["head"], since, dates[next_version], paths)
    commits, mapped = [], []
    for commit in found:
        share = carried(
            parse_diff(commit_diff(repo, commit["sha"], "-U1")), prev, next_
        )
        if share.kind:
            mapped.append(share)
            commits.append(
                {
                    **commit,
                    "kind": share.kind,
                    "hunks": f"{share.carried}/{share.hunks}",
                }
            )
    left = unmapped(paths, prev, next_, mapped)
    blocks = sum(
        len(aligned(prev[p], next_[p]).blocks()) if p in prev and p in next_ else 1
        for p in paths
    )
    say(
        f"{prev_version} -> {next_version}: {len(paths)} files differ "
        f"({blocks} blocks);"
        f" {len(found)} candidates; {len(commits)} mapped; {len(left)} blocks unmapped"
    )
    return {
        "prev": prev_version,
        "next": next_version,
        "files": len(paths),
        "blocks": blocks,
        "candidates": len(found),
        "unmapped": left,
        "commits": commits,
    }


# -- the measurement: each tool's result against the maintainers' -------------


@dataclass
class Result:
    """One tool's result on one commit."""

    tool: str
    verdict: str = ""
    #: Why nothing was written, or what differs (path:line: the line).
    reason: str = ""
    written: list[str] = field(default_factory=list)
    differs: list[str] = field(default_factory=list)
    #: The corpus judge's checks of a write whose text is not the
    #: maintainers' (ok, wrong, not-run), and what they found.
    checks: dict[str, str] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    #: The mapped commit of the same release pair this one was judged
    #: after, in one series (``vllm#N (sha)``), where deepstack-patch alone
    #: refused it for a name that commit adds (each tool then applies the
    #: partner first); "" judged alone.
    partner: str = ""


def compare(
    paths: list[str],
    prev: Path,
    next_: Path,
    ours: Path,
    seeds: dict[str, list[tuple[int, int]]],
    deleted: list[str],
) -> tuple[str, list[str]]:
    """The verdict of a write (``ours`` holds every path as the tool left
    it) against the maintainers' result, and where it differs."""
    if not paths:
        # A verdict on no file would read "same": never given.
        raise ValueError("no vllm/**.py file to compare")
    worst, differs = "same", []
    for path in paths:
        expected = _expected(path, prev, next_, ours, seeds.get(path, []), deleted)
        mine = _read(ours / path)
        if mine == expected:
            continue
        if mine is not None and expected is not None and _code(mine) == _code(expected):
            worst = "differs" if worst == "differs" else "same-ast"
        else:
            worst = "differs"
        differs.append(_first_difference(path, mine, expected))
    return worst, differs


def _expected(
    path: str,
    prev: Path,
    next_: Path,
    ours: Path,
    seeds: list[tuple[int, int]],
    deleted: list[str],
) -> str | None:
    before, after, mine = _read(prev / path), _read(next_ / path), _read(ours / path)
    if before is None or after is None:
        # A file the commit adds (or deletes) is the later release's, whole;
        # one the later release deletes for another reason stays.
        return after if before is None or path in deleted else before
    return maintainers_text(before, after, mine if mine is not None else before, seeds)


def _read(file: Path) -> str | None:
    return (
        file.read_text(encoding="utf-8", errors="replace") if file.is_file() else None
    )


def _code(text: str) -> str:
    try:
        return ast.dump(ast.parse(text))
    except SyntaxError:
        return text


def _first_difference(path: str, mine: str | None, expected: str | None) -> str:
    if mine is None or expected is None:
        return f"{path}: {'absent' if mine is None else 'present'}, not as the release"
    a, b = mine.splitlines(), expected.splitlines()
    at = next(
        (n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
        min(len(a), len(b)),
    )
    line = a[at].strip()[:70] if at < len(a) else "(end of file)"
    return f"{path}:{at + 1}: {line!r}, not the maintainers' line"


def _copy(tree: Path, paths: list[str], folder: Path) -> Path:
    return corpus_judge._copy_files(tree, paths, folder)


def git_apply(diff: str, tree: Path, paths: list[str], folder: Path) -> Result:
    result = Result("git apply")
    ours = _copy(tree, paths, folder)
    if not corpus_judge._git_apply(ours, diff):
        result.verdict, result.reason = "refused", "does not apply"
    return result


def git_apply_3way(
    diff: str, tree: Path, paths: list[str], folder: Path, repo: Path, sha: str
) -> Result:
    """``git apply --3way`` in a scratch repository holding the release's
    files, with the parent's blobs there, so a hunk that does not apply is
    merged."""
    result = Result("git apply --3way")
    ours = _copy(tree, paths, folder)
    env = {**derive_corpus.GIT_ENV, "GIT_CEILING_DIRECTORIES": str(folder.parent)}

    def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args],
            cwd=ours, capture_output=True, env=env, **kwargs,
        )  # fmt: skip

    run("init", "-q")
    run("add", "-A")
    run("commit", "-q", "--allow-empty", "-m", "release")
    for path in paths:
        blob = subprocess.run(
            ["git", "--git-dir", str(repo), "cat-file", "blob", f"{sha}~1:{path}"],
            capture_output=True, env=derive_corpus.GIT_ENV,
        )  # fmt: skip
        if blob.returncode == 0:
            run("hash-object", "-w", "--stdin", input=blob.stdout)
    applied = run("apply", "--3way", "-", input=diff.encode())
    shutil.rmtree(ours / ".git")
    if applied.returncode != 0:
        result.verdict = "refused"
        result.reason = (
            "conflicts" if b"conflict" in applied.stderr else "does not apply"
        )
    return result


def tool_command(tool: str | None) -> list[str]:
    """The deepstack-patch to measure: an executable, or a python that has
    the package (the bench's own by default)."""
    if tool is None:
        return [sys.executable, "-m", "deepstack_patch"]
    if Path(tool).name.startswith("python"):
        return [tool, "-m", "deepstack_patch"]
    return [tool]


def deepstack_patch(
    command: list[str],
    commit: dict,
    repo: Path,
    tree: Path,
    paths: list[str],
    folder: Path,
    derived: Path,
) -> Result:
    """derive --commit on the earlier release's version, then apply
    --dry-run of it alone on that release; its diff written to a copy. The
    id is the commit's own: a built-in patch may already hold its PR's."""
    result = Result("deepstack-patch")
    ours = _copy(tree, paths, folder)
    made = subprocess.run(
        [*command, "derive", "--commit", commit["sha"], "--repo", str(repo),
         "--base-version", commit["prev"], "--id", f"backport-{commit['sha'][:12]}",
         "--out", str(derived), "--format", "json"],
        capture_output=True, text=True, env=derive_corpus.GIT_ENV,
    )  # fmt: skip
    if made.returncode != 0 or "Traceback" in made.stderr:
        message = derive_corpus._error_message(made.stdout, made.stderr)
        if made.returncode not in (0, 2) or "Traceback" in made.stderr:
            message = "traceback: " + (made.stderr.strip().splitlines() or [""])[-1]
        result.verdict = "refused"
        result.reason = "derive: " + " ".join(message.split())[:300]
        return result
    patch_id = json.loads(made.stdout)["id"]
    cell, document = dry_run(command, tree, [derived], [patch_id], commit)
    if not cell.written:
        # Whole: the names it quotes may lead to a partner (partner_of).
        result.verdict = "refused"
        result.reason = f"{cell.state}: " + " ".join(cell.reason.split())
    elif not corpus_judge._git_apply(ours, document["diff"]):
        result.verdict, result.reason = "differs", "its own dry-run diff does not apply"
    result.written = cell.written
    return result


def dry_run(
    command: list[str],
    tree: Path,
    folders: list[Path],
    ids: list[str],
    commit: dict,
) -> tuple[corpus_judge.Cell, dict]:
    """``apply --dry-run`` of the patches ``ids`` (of ``folders``, in that
    order: the series order) on ``tree``: the last id's cell, and the
    document (its diff: every selected patch's)."""
    ran = subprocess.run(
        [*command, "apply", "--vllm-src", str(tree),
         *(a for folder in folders for a in ("--patches", str(folder))),
         *(a for patch_id in ids for a in ("--only", patch_id)),
         "--dry-run", "--format", "json"],
        capture_output=True, text=True, env=derive_corpus.GIT_ENV,
    )  # fmt: skip
    cell = corpus_judge.Cell(commit["sha"], ids[-1], commit["prev"], ran.returncode)
    document: dict = {}
    try:
        document = json.loads(ran.stdout)
        corpus_judge._read_document(cell, document, ids[-1])
    except ValueError:
        cell.state, cell.reason = "error", (ran.stderr.strip().splitlines() or [""])[-1]
    return cell, document


# -- a commit judged after its partner ----------------------------------------------

#: How the engine words a refusal for a name the release lacks (the names
#: stage, the runtime names, ty's verdict): only such a refusal looks for a
#: partner that adds the name.
LACKED = (
    "which this release lacks",
    "which nothing in this release defines",
    "does not match any known parameter",
    "has no attribute",
)


#: How the engine words a unit of the fix's code that is absent beside
#: others that are there (engine/whole.py): the definition it names may be
#: one another fix of the pair adds (vllm#30566 changes
#: ``Base._decorate_cls_for_torch_compile``, which vllm#30518 adds).
ABSENT = re.compile(r"\b(?:method|function|class) ([\w.]+) in \S+ is absent while")


def lacked_names(reason: str) -> list[str]:
    """The names a refusal for a lacked name quotes (a dotted name's last
    part; a dunder is no name a commit adds), or the definitions it says are
    absent; none for another refusal."""
    quoted = ABSENT.findall(reason)
    if any(words in reason for words in LACKED):
        quoted += re.findall(r"`([\w.]+)`", reason)
    names = [name.rsplit(".", 1)[-1] for name in quoted]
    return [n for n in dict.fromkeys(names) if not n.startswith("__")]


def adds(diff: str, name: str) -> bool:
    """Whether a commit's diff adds ``name``: it reads on more added lines
    than removed ones (vllm#41061 adds the parameter `aux_stream_list`, and
    rewrites two lines of a local of that name). A candidate only: the
    engine, applying both, says whether the name is then there."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    count = Counter(
        line[0]
        for line in diff.splitlines()
        if line[:1] in ("+", "-")
        and not line.startswith(("+++ ", "--- "))
        and word.search(line)
    )
    return count["+"] > count["-"]


def partner_of(reason: str, earlier: list[dict], repo: Path) -> dict | None:
    """The mapped commit of the same release pair, earlier on main (the
    nearest first), that adds a name the refusal says the release lacks:
    a vendor carrying both applies it first."""
    names = lacked_names(reason)
    for other in reversed(earlier if names else []):
        diff = commit_diff(repo, other["sha"])
        if any(adds(diff, name) for name in names):
            return other
    return None


def after_partner(
    command: list[str],
    commit: dict,
    partner: dict,
    repo: Path,
    tree: Path,
    paths: list[str],
    folder: Path,
    derived: Path,
    refused: Result,
) -> tuple[Result, Path] | None:
    """deepstack-patch on the commit applied after its partner in one series
    (both derived, the partner's folder first): the result written to
    ``folder`` (the release's files with both applied), and the base its
    own changes are judged from (the partner's dry-run alone); None where
    the series does not write both (the refusal alone then stands)."""
    partner_id = f"backport-{partner['sha'][:12]}"
    own_id = f"backport-{commit['sha'][:12]}"
    partner_folder = folder.parent / "partner-derived"
    made = subprocess.run(
        [*command, "derive", "--commit", partner["sha"], "--repo", str(repo),
         "--base-version", commit["prev"], "--id", partner_id,
         "--out", str(partner_folder), "--format", "json"],
        capture_output=True, text=True, env=derive_corpus.GIT_ENV,
    )  # fmt: skip
    if made.returncode != 0:
        return None
    both, document = dry_run(
        command, tree, [partner_folder, derived], [partner_id, own_id], commit
    )
    alone, partner_document = dry_run(
        command, tree, [partner_folder], [partner_id], commit
    )
    states = {
        p["id"]: p["state"]
        for p in document.get("patches", [])
        if p["id"] in (partner_id, own_id)
    }
    if states != {partner_id: "needed", own_id: "needed"}:
        return None
    if not both.written or not alone.written:
        return None
    touched = sorted({*paths, *both.written})
    base = _copy(tree, touched, folder.parent / "partner-base")
    ours = _copy(tree, touched, folder)
    if not corpus_judge._git_apply(
        base, partner_document["diff"]
    ) or not corpus_judge._git_apply(ours, document["diff"]):
        return None
    result = Result("deepstack-patch", written=both.written)
    result.partner = f"{pr_of(partner['subject'])} ({partner['sha'][:12]})"
    result.reason = (
        f"judged after its partner {result.partner} in one series; alone: "
        + refused.reason
    )
    return result, base


def judge_commit(job: tuple) -> dict:
    """Every tool on one mapped commit: its verdicts (a worker's job)."""
    commit, repo, trees, command, run, earlier = job
    prev_tree, next_tree = trees[commit["prev"]], trees[commit["next"]]
    changes = [
        c for c in parse_diff(commit_diff(repo, commit["sha"])) if _is_python(c.path)
    ]
    paths = [c.path for c in changes]
    deleted = [c.path for c in changes if c.kind == "deleted"]
    prev_files = {p: _read(prev_tree / p) for p in paths}
    next_files = {p: _read(next_tree / p) for p in paths}
    share = carried(
        parse_diff(commit_diff(repo, commit["sha"], "-U1")),
        {p: t for p, t in prev_files.items() if t is not None},
        {p: t for p, t in next_files.items() if t is not None},
    )
    diff = commit_diff(repo, commit["sha"], "--full-index", "--binary")
    record = {**commit, "paths": paths, "results": []}
    scratch = Path(tempfile.mkdtemp(dir=run))
    try:
        results: dict[str, dict] = {}
        partner: dict | None = None
        # deepstack-patch first: where it is judged after a partner, the
        # textual tools are too, so that all three carry the same pair.
        for name in reversed(TOOLS):
            folder = scratch / name.replace(" ", "_").replace("-", "")
            base, spans = prev_tree, share.spans
            match name:
                case "git apply" | "git apply --3way" if partner is not None:
                    result, base = textual_after_partner(
                        name, diff, partner, repo, prev_tree, paths, folder, commit
                    )
                    if base != prev_tree:
                        spans = own_spans(repo, commit["sha"], base, next_tree, paths)
                case "git apply":
                    result = git_apply(diff, prev_tree, paths, folder)
                case "git apply --3way":
                    result = git_apply_3way(
                        diff, prev_tree, paths, folder, repo, commit["sha"]
                    )
                case _:
                    derived = run / "derived" / commit["sha"][:12]
                    result = deepstack_patch(
                        command, commit, repo, prev_tree, paths, folder, derived
                    )
                    found = (
                        partner_of(result.reason, earlier, repo)
                        if result.verdict == "refused"
                        else None
                    )
                    if found is not None:
                        shutil.rmtree(folder, ignore_errors=True)
                        paired = after_partner(
                            command, commit, found, repo, prev_tree, paths,
                            folder, derived, result,
                        )  # fmt: skip
                        if paired is not None:
                            # Only this commit's own changes count: its hunks
                            # are found, and its result compared, on the
                            # partner's write.
                            result, base = paired
                            partner = found
                            spans = own_spans(
                                repo, commit["sha"], base, next_tree, paths
                            )
                        else:
                            folder.mkdir(parents=True, exist_ok=True)
            if not result.verdict:
                verdict, result.differs = compare(
                    paths, base, next_tree, folder, spans, deleted
                )
                result.verdict = verdict
                if verdict != "same":
                    _run_checks(result, prev_tree, scratch, folder, paths)
            results[name] = asdict(result)
        record["results"] = [results[name] for name in TOOLS]
    except Exception as exc:  # the bench's own failure: shown, never hidden
        record["failed"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return record


def textual_after_partner(
    name: str,
    diff: str,
    partner: dict,
    repo: Path,
    tree: Path,
    paths: list[str],
    folder: Path,
    commit: dict,
) -> tuple[Result, Path]:
    """``git apply`` (or ``--3way``) of the commit after the same tool's
    apply of its partner, as a vendor carrying both would run it: the
    result written to ``folder``, and the base its own changes are judged
    from (the partner's write); where the partner does not apply, the
    commit is refused, judged from the release."""
    partner_diff = commit_diff(repo, partner["sha"], "--full-index", "--binary")
    touched = sorted(
        {*paths, *(c.path for c in parse_diff(partner_diff) if _is_python(c.path))}
    )
    base = folder.parent / f"partner-base-{folder.name}"
    if name == "git apply":
        first = git_apply(partner_diff, tree, touched, base)
    else:
        first = git_apply_3way(partner_diff, tree, touched, base, repo, partner["sha"])
    if first.verdict == "refused":
        shutil.rmtree(base, ignore_errors=True)
        _copy(tree, paths, folder)
        why = f"its partner does not apply ({first.reason})"
        return Result(name, "refused", why), tree
    if name == "git apply":
        result = git_apply(diff, base, touched, folder)
    else:
        result = git_apply_3way(diff, base, touched, folder, repo, commit["sha"])
    result.partner = f"{pr_of(partner['subject'])} ({partner['sha'][:12]})"
    return result, base


def own_spans(
    repo: Path, sha: str, base: Path, next_: Path, paths: list[str]
) -> dict[str, list[tuple[int, int]]]:
    """The lines of ``base`` (the release with the partner applied) that the
    commit's carried hunks change."""
    files = {p: _read(base / p) for p in paths}
    later = {p: _read(next_ / p) for p in paths}
    return carried(
        parse_diff(commit_diff(repo, sha, "-U1")),
        {p: t for p, t in files.items() if t is not None},
        {p: t for p, t in later.items() if t is not None},
    ).spans


def _run_checks(
    result: Result, tree: Path, scratch: Path, ours: Path, paths: list[str]
) -> None:
    """The corpus judge's checks of the files written that the release has."""
    written = [p for p in paths if (tree / p).is_file() and (ours / p).is_file()]
    written = [p for p in written if _read(tree / p) != _read(ours / p)]
    if not written:
        return
    pristine = _copy(tree, written, scratch / "pristine")
    checks = {
        "types": lambda: runtime_checks.type_wrongs(tree, ours, written),
        "envs": lambda: runtime_checks.envs_wrongs(tree, pristine, ours, written),
        "attributes": lambda: runtime_checks.attribute_wrongs(
            tree, pristine, ours, written
        )[0],
    }
    for name, check in checks.items():
        wrongs = check()
        result.checks[name] = (
            "not-run" if wrongs is None else "wrong" if wrongs else "ok"
        )
        result.wrong += wrongs or []
    shutil.rmtree(pristine, ignore_errors=True)


# -- the data file --------------------------------------------------------------

PAIR_KEYS = ("prev", "next", "files", "blocks", "candidates", "unmapped")
COMMIT_KEYS = ("sha", "date", "kind", "hunks", "subject")


def write_data(data: dict, pairs: list[dict]) -> None:
    """The data file again: its header and series as they are, then the
    pairs the mapping found (those of series not mapped now are kept)."""
    text = DATA.read_text().split("\n[[pairs]]", 1)[0].rstrip() + "\n"
    done = {(p["prev"], p["next"]) for p in pairs}
    kept = [p for p in data.get("pairs", []) if (p["prev"], p["next"]) not in done]
    for pair in sorted(kept + pairs, key=lambda p: Version(p["prev"])):
        text += "\n[[pairs]]\n" + "".join(
            f"{key} = {json.dumps(pair[key])}\n" for key in PAIR_KEYS
        )
        for commit in pair["commits"]:
            text += "\n[[pairs.commits]]\n" + "".join(
                f"{key} = {json.dumps(commit[key])}\n" for key in COMMIT_KEYS
            )
    DATA.write_text(text)


def load_data() -> dict:
    data = tomllib.loads(DATA.read_text())
    data["release_dates"] = tomllib.loads(derive_corpus.DATA.read_text())[
        "release_dates"
    ]
    return data


def series_pairs(data: dict, names: list[str]) -> list[tuple[str, str]]:
    known = [s["name"] for s in data["series"]]
    if unknown := sorted(set(names) - set(known)):
        sys.exit(f"error: no series {', '.join(unknown)}; the series: {known}")
    return [
        (prev, next_)
        for series in data["series"]
        if not names or series["name"] in names
        for prev, next_ in zip(series["releases"], series["releases"][1:], strict=False)
    ]


# -- the table --------------------------------------------------------------------


def pr_of(subject: str) -> str:
    found = re.search(r"\(#(\d+)\)\s*$", subject)
    return f"vllm#{found.group(1)}" if found else subject[:30]


def table(pairs: list[dict], records: list[dict]) -> str:
    lines = [
        "| release | commits | "
        + " | ".join(f"`{t}` same (text / AST) | differs | refused" for t in TOOLS)
        + " |",
        "|---" * (2 + 3 * len(TOOLS)) + "|",
    ]
    for pair in [*pairs, None]:
        mine = [
            r
            for r in records
            if pair is None or (r["prev"], r["next"]) == (pair["prev"], pair["next"])
        ]
        name = "**all**" if pair is None else f"{pair['prev']} → {pair['next']}"
        row = [name, str(len(mine))]
        for tool in TOOLS:
            counts = Counter(_verdict(r, tool) for r in mine)
            same = counts["same"] + counts["same-ast"]
            row += [
                f"{same} ({counts['same']} / {counts['same-ast']})",
                str(counts["differs"]),
                str(counts["refused"] + counts["failed"]),
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "| release | commit | PR | kind | "
        + " | ".join(f"`{t}`" for t in TOOLS)
        + " | deepstack-patch's reason |",
    ]
    lines.append("|---" * (5 + len(TOOLS)) + "|")
    for r in records:
        reason = next(
            (
                x["reason"] or "; ".join(x["differs"][:1])
                for x in r["results"]
                if x["tool"] == "deepstack-patch"
            ),
            r.get("failed", ""),
        )
        lines.append(
            f"| {r['next']} | {r['sha'][:12]} | {pr_of(r['subject'])} | {r['kind']} | "
            + " | ".join(_verdict(r, t) + _after(r, t) for t in TOOLS)
            + f" | {reason.replace('|', '/')[:160]} |"
        )
    paired = [
        f"{pr_of(r['subject'])} after {x['partner']} on {r['prev']} "
        f"({x['tool']}: {x['verdict']})"
        for r in records
        for x in r["results"]
        if x.get("partner")
    ]
    if paired:
        lines += [
            "",
            "Judged after a partner in one series (each tool applies the "
            "partner first with itself), its own changes compared on the "
            "partner's write: " + "; ".join(paired) + ".",
        ]
    unmapped = sum(len(p["unmapped"]) for p in pairs)
    blocks = sum(p["blocks"] for p in pairs)
    lines += [
        "",
        f"Release differences: {blocks} blocks in "
        f"{sum(p['files'] for p in pairs)} files "
        f"of vllm/**.py; {unmapped} blocks mapped to no commit.",
    ]
    wrong = [
        f"- {pr_of(r['subject'])} on {r['prev']}, {x['tool']} ({x['verdict']}): "
        + "; ".join(x["wrong"][:3])
        for r in records
        for x in r["results"]
        if x["wrong"]
    ]
    lines += [
        "",
        "Writes the corpus judge's checks find wrong:",
        "",
        *(wrong or ["none"]),
    ]
    return "\n".join(lines) + "\n"


def _after(record: dict, tool: str) -> str:
    """`` (after vllm#N)`` where the tool's result was judged after a partner."""
    partner = next(
        (r.get("partner", "") for r in record.get("results", []) if r["tool"] == tool),
        "",
    )
    return f" (after {partner.split(' ')[0]})" if partner else ""


def _verdict(record: dict, tool: str) -> str:
    if "failed" in record:
        return "failed"
    return next(r["verdict"] for r in record["results"] if r["tool"] == tool)


# -- main -------------------------------------------------------------------------


def earlier_in_pair(pairs: list[dict], commit: dict) -> list[dict]:
    """The mapped commits of the commit's release pair before it on main."""
    for pair in pairs:
        if (pair["prev"], pair["next"]) == (commit["prev"], commit["next"]):
            shas = [c["sha"] for c in pair["commits"]]
            return pair["commits"][: shas.index(commit["sha"])]
    return []


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--series",
        action="append",
        default=[],
        help="only this minor series (repeatable), e.g. 0.20",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="commits judged at once (default 1)"
    )
    parser.add_argument(
        "--tool",
        help="the deepstack-patch executable, or a python that has it "
        "(default: this python)",
    )
    parser.add_argument(
        "--map",
        action="store_true",
        help="map the releases' differences to main commits again "
        "and rewrite bench/backports.toml",
    )
    parser.add_argument(
        "--repo",
        type=Path,
        default=None,
        help="the mirror (default: the first known one here)",
    )
    parser.add_argument(
        "--work", type=Path, default=WORK, help=f"the work folder (default: {WORK})"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="only this commit (a sha prefix; repeatable)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    return parser.parse_args()


def main() -> None:
    args = options()
    started = time.monotonic()
    if not runtime_checks.ty_available():
        sys.exit("error: ty is not installed; the judge's type check needs it")
    repo = args.repo or derive_corpus.default_repo()
    data = load_data()
    wanted = series_pairs(data, args.series)
    versions = sorted({v for pair in wanted for v in pair}, key=Version)
    trees = derive_corpus.release_trees(versions, args.work)
    if args.map:
        write_data(data, [map_pair(repo, data, *pair, trees) for pair in wanted])
        data = load_data()
    pairs = [p for p in data.get("pairs", []) if (p["prev"], p["next"]) in wanted]
    if missing := sorted(set(wanted) - {(p["prev"], p["next"]) for p in pairs}):
        sys.exit(f"error: no mapping for {missing} in {DATA.name}; run with --map")
    commits = [
        {**c, "prev": p["prev"], "next": p["next"]}
        for p in pairs
        for c in p["commits"]
        if not args.only or any(c["sha"].startswith(s) for s in args.only)
    ]
    run = args.work / "run"
    shutil.rmtree(run, ignore_errors=True)
    (run / "derived").mkdir(parents=True)
    command = tool_command(args.tool)
    say(
        f"judging {len(commits)} commits with {' '.join(command)} "
        f"({args.jobs} at a time)"
    )
    # A commit may be judged after a partner: one of its pair, earlier on
    # main, selected or not.
    jobs = [(c, repo, trees, command, run, earlier_in_pair(pairs, c)) for c in commits]
    records = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for record in pool.map(judge_commit, jobs):
            records.append(record)
            say(
                f"  {len(records)}/{len(commits)} {record['sha'][:12]} "
                + " ".join(f"{t}={_verdict(record, t)}" for t in TOOLS)
            )
    minutes = (time.monotonic() - started) / 60
    text = table(pairs, records) + (
        f"\n{len(records)} commits in {minutes:.1f} min with --jobs {args.jobs}; "
        f"the tool: {' '.join(command)}; the bench at {derive_corpus.tool_commit()}.\n"
    )
    document = {"pairs": pairs, "commits": records}
    (run / "cells.json").write_text(json.dumps(document, indent=1) + "\n")
    (run / "table.md").write_text(text)
    print(json.dumps(document, indent=1) if args.format == "json" else text)


if __name__ == "__main__":
    main()

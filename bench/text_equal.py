"""Is a derived patch's write the text ``git apply`` writes? (issue 34 item 3)

    python bench/text_equal.py [--repo MIRROR] [--work DIR] [--jobs 2]
                               [--only SHA ...] [--limit N]

Every commit of bench/derive_corpus.toml, and the cases the issue names, is
derived from the mirror (``derive --commit SHA --base-version V``, a
subprocess), then run (``apply --dry-run --format json``, in this process)
on its base release and on 0.20.2. A cell where ``git apply`` applies the
commit's diff (restricted to the patch's files) and the patch writes is
counted as ``text`` (every file the same text as ``git apply``'s), ``ast``
(the same code, other text) or ``other`` (other code). The derive's own
round trip on the commit's parent (``text`` or ``ast``) is counted too.
Prints the table and each cell whose text differs, with its first lines of
difference.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_judge  # noqa: E402
import derive_corpus  # noqa: E402

MIRROR = Path("/work/.mirror/jsboige+vllm/repo")
WORK = Path.home() / ".cache" / "deepstack-patch-bench" / "text-equal"
#: The cases of issue 34 item 3 (sha, the day it was committed).
CASES = [
    ("9a48eef89a777fc7039d9765fb2f6fc618216948", "2026-07-12"),
    ("f7ef489e93cf92b8d6ce7403b49f1db867bcc35e", "2026-08-07"),
    ("0b6aa3c47ce69a1f3c8a19cafe3b9dc2871d1f6b", "2026-07-28"),
    ("e2bdc24612ab0b7bf7a1bc67c955fd244e8660c4", "2026-06-24"),
    ("6ea6c4265938df98e8797254c591be4d9fc04158", "2026-08-12"),
]
ALSO = "0.20.2"


def commits(data: dict) -> list[dict]:
    listed = [dict(c) for c in data["commits"]]
    for sha, day in CASES:
        base = derive_corpus.base_version(day, data["release_dates"])
        listed.append({"sha": sha, "date": day, "base_version": base})
    return listed


def derive(commit: dict, repo: Path, run: Path) -> dict:
    """Derive one commit, as a user would; its outcome and round trip."""
    out = run / "derived" / commit["sha"][:12]
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "derive", "--commit",
         commit["sha"], "--repo", str(repo), "--base-version",
         commit["base_version"], "--out", str(out), "--format", "json"],
        capture_output=True, text=True, env=derive_corpus.GIT_ENV,
    )  # fmt: skip
    record = {"sha": commit["sha"], "folder": str(out), "exit": result.returncode}
    if result.returncode == 0:
        document = json.loads(result.stdout)
        record.update(outcome="derived", round_trip=document["round_trip"])
    elif result.returncode == 2 and "Traceback" not in result.stderr:
        message = derive_corpus._error_message(result.stdout, result.stderr)
        record.update(outcome="refused", reason=derive_corpus.refusal_class(message))
        record["error"] = message
    else:
        record.update(outcome="traceback", error=result.stderr[-2000:])
    return record


def cell(args: tuple) -> dict:
    commit, release, tree, folder, scratch = args
    document, exit_code, crashed = corpus_judge._dry_run(tree, folder, commit.patch_id)
    result = {"sha": commit.sha[:10], "id": commit.patch_id, "release": release}
    if crashed:
        return {**result, "verdict": "traceback", "detail": crashed}
    state = next(
        (p["state"] for p in document.get("patches", []) if p["id"] == commit.patch_id),
        "error",
    )
    result["state"] = state
    diff = document.get("diff", "") if exit_code == 0 else ""
    with tempfile.TemporaryDirectory(dir=scratch) as work:
        git = corpus_judge._copy_files(tree, commit.paths, Path(work) / "git")
        ours = corpus_judge._copy_files(tree, commit.paths, Path(work) / "ours")
        applies = corpus_judge._git_apply(git, commit.diff, "--check")
        if not applies:
            return {**result, "verdict": "git-fails"}
        corpus_judge._git_apply(git, commit.diff)
        if not diff:
            return {**result, "verdict": "not-written"}
        if not corpus_judge._git_apply(ours, diff):
            return {**result, "verdict": "other", "detail": "own diff fails"}
        verdict, details = "text", []
        for path in commit.paths:
            mine = _read(ours / path)
            theirs = _read(git / path)
            if mine == theirs:
                continue
            if corpus_judge._code_of(mine) != corpus_judge._code_of(theirs):
                verdict = "other"
            elif verdict == "text":
                verdict = "ast"
            lines = difflib.unified_diff(
                theirs.splitlines(keepends=True),
                mine.splitlines(keepends=True),
                f"git/{path}",
                f"ours/{path}",
                n=1,
            )
            details.append("".join(list(lines)[:40]))
    return {**result, "verdict": verdict, "detail": "\n".join(details)}


def _read(file: Path) -> str:
    return file.read_text(encoding="utf-8") if file.is_file() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=MIRROR)
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument(
        "--all-releases",
        action="store_true",
        help="also the corpus' releases (bench/derive_corpus.toml)",
    )
    options = parser.parse_args()
    data = tomllib.loads(derive_corpus.DATA.read_text())
    chosen = commits(data)
    if options.only:
        chosen = [
            c for c in chosen if any(c["sha"].startswith(s) for s in options.only)
        ]
    chosen = chosen[: options.limit or None]
    run = options.work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    extra = data["rule"]["releases"] if options.all_releases else []
    versions = sorted({c["base_version"] for c in chosen} | {ALSO, *extra})
    trees = derive_corpus.release_trees(versions, options.work)
    records = []
    with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        for record in pool.map(lambda c: derive(c, options.repo, run), chosen):
            records.append(record)
            derive_corpus.say(
                f"  {len(records)}/{len(chosen)} {record['sha'][:10]} "
                f"{record['outcome']} {record.get('reason', '')}"
            )
    by_sha = {c["sha"]: c for c in chosen}
    jobs = []
    for record in records:
        if record["outcome"] != "derived":
            continue
        commit = derive_corpus.commit_for_judge(record, options.repo)
        base = by_sha[record["sha"]]["base_version"]
        for version in dict.fromkeys([base, ALSO, *extra]):
            jobs.append((commit, version, trees[version], Path(record["folder"]), run))
    cells = []
    with concurrent.futures.ProcessPoolExecutor(options.jobs) as pool:
        for found in pool.map(cell, jobs):
            cells.append(found)
    (run / "cells.json").write_text(json.dumps(cells, indent=1))
    (run / "derive.json").write_text(json.dumps(records, indent=1))
    outcomes = Counter(r["outcome"] for r in records)
    trips = Counter(r.get("round_trip") for r in records if r["outcome"] == "derived")
    print(
        "round trip on the parent: " + ", ".join(f"{k} {v}" for k, v in trips.items())
    )
    print(
        f"commits {len(records)}: " + ", ".join(f"{k} {v}" for k, v in outcomes.items())
    )
    for name, mine in (
        ("base", [c for c, j in zip(cells, jobs, strict=True) if _base_is(j, by_sha)]),
        ("0.20.2", [c for c in cells if c["release"] == ALSO]),
        ("all", cells),
    ):
        counts = Counter(c["verdict"] for c in mine)
        written = counts["text"] + counts["ast"] + counts["other"]
        print(
            f"{name}: cells {len(mine)}, git applies and written {written}: "
            f"text {counts['text']}, ast {counts['ast']}, other {counts['other']}; "
            f"not written {counts['not-written']}, git fails {counts['git-fails']}, "
            f"traceback {counts['traceback']}"
        )
    for record in records:
        if record["outcome"] != "derived":
            error = record.get("error", "")[:300]
            print(f"- {record['sha'][:10]} {record['outcome']}: {error}")
    for found in cells:
        if found["verdict"] in ("ast", "other", "traceback"):
            where = f"{found['id']} ({found['sha']}) on {found['release']}"
            print(f"\n## {where}: {found['verdict']}")
            print(found.get("detail", ""))


def _base_is(job: tuple, by_sha: dict) -> bool:
    return by_sha[job[0].sha]["base_version"] == job[1]


if __name__ == "__main__":
    main()

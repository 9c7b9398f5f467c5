"""``derive --commit`` on a corpus of real upstream bug fixes, each derived
patch judged on real releases against ``git apply``.

    python bench/derive_corpus.py [--repo MIRROR] [--work DIR] [--jobs 2]
                                  [--limit N] [--select]

The commits are listed in bench/derive_corpus.toml, with the rule that chose
them (``--select`` applies the rule to the clone again and rewrites the
list): every 11th first-parent, non-merge commit of the clone's ``main``
(oldest first, starting with the first) committed from 2025-10-01 to
2026-04-30 whose subject starts with ``[Bugfix]`` and ends with ``(#N)``,
and that changes 2 to 120 lines of ``vllm/**.py`` (added plus removed; a
commit whose objects the clone lacks is left out). The clone is a fork of
vLLM that carries upstream's history (local-inference-lab/vllm, bare, no
tags), so each commit is derived with ``--base-version``: the last release
whose sdist was uploaded to PyPI on or before the commit's day (the upload
days are in the data file).

Each commit is derived as a user would (``derive --commit SHA --repo MIRROR
--base-version V --format json``, a subprocess): derived, refused (the
error's class), or a traceback (an exit other than 0 and 2, or "Traceback"
on stderr). Each derived patch then runs on the releases of the data file
(``apply --dry-run --patches DIR --only ID --format json``, the command
line run in this process, one worker process per job) on extractions of
their ``vllm/**.py`` kept in the work folder, and each cell is judged by
bench/corpus_judge.py against ``git apply`` of the commit's diff of the
patch's files.

The release tarballs come through the tool's fetch cache (the network only
the first time). The work folder (default
``~/.cache/deepstack-patch-bench/derive-corpus``) keeps the extracted
releases between runs; each run rewrites ``run/`` in it: the derived patches,
``derive.json`` (one record per commit), ``cells.jsonl`` (one per cell) and
``table.md``, which is also printed. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_judge  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "derive_corpus.toml"
MIRROR = Path("/work/.mirror/local-inference-lab+vllm/repo")
WORK = Path.home() / ".cache" / "deepstack-patch-bench" / "derive-corpus"
# Every cell is recognised anew: the recognition cache is keyed on the tool's
# code and cannot go stale, but a measurement should not lean on it.
os.environ["DEEPSTACK_PATCH_NO_CACHE"] = "1"
GIT_ENV = {**os.environ, "GIT_NO_LAZY_FETCH": "1", "NO_COLOR": "1"}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env=GIT_ENV,
    ).stdout


# -- the corpus ---------------------------------------------------------------


def select(repo: Path, data: dict) -> list[dict]:
    """The rule of the module docstring, applied to the clone."""
    rule = data["rule"]
    log = git(
        repo, "log", "--first-parent", "--no-merges", "--reverse",
        f"--since={rule['since']}", f"--until={rule['until']}",
        "--format=%H %cs %s", rule["head"],
    )  # fmt: skip
    candidates = []
    for line in log.splitlines():
        sha, day, subject = line.split(" ", 2)
        if not re.match(r"\[Bugfix\]", subject) or not re.search(r"\(#\d+\)$", subject):
            continue
        try:
            numstat = git(repo, "diff", "--numstat", f"{sha}~1", sha, "--", "vllm/*.py")
        except subprocess.CalledProcessError:
            continue  # an object the clone lacks
        counts = [row.split("\t")[:2] for row in numstat.splitlines()]
        if any(a == "-" for a, _ in counts):
            continue  # a binary file under vllm/
        lines = sum(int(a) + int(d) for a, d in counts)
        if rule["min_lines"] <= lines <= rule["max_lines"]:
            candidates.append(
                {"sha": sha, "date": day, "subject": subject, "lines": lines}
            )
    chosen = candidates[:: rule["every"]]
    for commit in chosen:
        commit["base_version"] = base_version(commit["date"], data["release_dates"])
    every = rule["every"]
    say(f"{len(candidates)} commits follow the rule; every {every}th: {len(chosen)}")
    return chosen


def base_version(day: str, release_dates: dict[str, str]) -> str:
    from packaging.version import Version

    before = [v for v, uploaded in release_dates.items() if uploaded <= day]
    return max(before, key=Version)


def write_data(data: dict, commits: list[dict]) -> None:
    text = DATA.read_text().split("\n[[commits]]", 1)[0].rstrip() + "\n"
    for commit in commits:
        text += "\n[[commits]]\n" + "".join(
            f"{key} = {json.dumps(commit[key])}\n"
            for key in ("sha", "date", "base_version", "lines", "subject")
        )
    DATA.write_text(text)


# -- the releases ----------------------------------------------------------


def release_trees(versions: list[str], work: Path) -> dict[str, Path]:
    """Each release's ``vllm/**.py`` and PKG-INFO, extracted once."""
    from deepstack_patch.fetch.archives import extract_release
    from deepstack_patch.fetch.releases import release_archive

    trees = {}
    for version in versions:
        out = work / "releases" / version
        if not (out / "vllm" / "__init__.py").is_file():
            say(f"extracting vLLM {version} (vllm/**.py) into {out}")
        archive = release_archive(version, None, say)
        extract_release(archive, version, out, _python_of_vllm)
        trees[version] = out
    return trees


def _python_of_vllm(relpath: str) -> bool:
    return relpath == "PKG-INFO" or (
        relpath.startswith("vllm/") and relpath.endswith(".py")
    )


# -- derive -----------------------------------------------------------------


def derive(commit: dict, repo: Path, run: Path) -> dict:
    out = run / "derived" / commit["sha"][:12]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "derive", "--commit",
         commit["sha"], "--repo", str(repo), "--base-version",
         commit["base_version"], "--out", str(out), "--format", "json"],
        capture_output=True, text=True, env=GIT_ENV,
    )  # fmt: skip
    record = {
        "sha": commit["sha"],
        "subject": commit["subject"],
        "exit": result.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "folder": str(out),
    }
    crashed = result.returncode not in (0, 2) or "Traceback" in result.stderr
    if crashed:
        record["outcome"] = "traceback"
        record["error"] = result.stderr.strip().splitlines()[-1:]
    elif result.returncode == 0:
        document = json.loads(result.stdout)
        record["outcome"] = "derived"
        record["id"] = document["id"]
        record["units"] = len(document["units"])
    else:
        message = _error_message(result.stdout, result.stderr)
        record["outcome"] = "refused"
        record["error"] = message
        record["reason"] = refusal_class(message)
    return record


def _error_message(stdout: str, stderr: str) -> str:
    try:
        return json.loads(stdout)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return stderr.strip()


#: A refusal's class, by the first pattern its message matches.
REFUSALS = [
    (r"adds vllm/|deletes vllm/", "adds or deletes a vllm/ file"),
    (r"changes no Python code", "no Python code of vllm/ changes"),
    (r"a binary diff", "a binary file"),
    (r"renamed file|a rename", "a renamed file"),
    (r"does not parse", "its result does not parse"),
    (r"already taken", "the id is taken"),
    (r"is not found on the base", "self-check: a unit not found on the base"),
    (r"on the base .* is drifted", "self-check: drifted on the base"),
    (r"on the base .* is (applied|not-applicable)", "self-check: not needed on base"),
    (r"which the diff does not change", "self-check: matches elsewhere on the base"),
    (r"is not the diff's result", "self-check: the rewrite is not the diff's result"),
    (r"leaves .* unchanged", "self-check: the rewrite leaves a file unchanged"),
    (r"not recognised applied", "self-check: not applied after"),
    (r"second pass", "self-check: a second pass changes it"),
    (r"git failed|not UTF-8", "git could not read the commit"),
]


def refusal_class(message: str) -> str:
    for pattern, name in REFUSALS:
        if re.search(pattern, message, re.DOTALL):
            return name
    return "other: " + message.splitlines()[0][:70] if message else "other"


# -- the cells ---------------------------------------------------------------


def commit_for_judge(record: dict, repo: Path) -> corpus_judge.Commit:
    from deepstack_patch.engine.derived import load_derived

    folder = Path(record["folder"])
    patch = load_derived(next(folder.glob("*.toml")))
    paths = list(patch.paths)
    sha = record["sha"]
    texts: dict[str, dict[str, str]] = {"parent": {}, "commit": {}}
    for side, rev in (("parent", f"{sha}~1"), ("commit", sha)):
        for path in paths:
            with contextlib.suppress(subprocess.CalledProcessError):
                texts[side][path] = git(repo, "show", f"{rev}:{path}")
    diff = git(repo, "diff", "--no-renames", f"{sha}~1", sha, "--", *paths)
    return corpus_judge.Commit(
        sha, patch.id, paths, diff, texts["parent"], texts["commit"]
    )


def run_cell(args: tuple) -> dict:
    commit, release, tree, folder, scratch = args
    try:
        return corpus_judge.judge(commit, release, tree, folder, scratch).as_json()
    except Exception as exc:  # the judge's own failure: shown, never hidden
        cell = corpus_judge.Cell(commit.sha, commit.patch_id, release)
        cell.verdict, cell.reason = "judge-failed", f"{type(exc).__name__}: {exc}"
        return cell.as_json()


# -- the table --------------------------------------------------------------

COLUMNS = [
    ("written", "written"),
    ("same", "same AST as `git apply`"),
    ("beyond", "beyond `git apply`"),
    ("refused-where-git-applies", "refused where `git apply` applies"),
    ("wrong", "wrong"),
    ("applied-wrongly", "`applied` wrongly"),
    ("traceback", "traceback"),
]


def table(records: list[dict], cells: list[dict], releases: list[str]) -> str:
    outcomes = Counter(r["outcome"] for r in records)
    reasons = Counter(r["reason"] for r in records if r["outcome"] == "refused")
    lines = [
        "| commits | derived | refused | traceback |",
        "|---|---|---|---|",
        f"| {len(records)} | {outcomes['derived']} | {outcomes['refused']} | "
        f"{outcomes['traceback']} |",
        "",
        "| refused because | commits |",
        "|---|---|",
        *(f"| {reason} | {n} |" for reason, n in reasons.most_common()),
        "",
        "| release | cells | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 2) + "|",
    ]
    for release in [*releases, "all"]:
        mine = [c for c in cells if release in ("all", c["release"])]
        counts = Counter(c["verdict"] for c in mine)
        counts["written"] = (
            counts["same"]
            + counts["beyond"]
            + sum(1 for c in mine if c["verdict"] == "wrong" and c["written"])
        )
        row = [str(counts[key]) for key, _ in COLUMNS]
        name = f"**{release}**" if release == "all" else release
        lines.append(f"| {name} | {len(mine)} | " + " | ".join(row) + " |")
    states = Counter(c["state"] for c in cells)
    imports_only = Counter(c["verdict"] for c in cells if c.get("imports_only"))
    lines += [
        "",
        "Writes that change only imports (no code unit): "
        + (", ".join(f"{v} {n}" for v, n in imports_only.most_common()) or "none")
        + ".",
        "",
        "States of the derived patches over all cells: "
        + ", ".join(f"{state} {n}" for state, n in states.most_common())
        + ".",
    ]
    return "\n".join(lines) + "\n"


def wrong_lines(cells: list[dict]) -> list[str]:
    return [
        f"- {c['patch_id']} on {c['release']}: {c['verdict']}: "
        + "; ".join(c["wrong"] or [c["reason"]])
        for c in cells
        if c["verdict"] in ("wrong", "applied-wrongly", "traceback", "judge-failed")
    ]


# -- main -------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=MIRROR)
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--limit", type=int, default=0, help="the first N commits")
    parser.add_argument("--select", action="store_true", help="rewrite the list")
    options = parser.parse_args()
    started = time.monotonic()
    data = tomllib.loads(DATA.read_text())
    if options.select:
        write_data(data, select(options.repo, data))
        data = tomllib.loads(DATA.read_text())
    commits = data["commits"][: options.limit or None]
    releases = data["rule"]["releases"]
    trees = release_trees(releases, options.work)
    run = options.work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    say(f"deriving {len(commits)} commits ({options.jobs} at a time)")
    records = []
    with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        for record in pool.map(lambda c: derive(c, options.repo, run), commits):
            records.append(record)
            say(
                f"  {len(records)}/{len(commits)} {record['sha'][:12]} "
                f"{record['outcome']} {record.get('reason', '')}".rstrip()
            )
    (run / "derive.json").write_text(json.dumps(records, indent=1) + "\n")
    derived = [r for r in records if r["outcome"] == "derived"]
    jobs = [
        (commit_for_judge(r, options.repo), v, trees[v], Path(r["folder"]), run)
        for r in derived
        for v in releases
    ]
    say(f"judging {len(jobs)} cells: {len(derived)} patches x {len(releases)} releases")
    cells = []
    with concurrent.futures.ProcessPoolExecutor(options.jobs) as pool:
        for done, cell in enumerate(pool.map(run_cell, jobs, chunksize=4), 1):
            cells.append(cell)
            if done % 25 == 0 or done == len(jobs):
                say(f"  {done}/{len(jobs)} cells ({time.monotonic() - started:.0f} s)")
    with open(run / "cells.jsonl", "w") as file:
        file.writelines(json.dumps(c) + "\n" for c in cells)
    minutes = (time.monotonic() - started) / 60
    text = table(records, cells, releases)
    text += "\n" + "\n".join(wrong_lines(cells) or ["No cell is wrong."]) + "\n"
    text += f"\n{len(cells)} cells in {minutes:.1f} min with --jobs {options.jobs}.\n"
    (run / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

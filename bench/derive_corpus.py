"""``derive --commit`` on a corpus of real upstream bug fixes, each derived
patch judged on real releases against ``git apply`` and by checks of its own.

    python bench/derive_corpus.py [--repo MIRROR] [--work DIR] [--jobs 2]
                                  [--limit N] [--window NAME]
                                  [--releases V,V] [--select NAME]

Requirements beyond the tool's ``test`` extra: ty (``pip install ty``, the
type checker the judge runs; measured with 0.0.108), git, and the release
tarballs through the tool's fetch cache (the network only the first time).

The commits are listed in bench/derive_corpus.toml by windows of upstream
history, each with the rule that chose it (its header says the rule;
``--select NAME`` applies it to the clone again and rewrites that window's
list) and the releases its patches are judged on: 2025-10..2026-04 (63
commits, judged on 10 releases from 0.10.2 to 0.33.0) and 2026-05..2026-08
(62 commits, 8 releases from 0.18.0 to 0.33.0). The clone is a bare mirror
of a fork that carries upstream's history without its tags
(``--repo``; by default the first of MIRRORS that is here: jsboige/vllm's
has history to 2026-08-14, local-inference-lab/vllm's to 2026-05-24 and so
the first window only), so each commit is derived with ``--base-version``:
the last release whose sdist was uploaded to PyPI on or before the
commit's day (the upload days are in the data file).

Each commit is derived as a user would (``derive --commit SHA --repo MIRROR
--base-version V --format json``, a subprocess): derived, refused (the
error's class), or a traceback (an exit other than 0 and 2, or "Traceback"
on stderr). Each derived patch then runs on its window's releases
(``--releases`` keeps only some; ``--window`` only some windows)
(``apply --dry-run --patches DIR --only ID --format json``, the command
line run in this process, one worker process per job) on extractions of
their ``vllm/**.py`` kept in the work folder, and each cell is judged by
bench/corpus_judge.py: against ``git apply`` of the commit's diff of the
patch's files, and by its checks of what was written (ty's new errors,
undeclared ``envs`` names, attributes the release defines nowhere, text
kept).

The work folder (default ``~/.cache/deepstack-patch-bench/derive-corpus``)
keeps the extracted releases (and the attribute names each defines) between
runs; each run rewrites ``run/`` in it: the derived patches, ``derive.json``
(one record per commit), ``cells.jsonl`` (one per cell) and ``table.md``,
which is also printed. Progress goes to stderr.
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

from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_judge  # noqa: E402
import runtime_checks  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "derive_corpus.toml"
#: Bare mirrors of forks that carry upstream vLLM's history (the first one
#: to 2026-08-14, the second to 2026-05-24; the same upstream shas).
MIRRORS = (
    Path("/work/.mirror/jsboige+vllm/repo"),
    Path("/work/.mirror/local-inference-lab+vllm/repo"),
)
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

#: The window keys written before its commits, in this order.
WINDOW_KEYS = (
    "name", "clone", "heads", "heads_note", "since", "until", "every",
    "offset", "held_out", "min_lines", "max_lines", "candidates", "note",
    "releases",
)  # fmt: skip
COMMIT_KEYS = ("sha", "date", "base_version", "lines", "subject")


def default_repo() -> Path:
    """The first of the known mirrors that is here (the first by default)."""
    return next((m for m in MIRRORS if m.is_dir()), MIRRORS[0])


def select(
    repo: Path,
    window: dict,
    release_dates: dict[str, str],
    elsewhere: frozenset[str] = frozenset(),
) -> list[dict]:
    """The rule of the data file's header, applied to the clone: committer
    days are compared as text, so a bare date means the whole day (git's
    ``--since`` would read it at the run's time of day). ``elsewhere``: the
    commits of the other windows, which a ``held_out`` window leaves out."""
    head = next((h for h in window["heads"] if _has(repo, h)), None)
    if head is None:
        sys.exit(f"error: {repo} has none of the window's heads {window['heads']}")
    log = git(
        repo, "log", "--first-parent", "--no-merges", "--reverse",
        "--format=%H %cs %s", head,
    )  # fmt: skip
    candidates = []
    for line in log.splitlines():
        sha, day, subject = line.split(" ", 2)
        if not window["since"] <= day < window["until"]:
            continue
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
        if window.get("held_out") and sha in elsewhere:
            continue  # chosen by another window: never seen here
        if window["min_lines"] <= lines <= window["max_lines"]:
            candidates.append(
                {"sha": sha, "date": day, "subject": subject, "lines": lines}
            )
    chosen = candidates[window.get("offset", 0) :: window["every"]]
    for commit in chosen:
        commit["base_version"] = base_version(commit["date"], release_dates)
    window["candidates"] = len(candidates)
    every = window["every"]
    say(f"{len(candidates)} commits follow the rule; every {every}th: {len(chosen)}")
    return chosen


def _has(repo: Path, commit: str) -> bool:
    result = subprocess.run(
        ["git", "--git-dir", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        env=GIT_ENV,
    )
    return result.returncode == 0


def base_version(day: str, release_dates: dict[str, str]) -> str:
    before = [v for v, uploaded in release_dates.items() if uploaded <= day]
    return max(before, key=Version)


def write_data(data: dict) -> None:
    """The data file again: its header as it is, then every window."""
    text = DATA.read_text().split("\n[[windows]]", 1)[0].rstrip() + "\n"
    for window in data["windows"]:
        text += "\n[[windows]]\n" + "".join(
            f"{key} = {json.dumps(window[key])}\n"
            for key in WINDOW_KEYS
            if key in window
        )
        for commit in window["commits"]:
            text += "\n[[windows.commits]]\n" + "".join(
                f"{key} = {json.dumps(commit[key])}\n" for key in COMMIT_KEYS
            )
    DATA.write_text(text)


# -- the releases ----------------------------------------------------------


def release_trees(versions: list[str], work: Path) -> dict[str, Path]:
    """Each release's ``vllm/**.py`` (and ``.pyi``), PKG-INFO and
    pyproject.toml, extracted once: with pyproject.toml the tree is whole, as
    a user's extraction is, so the engine's runtime-name checks run there."""
    from deepstack_patch.fetch.archives import extract_release
    from deepstack_patch.fetch.releases import release_archive

    trees = {}
    for version in versions:
        out = work / "trees" / version
        if not (out / "vllm" / "__init__.py").is_file():
            say(f"extracting vLLM {version} (vllm/**.py) into {out}")
        archive = release_archive(version, None, say)
        extract_release(archive, version, out, _python_of_vllm)
        trees[version] = out
    return trees


def _python_of_vllm(relpath: str) -> bool:
    return relpath in ("PKG-INFO", "pyproject.toml") or (
        relpath.startswith("vllm/") and relpath.endswith((".py", ".pyi"))
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
        "window": commit["window"],
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
    commit, release, tree, folder, scratch, window = args
    try:
        cell = corpus_judge.judge(commit, release, tree, folder, scratch)
    except Exception as exc:  # the judge's own failure: shown, never hidden
        cell = corpus_judge.Cell(commit.sha, commit.patch_id, release)
        cell.verdict, cell.reason = "judge-failed", f"{type(exc).__name__}: {exc}"
    return {**cell.as_json(), "window": window}


# -- the table --------------------------------------------------------------

COLUMNS = [
    ("written", "written"),
    ("same", "same text as `git apply`"),
    ("same-ast", "same AST, other text"),
    ("beyond", "beyond `git apply`"),
    ("refused-where-git-applies", "refused where `git apply` applies"),
    ("wrong", "wrong"),
    ("applied-wrongly", "`applied` wrongly"),
    ("traceback", "traceback"),
]
#: The checks of a write (bench/corpus_judge.py), in the table's order.
CHECKS = ["ast", "text", "beyond", "types", "envs", "attributes"]
WRITTEN = ("same", "same-ast", "beyond")


def table(windows: list[dict], records: list[dict], cells: list[dict]) -> str:
    reasons = Counter(r["reason"] for r in records if r["outcome"] == "refused")
    lines = ["| window | commits | derived | refused | traceback |", "|---" * 5 + "|"]
    for name, mine in _by_window(windows, records):
        outcomes = Counter(r["outcome"] for r in mine)
        lines.append(
            f"| {name} | {len(mine)} | {outcomes['derived']} | "
            f"{outcomes['refused']} | {outcomes['traceback']} |"
        )
    lines += ["", "| refused because | commits |", "|---|---|"]
    lines += [f"| {reason} | {n} |" for reason, n in reasons.most_common()]
    for window in windows:
        mine = [c for c in cells if c["window"] == window["name"]]
        lines += ["", f"Window {window['name']}:", "", *_release_table(window, mine)]
    lines += ["", *_check_table(windows, cells), "", *_notes(cells)]
    return "\n".join(lines) + "\n"


def _by_window(windows: list[dict], rows: list[dict]) -> list[tuple[str, list]]:
    named = [
        (window["name"], [r for r in rows if r["window"] == window["name"]])
        for window in windows
    ]
    return [*named, ("**all**", rows)]


def _release_table(window: dict, cells: list[dict]) -> list[str]:
    lines = [
        "| release | cells | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 2) + "|",
    ]
    releases = [v for v in window["releases"] if any(c["release"] == v for c in cells)]
    for release in [*releases, "all"]:
        mine = [c for c in cells if release in ("all", c["release"])]
        counts = Counter(c["verdict"] for c in mine)
        counts["written"] = sum(
            1 for c in mine if c["verdict"] in WRITTEN or (c["written"] and c["wrong"])
        )
        row = [str(counts[key]) for key, _ in COLUMNS]
        name = f"**{release}**" if release == "all" else release
        lines.append(f"| {name} | {len(mine)} | " + " | ".join(row) + " |")
    return lines


def _check_table(windows: list[dict], cells: list[dict]) -> list[str]:
    """Each check: the written cells it found wrong, of those it judged."""
    lines = [
        "| window | written cells | "
        + " | ".join(f"`{check}` wrong" for check in CHECKS)
        + " |",
        "|---" * (len(CHECKS) + 2) + "|",
    ]
    for name, mine in _by_window(windows, cells):
        written = [c for c in mine if c["written"]]
        row = []
        for check in CHECKS:
            verdicts = Counter(c["checks"].get(check) for c in written)
            judged = verdicts["ok"] + verdicts["wrong"]
            not_run = f" ({verdicts['not-run']} not run)" if verdicts["not-run"] else ""
            row.append(f"{verdicts['wrong']} of {judged}{not_run}")
        lines.append(f"| {name} | {len(written)} | " + " | ".join(row) + " |")
    return lines


def _notes(cells: list[dict]) -> list[str]:
    states = Counter(c["state"] for c in cells)
    imports_only = Counter(c["verdict"] for c in cells if c.get("imports_only"))
    external = sorted({line for c in cells for line in c.get("external", [])})
    return [
        "Writes that change only imports (no code unit): "
        + (", ".join(f"{v} {n}" for v, n in imports_only.most_common()) or "none")
        + ".",
        "",
        "Attribute names written cells newly read that the release defines "
        "nowhere but reads elsewhere (from outside vllm; not counted wrong): "
        + ("; ".join(external) or "none")
        + ".",
        "",
        "States of the derived patches over all cells: "
        + ", ".join(f"{state} {n}" for state, n in states.most_common())
        + ".",
    ]


def wrong_lines(cells: list[dict]) -> list[str]:
    return [
        f"- {c['patch_id']} on {c['release']}: {c['verdict']}: "
        + "; ".join(c["wrong"] or [c["reason"]])
        for c in cells
        if c["verdict"] in ("wrong", "applied-wrongly", "traceback", "judge-failed")
    ]


def git_broken_lines(cells: list[dict]) -> list[str]:
    return [
        f"- {c['patch_id']} on {c['release']}: " + ", ".join(c["git_broken"])
        for c in cells
        if c.get("git_broken")
    ]


def text_lines(cells: list[dict]) -> list[str]:
    return [
        f"- {c['patch_id']} on {c['release']}: " + "; ".join(c["text_differs"])
        for c in cells
        if c.get("text_differs")
    ]


# -- main -------------------------------------------------------------------


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repo", type=Path, default=None, help="default: the first known mirror here"
    )
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--limit", type=int, default=0, help="the first N commits of each window"
    )
    parser.add_argument(
        "--window", action="append", default=[], help="only this window (repeatable)"
    )
    parser.add_argument(
        "--releases", default="", help="only these releases, comma-separated"
    )
    parser.add_argument(
        "--select", metavar="WINDOW", help="rewrite this window's list from the clone"
    )
    return parser.parse_args()


def chosen_windows(data: dict, names: list[str], releases: str) -> list[dict]:
    """The windows to run, each with the releases to judge it on."""
    known = [w["name"] for w in data["windows"]]
    if unknown := sorted(set(names) - set(known)):
        sys.exit(f"error: no window {', '.join(unknown)}; the windows: {known}")
    wanted = {v for v in releases.split(",") if v}
    everywhere = {v for w in data["windows"] for v in w["releases"]}
    if unknown := sorted(wanted - everywhere):
        sys.exit(f"error: no window judges on {', '.join(unknown)}")
    windows = []
    for window in data["windows"]:
        if names and window["name"] not in names:
            continue
        kept = [v for v in window["releases"] if not wanted or v in wanted]
        windows.append({**window, "releases": kept})
    return windows


def main() -> None:
    args = options()
    started = time.monotonic()
    if not runtime_checks.ty_available():
        sys.exit("error: ty is not installed; the judge's type check needs it")
    repo = args.repo or default_repo()
    data = tomllib.loads(DATA.read_text())
    if args.select:
        (window,) = [w for w in data["windows"] if w["name"] == args.select]
        elsewhere = frozenset(
            c["sha"] for w in data["windows"] if w is not window for c in w["commits"]
        )
        window["commits"] = select(repo, window, data["release_dates"], elsewhere)
        write_data(data)
        data = tomllib.loads(DATA.read_text())
    windows = chosen_windows(data, args.window, args.releases)
    commits = [
        {**commit, "window": w["name"]}
        for w in windows
        for commit in w["commits"][: args.limit or None]
    ]
    versions = sorted({v for w in windows for v in w["releases"]}, key=Version)
    trees = release_trees(versions, args.work)
    run = args.work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    say(f"deriving {len(commits)} commits from {repo} ({args.jobs} at a time)")
    records = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for record in pool.map(lambda c: derive(c, repo, run), commits):
            records.append(record)
            say(
                f"  {len(records)}/{len(commits)} {record['sha'][:12]} "
                f"{record['outcome']} {record.get('reason', '')}".rstrip()
            )
    (run / "derive.json").write_text(json.dumps(records, indent=1) + "\n")
    releases_of = {w["name"]: w["releases"] for w in windows}
    jobs = [
        (commit_for_judge(r, repo), v, trees[v], Path(r["folder"]), run, r["window"])
        for r in records
        if r["outcome"] == "derived"
        for v in releases_of[r["window"]]
    ]
    say(f"judging {len(jobs)} cells")
    cells = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for done, cell in enumerate(pool.map(run_cell, jobs, chunksize=4), 1):
            cells.append(cell)
            if done % 25 == 0 or done == len(jobs):
                say(f"  {done}/{len(jobs)} cells ({time.monotonic() - started:.0f} s)")
    with open(run / "cells.jsonl", "w") as file:
        file.writelines(json.dumps(c) + "\n" for c in cells)
    minutes = (time.monotonic() - started) / 60
    text = table(windows, records, cells)
    text += "\n" + "\n".join(wrong_lines(cells) or ["No cell is wrong."]) + "\n"
    text += (
        "\nWhere `git apply`'s own result gains an undefined name and the "
        "write does not (judged as beyond):\n\n"
    )
    text += "\n".join(git_broken_lines(cells) or ["none"]) + "\n"
    text += "\nText not kept (same AST as `git apply`, other text):\n\n"
    text += "\n".join(text_lines(cells) or ["none"]) + "\n"
    text += (
        f"\n{len(cells)} cells in {minutes:.1f} min with --jobs {args.jobs}; "
        f"the tool at {tool_commit()}; ty {ty_version()}; releases: "
        + "; ".join(f"{w['name']}: {', '.join(w['releases'])}" for w in windows)
        + ".\n"
    )
    (run / "table.md").write_text(text)
    print(text)


def tool_commit() -> str:
    result = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
    )
    dirty = subprocess.run(
        ["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    commit = result.stdout.strip() or "an unknown commit"
    return f"{commit} with uncommitted changes" if dirty else commit


def ty_version() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ty", "--version"], capture_output=True, text=True
    )
    return result.stdout.strip().removeprefix("ty ")


if __name__ == "__main__":
    main()

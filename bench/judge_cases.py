"""Named commits derived and judged on one release, as bench/derive_corpus.py
judges a corpus cell: the judge's checks on the cases an issue names.

    python bench/judge_cases.py [--repo MIRROR] [--release 0.20.2] SHA...

Each commit is derived with ``derive --commit SHA --base-version RELEASE``
(its fix carried onto that release, as a user who pins it would), then
applied with ``apply --dry-run`` on the release's ``vllm/**.py`` (the
corpus's work folder) and judged by bench/corpus_judge.py. One line per
commit: the state, the verdict, each check's verdict and what is wrong.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import derive_corpus  # noqa: E402
import runtime_checks  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--release", default="0.20.2")
    parser.add_argument("--work", type=Path, default=derive_corpus.WORK)
    parser.add_argument("commits", nargs="+")
    args = parser.parse_args()
    if not runtime_checks.ty_available():
        sys.exit("error: ty is not installed; the judge's type check needs it")
    repo = args.repo or derive_corpus.default_repo()
    tree = derive_corpus.release_trees([args.release], args.work)[args.release]
    run = args.work / "cases"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    for commit in args.commits:
        sha = derive_corpus.git(repo, "rev-parse", commit).strip()
        subject = derive_corpus.git(repo, "log", "-1", "--format=%s", sha).strip()
        record = derive_corpus.derive(
            {"sha": sha, "subject": subject, "base_version": args.release,
             "window": "cases"},
            repo, run,
        )  # fmt: skip
        if record["outcome"] != "derived":
            print(f"{sha[:10]} {record['outcome']}: {record.get('error')}")
            continue
        judged = derive_corpus.commit_for_judge(record, repo)
        cell = derive_corpus.run_cell(
            (judged, args.release, tree, Path(record["folder"]), run, "cases")
        )
        checks = ", ".join(f"{name} {v}" for name, v in cell["checks"].items())
        print(
            f"{sha[:10]} {cell['patch_id']}: {cell['state']}, {cell['verdict']}"
            f" ({checks})" + "".join(f"\n  {line}" for line in cell["wrong"])
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cold-process wall times of the commands pipelines run, against targets.

    python bench/speed.py [--release 0.20.2] [--runs 5] [--no-matrix] [--verify]

Every figure is the median of ``--runs`` fresh processes (the first process
of each kind also runs, untimed, to warm the OS file cache): ``status``; a
full ``apply`` on a fresh hard-link copy of the release each run; a no-op
``apply`` on the patched copy; and beside them ``git apply --check`` of the
tool's own ``apply --dry-run`` diff on the pristine tree, as ratios. Then
``matrix`` over every release in targets.toml if the command exists, else the
sum of per-release ``status`` times. The release comes from the tool's cache
(downloaded through the package index on first use).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TOOL = [sys.executable, "-m", "deepstack_patch"]
TARGETS = {"status": 0.25, "apply": 1.0, "no-op apply": 0.25, "matrix": 10.0}


def timed(command: list[str], ok: tuple[int, ...] = (0,)) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in ok:
        sys.exit(
            f"{' '.join(command)} exited {done.returncode}:\n"
            + done.stderr.decode(errors="replace")
        )
    return elapsed


def median_of(runs: int, measure: Callable[[], float]) -> float:
    measure()  # warm the OS file cache; not counted
    return statistics.median(measure() for _ in range(runs))


def link_copy(source: Path, destination: Path) -> Path:
    # The tool replaces files and never writes into them, so hard links to
    # the pristine extraction are safe and make a fresh tree in milliseconds.
    shutil.copytree(source, destination, copy_function=os.link, symlinks=True)
    return destination


def release_tree(version: str, work: Path) -> Path:
    from deepstack_patch.fetch.releases import fetch_release

    return fetch_release(version, work / f"vllm-{version}").root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="0.20.2")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-matrix", action="store_true")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also time verify --against-pristine on the patched release",
    )
    options = parser.parse_args()
    runs = max(options.runs, 1)

    with tempfile.TemporaryDirectory(prefix="deepstack-bench-") as scratch:
        work = Path(scratch)
        pristine = release_tree(options.release, work)
        rows: list[tuple[str, float, str]] = []

        status = median_of(
            runs, lambda: timed([*TOOL, "status", "--vllm-src", str(pristine)])
        )
        rows.append(("status", status, ""))

        copies = iter(range(10_000))

        def full_apply() -> float:
            tree = link_copy(pristine, work / f"copy{next(copies)}")
            return timed([*TOOL, "apply", "--vllm-src", str(tree)])

        rows.append(("apply", median_of(runs, full_apply), ""))

        applied = link_copy(pristine, work / "applied")
        timed([*TOOL, "apply", "--vllm-src", str(applied)])
        noop = median_of(
            runs, lambda: timed([*TOOL, "apply", "--vllm-src", str(applied)])
        )
        rows.append(("no-op apply", noop, ""))

        diff = subprocess.run(
            [*TOOL, "apply", "--vllm-src", str(pristine), "--dry-run"],
            capture_output=True,
            check=True,
        ).stdout
        patch_file = work / "fixes.diff"
        patch_file.write_bytes(diff)
        git_check = median_of(
            runs,
            lambda: timed(
                ["git", "-C", str(pristine), "apply", "--check", str(patch_file)]
            ),
        )
        check = median_of(
            runs,
            lambda: timed(
                [*TOOL, "apply", "--vllm-src", str(pristine), "--check"], ok=(0, 1)
            ),
        )
        rows.append(("apply --check", check, ""))
        rows.append(("git apply --check", git_check, "(same diff)"))

        if not options.no_matrix:
            rows.append(matrix_row(work, runs))

        print(f"vLLM {options.release}, {os.cpu_count()} CPUs, median of {runs} runs")
        print(f"{'command':22} {'seconds':>8} {'target':>7} {'vs git':>7}")
        for name, seconds, note in rows:
            target = TARGETS.get(name.split(" (")[0])
            verdict = "" if target is None else f"{target:7.2f}"
            ratio = f"{seconds / git_check:6.1f}x"
            mark = "  over" if target is not None and seconds > target else ""
            print(f"{name:22} {seconds:8.3f} {verdict:>7} {ratio:>7} {note}{mark}")

        if options.verify:
            verify_section(options.release, pristine, work, runs)


def matrix_row(work: Path, runs: int) -> tuple[str, float, str]:
    from deepstack_patch.cli import main as cli
    from deepstack_patch.engine.targets import load_targets

    if "matrix" in getattr(cli, "commands", {}):
        seconds = median_of(runs, lambda: timed([*TOOL, "matrix"], ok=(0, 1)))
        return ("matrix", seconds, f"({len(load_targets().releases)} releases)")
    releases = load_targets().releases
    trees = [release_tree(v, work) for v in releases]
    total = sum(
        median_of(runs, lambda t=t: timed([*TOOL, "status", "--vllm-src", str(t)]))
        for t in trees
    )
    return ("matrix (status sum)", total, f"({len(releases)} releases)")


#: verify --against-pristine on a patched release, seconds (issue 13).
VERIFY_TARGET = 15.0


def verify_section(version: str, pristine: Path, work: Path, runs: int) -> None:
    """``verify --against-pristine`` on a patched copy: wall times, load, stages.

    The first run (untimed) builds the proof environment if it is missing and
    fills the code cache, as any verify after the first does. Each run is
    three torch processes on the CPU, so the load average is printed beside.
    """
    import json

    tree = link_copy(pristine, work / "verify-patched")
    timed([*TOOL, "apply", "--vllm-src", str(tree)])
    command = [*TOOL, "verify", "--vllm-src", str(tree), "--against-pristine"]
    stages: list[dict[str, float]] = []

    def one_run() -> float:
        start = time.perf_counter()
        done = subprocess.run([*command, "--format", "json"], capture_output=True)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"verify exited {done.returncode}:\n{done.stderr.decode()}")
        document = json.loads(done.stdout)
        patches = document["patches"]
        stages.append(
            {
                "proofs": sum((p["proof"] or {}).get("seconds", 0) for p in patches),
                "pristine proofs": sum(
                    (p["pristine_proof"] or {}).get("seconds", 0) for p in patches
                ),
                "tree tests": document["tree_tests"]["seconds"],
            }
        )
        return elapsed

    loads = [os.getloadavg()]
    seconds = median_of(runs, one_run)
    loads.append(os.getloadavg())
    mark = "  over" if seconds > VERIFY_TARGET else ""
    print(f"\nverify --against-pristine (vLLM {version}, patched), {runs} runs")
    print(f"{'median seconds':22} {seconds:8.3f} {VERIFY_TARGET:7.2f}{mark}")
    for stage in stages[0]:
        figure = statistics.median(s[stage] for s in stages[1:] or stages)
        print(f"  {stage:20} {figure:8.1f} s (inside the run, in parallel)")
    before, after = (" ".join(f"{x:.2f}" for x in load) for load in loads)
    print(f"  load average before {before}, after {after}")


if __name__ == "__main__":
    main()

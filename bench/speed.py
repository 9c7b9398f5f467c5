"""Cold-process wall times of the commands pipelines run, as ratios to a floor.

    python bench/speed.py [--release 0.20.0 --release 0.20.2] [--runs 5]
                          [--all-releases] [--no-releases] [--no-matrix]
                          [--no-import] [--no-wheel] [--verify] [--derived]
                          [--batch]

The floor is measured in the same run, on the same files: a fresh Python
process that reads and ``ast.parse``s the files the series parses in that
release (every file a patch's marker bytes appear in). Each round runs every
command once, in turn, each right after a run of the floor; after one
untimed round that warms the OS file cache, a command's ratio is the median
over ``--runs`` rounds of its time over the floor run just before it. On a
shared host the same cold process can take 1.5x as long from one run to the
next, and the ratio of a floor median and a command median, taken apart,
can pair a fast floor with a slow command; it is printed beside, as
"medians", for comparison with earlier rounds. Per release:

- ``status``, ``apply --check`` and a no-op ``apply`` (on a patched copy),
  each as users run it (the recognition cache holds the release's files
  after the untimed round) and with ``DEEPSTACK_PATCH_NO_CACHE=1`` (every
  file parsed): target at most 2.5x the floor;
- a full ``apply`` on a fresh hard-link copy of the pristine release each
  round: target at most 8x the floor;
- with ``--derived``, the same commands (``status`` also uncached) with a
  derived patch from a ``--patches`` folder in the series, in place of the
  built-in vllm#40917 (``--skip vllm#40917``): ``local#40917``, derived in
  the run from the diff of Granite4Vision's ``forward`` between the cached
  0.20.2 and 0.21.0 (as tests/support/upstream_diff.py cuts it); same
  targets, same floor (its file is one the series parses anyway).

With ``--batch``, ``status`` with 40 derived patches (bench/speed_batch.toml:
real fixes 0.20.2 lacks, derived in the run with ``derive --commit`` from
the upstream mirror into one ``--patches`` folder, kept in the bench's cache
folder) on the full 0.20.2 tree: first run (a fresh cache folder each
time) and after an edit to a file no patch reads (a function appended to
``vllm/benchmarks/latency.py``, outside every patch's import closure, a new
one each round, the cache warm), each against one direct ``ty check`` of
the patches' files (the floor, target at most 4x); warm (the cache holds
every verdict) against a process that reads and parses those files
(target at most 3x).

``--all-releases`` measures the first three on every release in targets.toml
instead, on copies of the partial extractions ``matrix`` keeps in the cache.
Then the command line's import (``python -X importtime -c "import
deepstack_patch.cli"``, three times ``--runs`` samples, target 60 ms, and the
wall time of ``deepstack-patch --version`` beside a bare ``python -c pass``)
and ``matrix`` over every release in targets.toml as users run it (target
1.5 s), and without the recognition cache beside the parse of every file that
run reads (no target: on 2 cores it cannot take less than half that parse);
``verify`` comes last (``--verify``, target 15 s). ``wheel --wheel`` on the
official 0.20.2 wheel (244 MB, 3,144 members; ``--no-wheel`` skips it) is
paired with a fresh process that copies the same file into the same folder,
its floor: target at most 15x. The load average is printed
beside every block: other processes on the machine make every wall time
slower, so CPU seconds (user + system, children included) are printed beside
them.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TOOL = [sys.executable, "-m", "deepstack_patch"]
SCRIPT = str(Path(sys.executable).with_name("deepstack-patch"))
FLOOR_CODE = (
    "import ast, sys\n"
    "for name in sys.argv[1:]:\n"
    "    with open(name, 'rb') as handle:\n"
    "        ast.parse(handle.read(), name)\n"
)
#: Targets as multiples of the floor.
RATIO_TARGETS = {"status": 2.5, "apply --check": 2.5, "no-op apply": 2.5, "apply": 8.0}
IMPORT_TARGET_MS = 60.0
MATRIX_TARGET_S = 1.5
#: ``wheel`` as a multiple of copying the wheel file in a fresh process.
WHEEL_TARGET = 15.0
WHEEL_RELEASE = "0.20.2"
COPY_CODE = "import shutil, sys\nshutil.copyfile(sys.argv[1], sys.argv[2])\n"


NO_CACHE = {**os.environ, "DEEPSTACK_PATCH_NO_CACHE": "1"}


#: CPU seconds (user + system) of the last timed process and its children:
#: beside wall times on a loaded machine, a bound on what an idle one shows.
LAST_CPU = [0.0]


def timed(
    command: list[str], ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None
) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, env=env)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU[0] = (after.ru_utime - before.ru_utime) + (
        after.ru_stime - before.ru_stime
    )
    if done.returncode not in ok:
        sys.exit(
            f"{' '.join(command)} exited {done.returncode}:\n"
            + done.stderr.decode(errors="replace")
        )
    return elapsed


def rounds(
    runs: int,
    measures: dict[str, Callable[[], float]],
    floor: Callable[[], float] | None = None,
) -> dict[str, float]:
    """Median of ``runs`` rounds of every measure, after one untimed round;
    also ``<name> cpu``, the median CPU seconds of the same processes.

    With ``floor``, the floor runs right before every measure, and
    ``<name> ratio`` (``<name> cpu ratio``) is the median of each measure's
    ratio to the floor run just before it; ``floor`` is then the median of
    all floor runs. On a shared host one cold process can take 1.5x another
    of the same work: the ratio of two medians taken apart can pair a fast
    floor with a slow command, while a ratio within a pair cannot.
    """
    samples: dict[str, list[float]] = {name: [] for name in measures}
    cpu: dict[str, list[float]] = {name: [] for name in measures}
    ratios: dict[str, list[float]] = {name: [] for name in measures}
    cpu_ratios: dict[str, list[float]] = {name: [] for name in measures}
    floors: list[float] = []
    floors_cpu: list[float] = []
    for index in range(runs + 1):
        names = list(measures)
        # Rotate the order so that no command always runs first in a round.
        names = names[index % len(names) :] + names[: index % len(names)]
        for name in names:
            if floor is not None:
                floor_seconds, floor_cpu = floor(), LAST_CPU[0]
            seconds = measures[name]()
            if index:
                samples[name].append(seconds)
                cpu[name].append(LAST_CPU[0])
                if floor is not None:
                    floors.append(floor_seconds)
                    floors_cpu.append(floor_cpu)
                    ratios[name].append(seconds / floor_seconds)
                    cpu_ratios[name].append(LAST_CPU[0] / floor_cpu)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    medians.update({f"{name} cpu": statistics.median(cpu[name]) for name in cpu})
    if floor is not None:
        medians["floor"] = statistics.median(floors)
        medians["floor cpu"] = statistics.median(floors_cpu)
        for name in measures:
            medians[f"{name} ratio"] = statistics.median(ratios[name])
            medians[f"{name} cpu ratio"] = statistics.median(cpu_ratios[name])
    return medians


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}"


def link_copy(source: Path, destination: Path) -> Path:
    # The tool replaces files and never writes into them, so hard links to
    # the pristine extraction are safe and make a fresh tree in milliseconds.
    shutil.copytree(source, destination, copy_function=os.link, symlinks=True)
    return destination


def parsed_files(root: Path) -> list[str]:
    """The files the series parses in ``root``: those holding a marker."""
    from deepstack_patch.engine.tree import VllmTree
    from deepstack_patch.patches import SERIES

    tree = VllmTree.open(root)
    found = set()
    for patch in SERIES:
        for relpath in tree.glob(patch.paths):
            raw = (tree.root / relpath).read_bytes()
            if any(marker in raw for marker in patch.markers):
                found.add(str(tree.root / relpath))
    return sorted(found)


def full_tree(version: str, work: Path) -> Path:
    from deepstack_patch.fetch.releases import fetch_release

    return fetch_release(version, work / f"vllm-{version}").root


def partial_tree(version: str) -> Path:
    """The cached extraction of what status reads (as ``matrix`` makes it)."""
    from deepstack_patch.distribution.matrix import status_tree
    from deepstack_patch.fetch.releases import (
        cached_release,
        download_release,
        find_release,
    )
    from deepstack_patch.patches import SERIES

    archive = cached_release(version) or download_release(find_release(version))
    patterns = [pattern for patch in SERIES for pattern in patch.paths]
    return status_tree(archive, version, patterns).root


GRANITE = "vllm/model_executor/models/granite4_vision.py"


def derived_folder(work: Path) -> Path:
    """A ``--patches`` folder holding ``local#40917``, derived from the diff of
    vllm#40917's change cut from the cached 0.20.2 and 0.21.0."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from deepstack_patch.authoring.derive import derive

    from tests.support.upstream_diff import upstream_diff

    diff = work / "40917.diff"
    forward = "Granite4VisionForConditionalGeneration.forward"
    diff.write_text(upstream_diff("0.20.2", "0.21.0", {GRANITE: ([forward], [])}))
    folder = work / "derived"
    derive(diff, patch_id="local#40917", out=folder, base_version="0.20.2")
    return folder


#: The 40-patch case (--batch): the commits, and where their patches are kept.
BATCH = Path(__file__).resolve().parent / "speed_batch.toml"
BATCH_CACHE = Path.home() / ".cache" / "deepstack-patch-bench" / "speed-batch"
#: Targets of the 40-patch case: first run and after an edit outside every
#: closure, as multiples of one ty run on the patches' files; warm, as a
#: multiple of reading and parsing them.
BATCH_TARGETS = {"status, first run": 4.0, "status, edit outside": 4.0}
BATCH_WARM_TARGET = 3.0
#: A file outside every import closure of the 40 patches' files on 0.20.2.
OUTSIDE = "vllm/benchmarks/latency.py"
TY_CODE = (
    "import os, subprocess, sys, tempfile\n"
    "from ty import find_ty_bin\n"
    "with tempfile.TemporaryDirectory() as work:\n"
    "    env = os.path.join(work, 'env', 'lib', 'python3.10', 'site-packages')\n"
    "    os.makedirs(env)\n"
    "    config = os.path.join(work, 'ty.toml')\n"
    "    open(config, 'w').close()\n"
    "    ty = os.fsdecode(find_ty_bin())\n"
    "    subprocess.run([ty, 'check', '--config-file', config,\n"
    "        '--python', os.path.join(work, 'env'), '--python-version', '3.10',\n"
    "        '--output-format', 'concise', '--no-progress', '--color', 'never',\n"
    "        *sys.argv[2:]], cwd=sys.argv[1], capture_output=True)\n"
)


def batch_folder() -> Path:
    """The --patches folder of the 40-patch case, derived once per list of
    commits and version of the tool's derive code and data file format (kept
    in BATCH_CACHE)."""
    import hashlib

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    data = tomllib.loads(BATCH.read_text())
    digest = hashlib.sha256(BATCH.read_bytes())
    import deepstack_patch

    code = Path(deepstack_patch.__file__).parent
    for file in sorted([*code.glob("authoring/*.py"), code / "engine/derived/data.py"]):
        digest.update(file.read_bytes())
    folder = BATCH_CACHE / digest.hexdigest()[:16]
    if folder.is_dir():
        return folder
    partial = folder.with_name(folder.name + f".{os.getpid()}")
    partial.mkdir(parents=True)
    for commit in data["commits"]:
        derive = [*TOOL, "derive", "--commit", commit["sha"], "--repo", data["mirror"]]
        timed([*derive, "--base-version", data["base_version"], "--out", str(partial)])
    partial.rename(folder)
    return folder


def measure_batch(work: Path, runs: int) -> bool:
    """``status`` with the 40 derived patches on the full 0.20.2 tree: first
    run, after an edit outside every closure, and warm (see the docstring);
    prints the figures, True if every target was met."""
    from deepstack_patch.engine.series import patches_from_folder

    folder = batch_folder()
    pristine = full_tree("0.20.2", work)
    files = sorted(
        {
            unit.path
            for patch in patches_from_folder(folder)
            for unit in patch.units
            if (pristine / unit.path).is_file()
        }
    )
    patches = ["--patches", str(folder)]
    ok = (0, 2)  # 2: a patch drifted
    fresh = iter(range(10_000))

    def first_run() -> float:
        cache = {
            **os.environ,
            "DEEPSTACK_PATCH_CACHE": str(work / f"cold{next(fresh)}"),
        }
        status = [*TOOL, "status", "--vllm-src", str(pristine), *patches]
        return timed(status, ok, cache)

    warm_cache = {**os.environ, "DEEPSTACK_PATCH_CACHE": str(work / "warm-cache")}
    edited = link_copy(pristine, work / "vllm-0.20.2-edited")
    outside = edited / OUTSIDE
    original = outside.read_bytes()

    def edit_outside() -> float:
        # A new file, never written through the hard link into the pristine one.
        outside.unlink()
        outside.write_bytes(
            original + f"\n\ndef spare{next(fresh)}():\n    return 1\n".encode()
        )
        return timed(
            [*TOOL, "status", "--vllm-src", str(edited), *patches], ok, warm_cache
        )

    def warm() -> float:
        return timed(
            [*TOOL, "status", "--vllm-src", str(pristine), *patches], ok, warm_cache
        )

    timed([*TOOL, "status", "--vllm-src", str(pristine), *patches], ok, warm_cache)
    ty_floor = lambda: timed([sys.executable, "-c", TY_CODE, str(pristine), *files])  # noqa: E731
    parse_floor = lambda: timed(  # noqa: E731
        [sys.executable, "-c", FLOOR_CODE, *(str(pristine / f) for f in files)]
    )
    typed = rounds(
        runs,
        {"status, first run": first_run, "status, edit outside": edit_outside},
        ty_floor,
    )
    parsed = rounds(runs, {"status, warm": warm}, parse_floor)
    print(
        f"\n40 derived patches on vLLM 0.20.2 ({len(files)} files, {load()}): "
        f"one ty check of them {typed['floor']:.3f} s wall, {typed['floor cpu']:.3f} s "
        f"CPU; reading and parsing them {parsed['floor']:.3f} s wall, "
        f"{parsed['floor cpu']:.3f} s CPU"
    )
    met = True
    for medians, targets, floor in (
        (typed, BATCH_TARGETS, "ty"),
        (parsed, {"status, warm": BATCH_WARM_TARGET}, "parse"),
    ):
        for name, target in targets.items():
            ratio = medians[f"{name} ratio"]
            met = met and ratio <= target
            cpu, cpu_ratio = medians[f"{name} cpu"], medians[f"{name} cpu ratio"]
            print(
                f"  {name:22} {medians[name]:7.3f} s wall, {cpu:6.3f} s CPU; "
                f"{ratio:5.2f}x {floor} ({cpu_ratio:5.2f}x CPU), "
                f"target {target:.0f}x  " + ("ok" if ratio <= target else "OVER")
            )
    return met


def measure_release(
    pristine: Path,
    work: Path,
    runs: int,
    full_apply: bool,
    derived: Path | None = None,
) -> dict[str, float]:
    """Floor and command medians on one release tree; with ``derived`` (a
    --patches folder), also the commands with its patch in the series."""
    files = parsed_files(pristine)
    applied = link_copy(pristine, work / f"{pristine.name}-applied")
    timed([*TOOL, "apply", "--vllm-src", str(applied)])
    copies = iter(range(10_000))

    def fresh_apply(*extra: str) -> float:
        tree = link_copy(pristine, work / f"{pristine.name}-copy{next(copies)}")
        seconds = timed([*TOOL, "apply", "--vllm-src", str(tree), *extra])
        shutil.rmtree(tree)
        return seconds

    commands = {
        "status": ([*TOOL, "status", "--vllm-src", str(pristine)], (0,)),
        "apply --check": (
            [*TOOL, "apply", "--check", "--vllm-src", str(pristine)],
            (0, 1),
        ),
        "no-op apply": ([*TOOL, "apply", "--vllm-src", str(applied)], (0,)),
    }
    measures: dict[str, Callable[[], float]] = {}
    for name, (command, ok) in commands.items():
        # As users run it (the recognition cache holds the release after the
        # untimed round), and with the cache off: every file parsed.
        measures[name] = lambda c=command, o=ok: timed(c, o)
        measures[f"{name}, no cache"] = lambda c=command, o=ok: timed(c, o, NO_CACHE)
    if full_apply:
        measures["apply"] = fresh_apply
    if derived is not None:
        with_derived = ["--patches", str(derived), "--skip", "vllm#40917"]
        applied_derived = link_copy(pristine, work / f"{pristine.name}-derived")
        timed([*TOOL, "apply", "--vllm-src", str(applied_derived), *with_derived])
        status = [*TOOL, "status", "--vllm-src", str(pristine), *with_derived]
        check = [*TOOL, "apply", "--check", "--vllm-src", str(pristine)]
        no_op = [*TOOL, "apply", "--vllm-src", str(applied_derived)]
        measures["status, derived"] = lambda: timed(status)
        measures["status, derived, no cache"] = lambda: timed(status, (0,), NO_CACHE)
        measures["apply --check, derived"] = lambda: timed(
            [*check, *with_derived], (0, 1)
        )
        measures["no-op apply, derived"] = lambda: timed([*no_op, *with_derived])
        if full_apply:
            measures["apply, derived"] = lambda: fresh_apply(*with_derived)
    medians = rounds(
        runs, measures, floor=lambda: timed([sys.executable, "-c", FLOOR_CODE, *files])
    )
    medians["files"] = len(files)
    return medians


def print_release(version: str, medians: dict[str, float], where: str) -> bool:
    floor, floor_cpu = medians["floor"], medians["floor cpu"]
    print(
        f"\nvLLM {version} ({where}): floor {floor:.3f} s wall, {floor_cpu:.3f} s "
        f"CPU ({int(medians['files'])} files read and parsed)"
    )
    print(
        f"  {'':26} {'median':>9}  {'x floor':>7} {'(CPU)':>7}  {'medians':>8}  target"
    )
    met = True
    for name, seconds in medians.items():
        target = RATIO_TARGETS.get(name.split(",")[0])
        if target is None or name.endswith((" cpu", " ratio")):
            continue
        ratio = medians[f"{name} ratio"]
        # The ratio of the two medians, for comparison with earlier rounds.
        apart = seconds / floor
        verdict = "ok" if ratio <= target else "OVER"
        met = met and ratio <= target
        print(
            f"  {name:26} {seconds:7.3f} s  {ratio:6.2f}x "
            f"({medians[f'{name} cpu ratio']:5.2f}x)  {apart:7.2f}x  "
            f"{target:5.1f}x  {verdict}"
        )
    return met


def import_figures(runs: int) -> bool:
    def cli_import_ms() -> float:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import deepstack_patch.cli"],
            capture_output=True,
            text=True,
            check=True,
        )
        match = re.search(r"\|\s*(\d+) \| deepstack_patch\.cli\s*$", done.stderr, re.M)
        assert match, "no import time for deepstack_patch.cli"
        return int(match.group(1)) / 1000

    # Three times the rounds: a sample takes a twentieth of a second, and on a
    # shared host one slow process moves a median of five by a third.
    medians = rounds(
        3 * runs,
        {
            "import": cli_import_ms,
            "version": lambda: timed([SCRIPT, "--version"]),
            "python": lambda: timed([sys.executable, "-c", "pass"]),
        },
    )
    met = medians["import"] <= IMPORT_TARGET_MS
    print(f"\ncommand line ({load()})")
    print(
        f"  import deepstack_patch.cli  {medians['import']:6.1f} ms "
        f"(-X importtime, target {IMPORT_TARGET_MS:.0f} ms)  "
        + ("ok" if met else "OVER")
    )
    print(
        f"  deepstack-patch --version  {medians['version'] * 1000:6.1f} ms wall "
        f"({medians['version cpu'] * 1000:.0f} ms CPU); bare python -c pass "
        f"{medians['python'] * 1000:.1f} ms ({medians['python cpu'] * 1000:.0f} ms CPU)"
    )
    return met


def matrix_figure(runs: int) -> bool:
    """``matrix`` as users run it (target 1.5 s), and with the cache off.

    Without the cache every marker file of every release is parsed; the
    parse alone is timed beside it (one process, CPU seconds) as that run's
    floor: on 2 cores no matrix can take less than half of it.
    """
    from deepstack_patch.engine.targets import load_targets

    releases = load_targets().releases
    files = [
        name for version in releases for name in parsed_files(partial_tree(version))
    ]
    timed([*TOOL, "matrix"], ok=(0, 1))  # fills the caches on a first run
    medians = rounds(
        runs,
        {
            "matrix": lambda: timed([*TOOL, "matrix"], ok=(0, 1)),
            "matrix, no cache": lambda: timed([*TOOL, "matrix"], (0, 1), NO_CACHE),
            "parse": lambda: timed([sys.executable, "-c", FLOOR_CODE, *files]),
        },
    )
    print(f"\nmatrix, {len(releases)} releases, {os.cpu_count()} CPUs ({load()})")
    seconds = medians["matrix"]
    met = seconds <= MATRIX_TARGET_S
    print(
        f"  {'matrix':24} {seconds:7.2f} s wall, {medians['matrix cpu']:5.2f} s CPU "
        f"(target {MATRIX_TARGET_S} s wall)  " + ("ok" if met else "OVER")
    )
    print(
        f"  {'matrix, no cache':24} {medians['matrix, no cache']:7.2f} s wall, "
        f"{medians['matrix, no cache cpu']:5.2f} s CPU (no target: parsing its "
        f"{len(files)} files alone takes {medians['parse cpu']:.2f} s CPU)"
    )
    return met


def wheel_figure(runs: int, work: Path) -> bool:
    """``wheel --wheel`` on the official wheel against a cold copy of it.

    The floor is a fresh Python process copying the wheel into the folder
    ``wheel`` writes to: reading and writing every byte once is the least a
    patched wheel costs. Both outputs are removed after each run, so every
    run writes a new file.
    """
    from deepstack_patch.fetch.wheels import cached_wheels, download_wheel, find_wheel

    found = cached_wheels(WHEEL_RELEASE)
    wheel = found[0] if found else download_wheel(find_wheel(WHEEL_RELEASE))
    out = work / "wheel-out"

    def fresh(command: list[str]) -> float:
        out.mkdir()
        seconds = timed(command)
        shutil.rmtree(out)
        return seconds

    medians = rounds(
        runs,
        {
            "wheel": lambda: fresh(
                [*TOOL, "wheel", "--wheel", str(wheel), "--out", str(out)]
            )
        },
        floor=lambda: fresh(
            [sys.executable, "-c", COPY_CODE, str(wheel), str(out / wheel.name)]
        ),
    )
    size = wheel.stat().st_size / 1e6
    print(f"\nwheel, vLLM {WHEEL_RELEASE} ({size:.0f} MB, {load()})")
    print(
        f"  cold copy (floor)        {medians['floor']:7.3f} s wall, "
        f"{medians['floor cpu']:.3f} s CPU"
    )
    ratio = medians["wheel ratio"]
    met = ratio <= WHEEL_TARGET
    print(
        f"  wheel                    {medians['wheel']:7.3f} s wall, "
        f"{medians['wheel cpu']:.3f} s CPU; {ratio:.2f}x floor "
        f"({medians['wheel cpu ratio']:.2f}x CPU, medians "
        f"{medians['wheel'] / medians['floor']:.2f}x), target {WHEEL_TARGET:.0f}x  "
        + ("ok" if met else "OVER")
    )
    return met


def compile_tool() -> None:
    """Byte-compile the tool's modules, as installing it with pip does.

    Without this the timings would depend on whether an earlier run happened
    to write ``__pycache__`` (``PYTHONDONTWRITEBYTECODE`` stops that).
    """
    import compileall

    import deepstack_patch
    import deepstack_patch.patches

    for package in (deepstack_patch, deepstack_patch.patches):
        compileall.compile_dir(Path(package.__file__).parent, quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", action="append", dest="releases")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--all-releases",
        action="store_true",
        help="status, apply --check and no-op apply on every release in "
        "targets.toml (partial extractions; no full apply)",
    )
    parser.add_argument("--no-matrix", action="store_true")
    parser.add_argument(
        "--no-releases",
        action="store_true",
        help="skip the per-release status/apply figures",
    )
    parser.add_argument(
        "--no-wheel",
        action="store_true",
        help=f"skip wheel on vLLM {WHEEL_RELEASE}'s official wheel (244 MB)",
    )
    parser.add_argument("--no-import", action="store_true")
    parser.add_argument(
        "--derived",
        action="store_true",
        help="also time the commands with a derived patch (local#40917, from "
        "a --patches folder) in the series, in place of vllm#40917",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="also time status with 40 derived patches on 0.20.2 "
        "(bench/speed_batch.toml), against ty and against a parse",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also time verify --against-pristine on the (first) patched release",
    )
    options = parser.parse_args()
    runs = max(options.runs, 1)
    met = True
    compile_tool()
    print(f"{os.cpu_count()} CPUs, median of {runs} cold runs ({load()})")

    with tempfile.TemporaryDirectory(prefix="deepstack-bench-") as scratch:
        work = Path(scratch)
        if options.all_releases and not options.no_releases:
            from deepstack_patch.engine.targets import load_targets

            for version in load_targets().releases:
                pristine = link_copy(partial_tree(version), work / f"vllm-{version}")
                where = f"partial extraction, {load()}"
                medians = measure_release(pristine, work, runs, full_apply=False)
                met = print_release(version, medians, where) and met
        elif not options.no_releases:
            derived = derived_folder(work) if options.derived else None
            for version in options.releases or ["0.20.0", "0.20.2"]:
                pristine = full_tree(version, work)
                medians = measure_release(
                    pristine, work, runs, full_apply=True, derived=derived
                )
                met = print_release(version, medians, f"full tree, {load()}") and met
        if options.batch:
            met = measure_batch(work, runs) and met
        # Before verify: its torch processes leave gigabytes for the kernel
        # to reclaim, which would slow the short runs measured after them.
        if not options.no_import:
            met = import_figures(runs) and met
        if not options.no_matrix:
            met = matrix_figure(runs) and met
        if not options.no_wheel:
            met = wheel_figure(runs, work) and met
        if options.verify:
            version = (options.releases or ["0.20.2"])[-1]
            tree = full_tree(version, work)
            met = verify_section(version, tree, work, runs) and met
    print("\nall targets met" if met else "\nsome targets not met")


#: verify --against-pristine on a patched release, seconds (issue 13).
VERIFY_TARGET = 15.0


def verify_section(version: str, pristine: Path, work: Path, runs: int) -> bool:
    """``verify --against-pristine`` on a patched copy: wall times, load, stages;
    True if the median met the target.

    The first run (untimed) builds the proof environment if it is missing,
    fills the code cache and teaches the fork server what to preload, as any
    verify after the first has them. Each run is a fork server and three jobs
    on the CPU, so the CPU seconds and the load average are printed beside.
    """
    import json

    tree = link_copy(pristine, work / "verify-patched")
    timed([*TOOL, "apply", "--vllm-src", str(tree)])
    command = [*TOOL, "verify", "--vllm-src", str(tree), "--against-pristine"]
    stages: list[dict[str, float]] = []

    cpu: list[float] = []

    def one_run() -> float:
        def children() -> float:
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            return usage.ru_utime + usage.ru_stime

        before = children()
        start = time.perf_counter()
        done = subprocess.run([*command, "--format", "json"], capture_output=True)
        elapsed = time.perf_counter() - start
        # verify and every process it waited for (fork server, jobs).
        cpu.append(children() - before)
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
    one_run()  # builds what is missing and fills the code cache; not counted
    seconds = statistics.median(one_run() for _ in range(runs))
    loads.append(os.getloadavg())
    mark = "  over" if seconds > VERIFY_TARGET else ""
    print(f"\nverify --against-pristine (vLLM {version}, patched), {runs} runs")
    print(f"{'median seconds':22} {seconds:8.3f} {VERIFY_TARGET:7.2f}{mark}")
    print(f"{'median CPU seconds':22} {statistics.median(cpu[1:] or cpu):8.3f}")
    for stage in stages[0]:
        figure = statistics.median(s[stage] for s in stages[1:] or stages)
        print(f"  {stage:20} {figure:8.1f} s (inside the run, in parallel)")
    before, after = (" ".join(f"{x:.2f}" for x in load) for load in loads)
    print(f"  load average before {before}, after {after}")
    return seconds <= VERIFY_TARGET


if __name__ == "__main__":
    main()

"""The release matrix: every patch's state on many releases, against targets.toml.

Each release is checked in its own process (fetch from the cache or the
index, extract to a temporary folder, plan, delete), so a vendor's matrix of
releases takes about the time of its slowest release per worker. With
``verify``, each release is also patched and verified (``proof.verify``).
The same matrix as a CI pipeline is ``pipelines.py``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import Patch
from deepstack_patch.engine.targets import Targets
from deepstack_patch.engine.tree import VllmTree, glob_regex


@dataclass
class ReleaseResult:
    """What one worker found on one release (plain data: it crosses processes)."""

    version: str
    states: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    error: str = ""
    #: With --verify: the verify command's exit code and its last lines.
    verify_code: int | None = None
    verify_output: str = ""
    seconds: float = 0.0


def check_release(
    version: str, series: Sequence[Patch], selected: Sequence[str], verify: bool
) -> ReleaseResult:
    """Status (and optionally apply + verify) of one pristine release.

    Runs in a worker process; every failure becomes ``error`` so one bad
    release never hides the others' results.
    """
    from deepstack_patch.engine.plan import plan_tree
    from deepstack_patch.engine.recognition_cache import RecognitionCache
    from deepstack_patch.engine.transaction import write_edits
    from deepstack_patch.fetch.releases import (
        cached_release,
        download_release,
        extract_release,
        find_release,
    )

    started = time.monotonic()
    result = ReleaseResult(version)
    work = Path(tempfile.mkdtemp(prefix=f"deepstack-matrix-{version}-"))
    try:
        patterns = status_patterns(series)
        tree = None if verify else _extracted_status_tree(version, patterns)
        if tree is None:
            archive = cached_release(version) or download_release(find_release(version))
        if verify:  # the tree's own tests run: it needs every file
            tree = extract_release(archive, version, work / f"vllm-{version}")
        elif tree is None:
            tree = status_tree(archive, version, patterns)
        cache = None if verify else RecognitionCache.for_series(series)
        plan = plan_tree(tree, series, set(selected), rewrite=verify, cache=cache)
        for report in plan.reports:
            result.states[report.patch.id] = report.state.value
            result.reasons[report.patch.id] = report.reason
        drifted = any(r.selected and r.state.value == "drifted" for r in plan.reports)
        if verify and not drifted:
            # The extraction is this worker's own throwaway copy: patch it in
            # place, then let verify judge the patched tree.
            write_edits(tree.root, plan.edits)
            result.verify_code, result.verify_output = verify_release_tree(
                tree, series, set(selected)
            )
    except DeepstackError as exc:
        result.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported per release, not raised
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.seconds = time.monotonic() - started
    return result


def verify_release_tree(
    tree: VllmTree, series: Sequence[Patch], selected: set[str]
) -> tuple[int, str]:
    """verify's exit code on a patched tree, and the last lines of its report."""
    import io

    from deepstack_patch.engine.targets import load_targets
    from deepstack_patch.output.plain import PlainConsole
    from deepstack_patch.output.tables import print_verify_report
    from deepstack_patch.proof.verify import EXIT_DRIFTED, verify

    try:
        report = verify(tree, series, selected, load_targets())
    except DeepstackError as exc:
        return EXIT_DRIFTED, f"error: {exc}"
    text = io.StringIO()
    print_verify_report(PlainConsole(text), report)
    return report.exit_code, "\n".join(text.getvalue().strip().splitlines()[-15:])


#: What version detection reads, besides the files the patches look at.
_ALWAYS_EXTRACTED = ("PKG-INFO", "vllm/__init__.py", "vllm/_version.py")


def status_patterns(series: Sequence[Patch]) -> list[str]:
    """What status reads of a tree for ``series``: the patches' files, and the
    other files their recognition reads (a derived patch's imported modules)."""
    return [
        pattern
        for patch in series
        for pattern in (*patch.paths, *getattr(patch, "also_reads", ()))
    ]


def status_tree(archive: Path, version: str, patterns: Sequence[str]) -> VllmTree:
    """A cached, read-only extraction of what status reads from ``archive``.

    Keyed by the archive and the patterns, so a changed series extracts
    anew; ``status`` never writes, so every later matrix run can share it.
    The extraction lists the patterns it was asked for: a file that matches
    one and is not there is not in the release (engine/tree.py).
    """
    from deepstack_patch.fetch.archives import extract_release

    # Only what status reads: the patches' files and the version metadata
    # (thousands of tests, kernels and docs are left in the archive).
    wanted = [glob_regex(p) for p in patterns]
    return extract_release(
        archive,
        version,
        _status_tree_root(archive, version, patterns),
        lambda relpath: (
            relpath in _ALWAYS_EXTRACTED or any(w.match(relpath) for w in wanted)
        ),
        asked_for=sorted({*_ALWAYS_EXTRACTED, *patterns}),
    )


def _status_tree_root(archive: Path, version: str, patterns: Sequence[str]) -> Path:
    import hashlib

    from deepstack_patch.engine.cache import cache_dir

    stat = archive.stat()
    key = hashlib.sha256(
        "\0".join(
            # "asked-for": an older extraction, without its list, is not reused.
            [
                "asked-for",
                archive.name,
                str(stat.st_size),
                str(stat.st_mtime_ns),
                *patterns,
            ]
        ).encode()
    ).hexdigest()[:16]
    return cache_dir() / "partial-trees" / f"vllm-{version}-{key}"


def _extracted_status_tree(version: str, patterns: Sequence[str]) -> VllmTree | None:
    """The status tree of a cached sdist, without hashing the sdist again.

    A status tree is extracted only from a verified sdist and is keyed by
    that file's size and modification time, so finding it for the file as it
    is now means the file was verified as it is; hashing 14 tarballs again
    took a quarter of a matrix run. An extraction is moved into place whole,
    so a tree that is there is complete.
    """
    from deepstack_patch.fetch.cache import cached_path

    archive = cached_path(version)
    stamp = archive.with_name(archive.name + ".sha256")
    if not (archive.is_file() and stamp.is_file()):
        return None
    root = _status_tree_root(archive, version, patterns)
    if not (root / "vllm" / "__init__.py").is_file():
        return None
    return VllmTree.open(root)


def run_matrix(
    releases: Sequence[str],
    series: Sequence[Patch],
    selected: Sequence[str],
    jobs: int,
    verify: bool,
    on_done: Callable[[ReleaseResult], None] | None = None,
) -> list[ReleaseResult]:
    """Check every release in parallel processes; results in ``releases`` order."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: dict[str, ReleaseResult] = {}
    import multiprocessing

    # spawn, not fork: the parent runs a progress-bar thread, and forking a
    # threaded process can deadlock the child.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=context,
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        # Newest first: releases are listed oldest first, and newer ones hold
        # several times the files; starting the long ones first keeps one
        # worker from finishing the last big release alone.
        futures = {
            pool.submit(
                check_release, version, list(series), list(selected), verify
            ): version
            for version in reversed(releases)
        }
        try:
            for future in as_completed(futures):
                result = future.result()
                results[result.version] = result
                if on_done:
                    on_done(result)
        except KeyboardInterrupt:
            # The workers ignore Ctrl-C (the parent reports it once); stop
            # them now rather than letting the pool wait for their releases.
            workers = list((getattr(pool, "_processes", None) or {}).values())
            for process in workers:
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [results[version] for version in releases]


def die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when the matrix process ends.

    A killed parent (SIGKILL, OOM) cannot stop its pool; without this the
    workers, and the resource tracker waiting for them, live on and hold
    the caller's output pipe open. Ctrl-C is the parent's to handle.
    """
    import ctypes
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


@dataclass(frozen=True)
class Difference:
    version: str
    patch_id: str
    found: str
    expected: str


def differences(
    results: Sequence[ReleaseResult], targets: Targets, patch_ids: Sequence[str]
) -> list[Difference]:
    """Every (release, patch) whose state is not targets.toml's expectation.

    A release that targets.toml lists must have a row for every patch (a
    missing row is a difference); other releases are checked where rows exist.
    """
    found: list[Difference] = []
    for result in results:
        if result.error:
            continue
        expected = targets.expected(result.version)
        listed = result.version in targets.releases
        for patch_id in patch_ids:
            state = result.states.get(patch_id, "")
            want = expected.get(patch_id)
            if want is None:
                if listed:
                    found.append(Difference(result.version, patch_id, state, "(none)"))
            elif state != want.value:
                found.append(Difference(result.version, patch_id, state, want.value))
    return found


def matrix_inputs(
    releases_file: Path | None, targets_file: Path | None
) -> tuple[Path, Targets, list[str]]:
    """The targets file, its expectations, and the releases to check."""
    from deepstack_patch.engine.targets import default_targets_path, load_targets

    targets_path = targets_file or default_targets_path()
    targets = load_targets(targets_path)
    releases = read_releases(releases_file) if releases_file else targets.releases
    if not releases:
        raise DeepstackError(
            f"{targets_path}: lists no releases", "add releases = [...] or --releases"
        )
    return targets_path, targets, list(releases)


def read_releases(path: Path) -> list[str]:
    """Releases from a file: one per line (``#`` comments), or TOML ``releases``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise DeepstackError(
            f"--releases {path}: cannot read: {exc.strerror}",
            "give a file with one vLLM version per line",
        ) from None
    if path.suffix == ".toml":
        from deepstack_patch.engine.targets import tomllib

        try:
            releases = list(tomllib.loads(text).get("releases", []))
        except tomllib.TOMLDecodeError as exc:
            raise DeepstackError(
                f"--releases {path}: {exc}",
                'fix the TOML: releases = ["0.20.2", "0.21.0"]',
            ) from None
    else:
        releases = [
            line.split("#", 1)[0].strip()
            for line in text.splitlines()
            if line.split("#", 1)[0].strip()
        ]
    if not releases:
        raise DeepstackError(
            f"--releases {path}: lists no release",
            "write one vLLM version per line, e.g. 0.20.2",
        )
    return releases


def matrix_json(
    results: Sequence[ReleaseResult],
    diffs: Sequence[Difference],
    targets_path: str,
    wall_seconds: float,
    series: Sequence[Patch] = (),
) -> dict[str, Any]:
    from deepstack_patch.output.documents import patch_state_json

    by_id = {patch.id: patch for patch in series}

    by_release: dict[str, list[str]] = {}
    for diff in diffs:
        by_release.setdefault(diff.version, []).append(diff.patch_id)
    return {
        "schema": 1,
        "command": "matrix",
        "targets": targets_path,
        "wall_seconds": round(wall_seconds, 2),
        "ok": not diffs
        and not any(r.error for r in results)
        and not any(r.verify_code for r in results),
        "differences": [diff.__dict__ for diff in diffs],
        "releases": [
            {
                "version": r.version,
                "states": r.states,
                "reasons": {k: v for k, v in r.reasons.items() if v},
                # each patch's state in the shape every document uses
                "patches": [
                    patch_state_json(by_id[pid], state, r.reasons.get(pid, ""))
                    for pid, state in r.states.items()
                    if pid in by_id
                ],
                "differs": by_release.get(r.version, []),
                "error": r.error,
                "verify_exit_code": r.verify_code,
                "seconds": round(r.seconds, 2),
            }
            for r in results
        ],
    }


@dataclass
class MatrixResult:
    """One matrix run: each release's result, what differs, and the wall time."""

    results: list[ReleaseResult]
    differences: list[Difference]
    wall_seconds: float
    #: Selected patches the targets file has no expectation for (a derived
    #: patch, a vendor's): their states are shown, never compared.
    uncompared: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """2 a release could not be checked; 1 a state differs or verify
        failed; 0 everything as targets.toml expects."""
        if any(r.error for r in self.results):
            return 2
        if self.differences or any(r.verify_code for r in self.results):
            return 1
        return 0


def check_matrix(
    releases: Sequence[str],
    series: Sequence[Patch],
    selected: set[str],
    targets: Targets,
    *,
    jobs: int,
    verify: bool,
    on_done: Callable[[ReleaseResult], None] | None = None,
) -> MatrixResult:
    """Check every release in parallel and compare with ``targets``."""
    started = time.monotonic()
    results = run_matrix(releases, series, sorted(selected), jobs, verify, on_done)
    # A patch from elsewhere (--patches, an entry point) is compared where the
    # targets file has a table for it (--targets FILE), else only shown.
    patch_ids = [
        patch.id
        for patch in series
        if patch.id in selected
        and (patch.origin == "built-in" or patch.id in targets.patches)
    ]
    diffs = differences(results, targets, patch_ids)
    uncompared = [p.id for p in series if p.id in selected and p.id not in patch_ids]
    return MatrixResult(results, diffs, time.monotonic() - started, uncompared)

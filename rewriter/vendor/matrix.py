"""The release matrix: every patch's state on many releases, against targets.toml.

Each release is checked in its own process (fetch from the cache or the
index, extract to a temporary folder, plan, delete), so a vendor's matrix of
releases takes about the time of its slowest release per worker. The same
matrix is also emitted as a CI pipeline that runs `backport` (and `verify`)
per release on separate CI workers.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.targets import Targets
from deepstack_patch.engine.tree import VllmTree


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


def check_release(version: str, selected: Sequence[str], verify: bool) -> ReleaseResult:
    """Status (and optionally apply + verify) of one pristine release.

    Runs in a worker process; every failure becomes ``error`` so one bad
    release never hides the others' results.
    """
    from deepstack_patch.engine.cache import RecognitionCache
    from deepstack_patch.engine.plan import plan_tree
    from deepstack_patch.engine.transaction import write_edits
    from deepstack_patch.fetch.releases import (
        cached_release,
        download_release,
        extract_release,
        find_release,
    )
    from deepstack_patch.patches import SERIES

    started = time.monotonic()
    result = ReleaseResult(version)
    work = Path(tempfile.mkdtemp(prefix=f"deepstack-matrix-{version}-"))
    try:
        patterns = [pattern for patch in SERIES for pattern in patch.paths]
        tree = None if verify else _extracted_status_tree(version, patterns)
        if tree is None:
            archive = cached_release(version) or download_release(find_release(version))
        if verify:  # the tree's own tests run: it needs every file
            tree = extract_release(archive, version, work / f"vllm-{version}")
        elif tree is None:
            tree = status_tree(archive, version, patterns)
        cache = None if verify else RecognitionCache.for_series(SERIES)
        plan = plan_tree(tree, SERIES, set(selected), rewrite=verify, cache=cache)
        for report in plan.reports:
            result.states[report.patch.id] = report.state.value
            result.reasons[report.patch.id] = report.reason
        drifted = any(r.selected and r.state.value == "drifted" for r in plan.reports)
        if verify and not drifted:
            # The extraction is this worker's own throwaway copy: patch it in
            # place, then let the verify command judge the patched tree.
            write_edits(tree.root, plan.edits)
            command = [
                sys.executable,
                "-m",
                "deepstack_patch",
                "verify",
                "--vllm-src",
                str(tree.root),
            ]
            for patch_id in selected:
                command += ["--only", patch_id]
            run = subprocess.run(command, capture_output=True, text=True)
            result.verify_code = run.returncode
            result.verify_output = "\n".join(
                (run.stdout + run.stderr).strip().splitlines()[-15:]
            )
    except DeepstackError as exc:
        result.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported per release, not raised
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.seconds = time.monotonic() - started
    return result


#: What version detection reads, besides the files the patches look at.
_ALWAYS_EXTRACTED = ("PKG-INFO", "vllm/__init__.py", "vllm/_version.py")


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A tree glob (``**`` spans folders, ``*`` does not) as a regex."""
    parts = []
    for piece in re.split(r"(\*\*/|\*|\?)", pattern):
        if piece == "**/":
            parts.append("(?:[^/]+/)*")
        elif piece == "*":
            parts.append("[^/]*")
        elif piece == "?":
            parts.append("[^/]")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts) + r"\Z")


def status_tree(archive: Path, version: str, patterns: Sequence[str]) -> VllmTree:
    """A cached, read-only extraction of what status reads from ``archive``.

    Keyed by the archive and the patterns, so a changed series extracts
    anew; ``status`` never writes, so every later matrix run can share it.
    """
    from filelock import FileLock

    root = _status_tree_root(archive, version, patterns)
    complete = root / ".complete"
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock", timeout=600):
        if not complete.is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            extract_matching(archive, root / f"vllm-{version}", patterns)
            complete.touch()
    return VllmTree.open(root / f"vllm-{version}")


def _status_tree_root(archive: Path, version: str, patterns: Sequence[str]) -> Path:
    import hashlib

    from deepstack_patch.fetch.releases import cache_dir

    stat = archive.stat()
    key = hashlib.sha256(
        "\0".join(
            [archive.name, str(stat.st_size), str(stat.st_mtime_ns), *patterns]
        ).encode()
    ).hexdigest()[:16]
    return cache_dir() / "status-trees" / f"vllm-{version}-{key}"


def _extracted_status_tree(version: str, patterns: Sequence[str]) -> VllmTree | None:
    """The complete status tree of a cached sdist, without hashing the sdist.

    A status tree is extracted only from a verified sdist and is keyed by
    that file's size and modification time, so finding it complete for the
    file as it is now means the file was verified as it is; hashing 14
    tarballs again took a quarter of a matrix run.
    """
    from deepstack_patch.fetch.releases import PROJECT, cache_dir

    archive = cache_dir() / "sdists" / f"{PROJECT}-{version}.tar.gz"
    stamp = archive.with_name(archive.name + ".sha256")
    if not (archive.is_file() and stamp.is_file()):
        return None
    root = _status_tree_root(archive, version, patterns)
    if not (root / ".complete").is_file():
        return None
    return VllmTree.open(root / f"vllm-{version}")


def extract_matching(archive: Path, out: Path, patterns: Sequence[str]) -> VllmTree:
    """Extract only the members status reads: the patches' files and metadata.

    A full vLLM sdist holds thousands of files (tests, kernels, docs); the
    plan reads a few hundred, so this is several times faster than a full
    extraction and gives the same states.
    """
    import tarfile

    wanted = [_glob_regex(p) for p in patterns]
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar:
            relpath = member.name.partition("/")[2]
            if not member.isfile():
                continue
            if relpath in _ALWAYS_EXTRACTED or any(w.match(relpath) for w in wanted):
                members.append(member)
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(out.parent / ".staging", members=members, **kwargs)
    tops = {m.name.partition("/")[0] for m in members}
    if len(tops) != 1:
        raise DeepstackError(
            f"{archive.name}: expected one top-level folder, found {len(tops)}",
            "the file is not a vLLM source release",
        )
    (out.parent / ".staging" / tops.pop()).rename(out)
    return VllmTree.open(out)


def run_matrix(
    releases: Sequence[str],
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
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {
            pool.submit(check_release, version, list(selected), verify): version
            for version in releases
        }
        for future in as_completed(futures):
            result = future.result()
            results[result.version] = result
            if on_done:
                on_done(result)
    return [results[version] for version in releases]


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
            raise DeepstackError(f"--releases {path}: {exc}") from None
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
) -> dict[str, Any]:
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
                "differs": by_release.get(r.version, []),
                "error": r.error,
                "verify_exit_code": r.verify_code,
                "seconds": round(r.seconds, 2),
            }
            for r in results
        ],
    }


# --- CI pipelines ----------------------------------------------------------

DEFAULT_INSTALL = "python -m pip install '.[verify,vendor]'"


def _release_commands(
    version: str, skip: Sequence[str], with_verify: bool, label: str = "deepstack.1"
) -> list[str]:
    """The shell commands one CI job runs for one release."""
    from deepstack_patch.vendor.sdist import local_version

    skips = "".join(f" --skip {shlex.quote(patch_id)}" for patch_id in skip)
    out = f"backport-{version}"
    commands = [
        f"deepstack-patch backport --release {version} --out {out} "
        f"--local-version {shlex.quote(label)}{skips}",
    ]
    if with_verify:
        tree = f"{out}/vllm-{local_version(version, label)}"
        commands.append(
            f"deepstack-patch verify --vllm-src {shlex.quote(tree)}{skips} "
            f"--junit-xml {out}/verify.xml"
        )
    return commands


def emit_pipeline(
    kind: str,
    releases: Sequence[str],
    targets: Targets,
    install: str,
    with_verify: bool,
) -> str:
    """A GitHub Actions workflow or a Buildkite pipeline, one job per release.

    Patches targets.toml expects drifted on a release are skipped in that
    release's job: a drifted patch makes backport refuse the whole release.
    """
    import yaml

    def skipped(version: str) -> list[str]:
        return sorted(
            patch_id
            for patch_id, state in targets.expected(version).items()
            if state.value == "drifted"
        )

    if kind == "github-actions":
        include = [
            {
                "release": version,
                "run": "\n".join(
                    _release_commands(version, skipped(version), with_verify)
                ),
            }
            for version in releases
        ]
        document: dict[str, Any] = {
            "name": "deepstack-patch backports",
            "on": {"workflow_dispatch": {}, "push": {"branches": ["main"]}},
            "jobs": {
                "backport": {
                    "name": "vLLM ${{ matrix.release }}",
                    "runs-on": "ubuntu-latest",
                    "timeout-minutes": 90,
                    "strategy": {"fail-fast": False, "matrix": {"include": include}},
                    "steps": [
                        {"uses": "actions/checkout@v4"},
                        {
                            "uses": "actions/setup-python@v5",
                            "with": {"python-version": "3.12"},
                        },
                        {
                            "name": "Cache release tarballs",
                            "uses": "actions/cache@v4",
                            "with": {
                                "path": "~/.cache/deepstack-patch",
                                "key": "deepstack-patch-${{ matrix.release }}",
                            },
                        },
                        {"name": "Install deepstack-patch", "run": install},
                        {
                            "name": "Backport" + (" and verify" if with_verify else ""),
                            "run": "${{ matrix.run }}",
                        },
                        {
                            "uses": "actions/upload-artifact@v4",
                            "if": "always()",
                            "with": {
                                "name": "vllm-${{ matrix.release }}-deepstack",
                                "path": "backport-${{ matrix.release }}/*.tar.gz\n"
                                "backport-${{ matrix.release }}/series/\n"
                                "backport-${{ matrix.release }}/report.json\n"
                                "backport-${{ matrix.release }}/verify.xml",
                            },
                        },
                    ],
                }
            },
        }
    elif kind == "buildkite":
        document = {
            "steps": [
                {
                    "group": ":package: deepstack-patch backports",
                    "key": "deepstack-backports",
                    "steps": [
                        {
                            "label": f":hammer: vLLM {version}",
                            "key": "backport-" + version.replace(".", "-"),
                            "commands": [
                                install,
                                *_release_commands(
                                    version, skipped(version), with_verify
                                ),
                            ],
                            "artifact_paths": [
                                f"backport-{version}/*.tar.gz",
                                f"backport-{version}/series/*",
                                f"backport-{version}/report.json",
                                f"backport-{version}/verify.xml",
                            ],
                            "timeout_in_minutes": 90,
                        }
                        for version in releases
                    ],
                }
            ]
        }
    else:  # click's Choice keeps this unreachable from the command line
        raise DeepstackError(f"--emit {kind}: unknown pipeline kind")
    header = (
        "# Generated by `deepstack-patch matrix --emit "
        f"{kind}`: one backport job per vLLM release.\n"
        "# Regenerate it rather than editing it by hand.\n"
    )
    return header + yaml.dump(
        document, Dumper=_pipeline_dumper(), sort_keys=False, width=100
    )


def _pipeline_dumper() -> type:
    import yaml

    class Dumper(yaml.SafeDumper):
        """Multi-line shell scripts as ``|`` blocks, as people write them."""

    def represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
        style = "|" if "\n" in text else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    Dumper.add_representer(str, represent_str)
    return Dumper


def verify_available() -> bool:
    """Whether this installation has the `verify` plumbing (issue: proofs)."""
    import importlib.util

    return importlib.util.find_spec("deepstack_patch.proof.verify") is not None


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2)

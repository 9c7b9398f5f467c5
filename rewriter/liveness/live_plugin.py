"""A check in every vLLM process that the fixes are live in its modules.

vLLM calls every ``vllm.general_plugins`` entry point in the API server, the
engine core and each worker (``vllm.plugins.load_general_plugins``), after
``import vllm`` and before the model's modules are imported. This one reads
the target files of the ``vllm`` package this process imported, recognises
each patch with its CPython ``ast`` recogniser (no LibCST, no plan: parsing
the handful of files that hold a target), checks that the bytecode the
interpreter would load for them is theirs, and logs one line through vLLM's
logger. ``bench/live_plugin.py`` measures its cost.

Environment:
``DEEPSTACK_PATCH_CHECK=0`` switches it off; ``DEEPSTACK_PATCH_REQUIRE=1``
makes a missing fix an error, so that the server does not start without its
fixes. ``VLLM_PLUGINS``, when set, is vLLM's allow-list of plugin names: list
``deepstack_patch_live`` in it, or this check does not run.
"""

from __future__ import annotations

import ast
import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deepstack_patch.liveness.change_record import ChangeRecord

CHECK_ENV = "DEEPSTACK_PATCH_CHECK"
REQUIRE_ENV = "DEEPSTACK_PATCH_REQUIRE"
PLUGIN_NAME = "deepstack_patch_live"


class FixesNotLive(RuntimeError):
    """Raised under ``DEEPSTACK_PATCH_REQUIRE=1`` when a needed fix is not live."""


@dataclass
class LiveState:
    root: Path
    live: list[str] = field(default_factory=list)
    #: patch id -> why it is not live
    missing: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def check_live() -> None:
    """The entry point vLLM calls; see the module docstring."""
    if os.environ.get(CHECK_ENV) == "0":
        return
    from vllm.logger import init_logger

    # Under "vllm.": vLLM configures handlers and levels for its own logger
    # tree only; a logger named after this module would drop INFO lines.
    logger = init_logger(f"vllm.plugins.{PLUGIN_NAME}")
    require = os.environ.get(REQUIRE_ENV) == "1"
    try:
        state = live_state()
    except Exception as exc:  # noqa: BLE001 - a check must not break serving
        message = f"deepstack-patch: could not check the fixes: {exc}"
        if require:
            raise FixesNotLive(message) from exc
        logger.warning(message)
        return
    message = summary(state)
    if state.missing:
        if require:
            raise FixesNotLive(message)
        logger.warning(message)
    else:
        logger.info(message)


def summary(state: LiveState) -> str:
    took = f"checked in {state.seconds * 1000:.0f} ms"
    if state.missing:
        missing = "; ".join(f"{i}: {why}" for i, why in state.missing.items())
        return (
            f"deepstack-patch: fixes NOT live in {state.root / 'vllm'}: {missing}. "
            f"Fix: deepstack-patch apply --installed (or apply --vllm-src "
            f"{state.root}), then deepstack-patch doctor ({took})"
        )
    live = ", ".join(state.live) or "none needed"
    skipped = (
        f"; skipped on purpose: {', '.join(state.skipped)}" if state.skipped else ""
    )
    return f"deepstack-patch: fixes live: {live}{skipped} ({took})"


def live_state(root: Path | None = None) -> LiveState:
    """The state of every patch in the vllm package this process imports.

    Three ways, cheapest first: the change record ``apply --installed`` left
    (the sha256 of the files it wrote), then the result of an earlier full
    check kept in the user cache while the target files and their folders are
    unchanged (same size and mtime), then the full check, which parses the
    target files (about 0.5 s for vLLM 0.20) and refreshes the cache.
    """
    from deepstack_patch import __version__

    started = time.perf_counter()
    if root is None:
        import vllm

        root = Path(vllm.__file__).parent.parent
    record = _record(root)
    state = None
    # A record of another tool version may predate a patch of this series.
    # It knows the built-in series only: patches of installed entry points
    # are checked in the files themselves.
    trusted = record is not None and record.tool_version == __version__
    trusted = trusted and all(p.origin == "built-in" for p in live_series())
    if trusted and not record.changed_since(root):
        state = LiveState(root, list(record.applied), {}, list(record.skipped))
        files = [f.path for f in record.files]
    if state is None:
        state, files = _cached_or_full(root, set(record.skipped) if record else set())
    _check_bytecode(state, files)
    state.seconds = time.perf_counter() - started
    return state


def _record(root: Path) -> ChangeRecord | None:
    from deepstack_patch.liveness.change_record import UnreadableRecord, read_record

    for dist_info in sorted(root.glob("vllm-*.dist-info")):
        try:
            record = read_record(dist_info)
        except UnreadableRecord:
            return None  # the full check decides; doctor names the bad record
        if record is not None:
            return record
    return None


def _check_bytecode(state: LiveState, files: list[str]) -> None:
    """A live fix whose module would load stale bytecode is not live."""
    from deepstack_patch.liveness.probe import STALE, bytecode_state

    stale = [
        pyc
        for relpath in files
        for pyc, verdict, _ in [bytecode_state(str(state.root / relpath), False)]
        if verdict == STALE
    ]
    if stale and state.live:
        for patch_id in state.live:
            state.missing[patch_id] = f"stale bytecode {', '.join(stale)}"
        state.live = []


def _cached_or_full(root: Path, skipped: set[str]) -> tuple[LiveState, list[str]]:
    import json

    from deepstack_patch import __version__

    cache = _cache_file(root)
    try:
        kept = json.loads(cache.read_text())
        if (
            kept["tool_version"] == __version__
            and kept["series"] == _series_key()
            and kept["signature"] == _signature(root, kept["files"], kept["folders"])
        ):
            state = LiveState(root, kept["live"], kept["missing"], kept["skipped"])
            return state, kept["files"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    state, files, folders = _full_check(root, skipped)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(
            json.dumps(
                {
                    "tool_version": __version__,
                    "series": _series_key(),
                    "files": files,
                    "folders": folders,
                    "signature": _signature(root, files, folders),
                    "live": state.live,
                    "missing": state.missing,
                    "skipped": state.skipped,
                }
            )
        )
        os.replace(partial, cache)
    except OSError:
        pass  # a read-only cache only costs the next process the full check
    return state, files


def _cache_file(root: Path) -> Path:
    import hashlib

    base = os.environ.get("DEEPSTACK_PATCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "deepstack-patch",
    )
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return Path(base) / "live" / f"{key}.json"


def _signature(root: Path, files: list[str], folders: list[str]) -> list:
    """Size and mtime of every target file and every folder searched: a file
    added, removed or replaced there changes one of them."""
    signature = []
    for relpath in [*files, *folders]:
        try:
            stat = os.stat(root / relpath)
            signature.append([relpath, stat.st_size, stat.st_mtime_ns])
        except OSError:
            signature.append([relpath, None, None])
    return signature


@functools.lru_cache(maxsize=1)
def live_series() -> tuple:
    """The built-in series and the patches of installed entry points (a
    ``--patches`` folder is not seen here: install it as an entry point)."""
    from deepstack_patch.engine.series import (
        assemble_series,
        patches_from_entry_points,
    )
    from deepstack_patch.patches import SERIES

    return assemble_series(SERIES, patches_from_entry_points())


def _series_key() -> list[str]:
    """What the cached result was computed for: each patch and its origin."""
    return [f"{patch.id} {patch.origin}" for patch in live_series()]


def _full_check(
    root: Path, skipped: set[str]
) -> tuple[LiveState, list[str], list[str]]:
    from deepstack_patch.engine.context import recognising_in
    from deepstack_patch.engine.plan import rewritten_bytes
    from deepstack_patch.engine.protocol import Location, PatchReport, PatchState

    state = LiveState(root)
    parsed: dict[str, ast.Module | None] = {}
    folders: set[str] = set()
    targets: set[str] = set()
    # A derived patch reads the modules its fix imports from.
    with recognising_in(root, rewrite=rewritten_bytes):
        for patch in live_series():
            report = PatchReport(patch=patch, selected=True)
            for relpath in _candidates(root, patch.paths, patch.markers, folders):
                if relpath not in parsed:
                    parsed[relpath] = _parse(root / relpath)
                tree = parsed[relpath]
                if tree is not None:
                    found = patch.recognise(tree, relpath)
                    report.locations.extend(Location(relpath, f) for f in found)
            targets.update(report.files)
            match report.state:
                case PatchState.NOT_APPLICABLE:
                    continue
                case PatchState.APPLIED:
                    state.live.append(patch.id)
                case _ if patch.id in skipped:
                    state.skipped.append(patch.id)
                case other:
                    state.missing[patch.id] = f"{other} in {', '.join(report.files)}"
    return state, sorted(targets), sorted(folders)


_read_cache: dict[Path, bytes] = {}


def _candidates(
    root: Path, patterns: tuple[str, ...], markers: tuple[bytes, ...], folders: set
):
    """Files matching ``patterns`` that hold a marker; ``folders`` collects
    every folder searched."""
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path not in _read_cache:
                try:
                    _read_cache[path] = path.read_bytes()
                except OSError:
                    continue
            folders.add(path.parent.relative_to(root).as_posix())
            if any(marker in _read_cache[path] for marker in markers):
                yield path.relative_to(root).as_posix()


def _parse(path: Path) -> ast.Module | None:
    from deepstack_patch.engine.errors import DeepstackError
    from deepstack_patch.engine.source import SourceFile

    try:  # as the engine parses a file: its comments can be read back
        return SourceFile(str(path), path.read_bytes()).ast
    except (OSError, DeepstackError, ValueError):
        return None

"""Write to an installed vLLM, and give it back, keeping the install true.

One transaction (``transaction.write_edits``) holds everything a run
changes: the rewritten modules, their bytecode (rebuilt, or removed), the
RECORD rows, the change record ``<dist-info>/deepstack_patch.json`` and the
original bytes under ``<dist-info>/deepstack_patch/orig/``. Either all of it
lands or none of it.
"""

from __future__ import annotations

import contextlib
import datetime
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch import __version__
from deepstack_patch.engine.bytecode import (
    BytecodeJob,
    BytecodeResult,
    bytecode_files,
    rebuild_bytecode,
)
from deepstack_patch.engine.errors import DeepstackError, reinstall_hint
from deepstack_patch.engine.installed import (
    ORIGINALS_DIR,
    RECORD_NAME,
    InstalledTree,
    InstalledVllm,
)
from deepstack_patch.engine.plan import FileEdit, Plan
from deepstack_patch.engine.record import (
    dump_change_record,
    load_change_record,
    require_rows,
    sha256_hex,
    updated_record,
)
from deepstack_patch.engine.transaction import ExtraChange, write_edits
from deepstack_patch.engine.tree import VllmTree


@dataclass
class Changes:
    """Everything one transaction on an install does."""

    edits: list[FileEdit] = field(default_factory=list)
    extra: list[ExtraChange] = field(default_factory=list)
    mtimes: dict[str, int] = field(default_factory=dict)

    def write(self, root: Path) -> list[str]:
        return write_edits(root, self.edits, self.extra, self.mtimes)


def write_plan_edits(tree: VllmTree, plan: Plan) -> list[str]:
    """Write a plan's edits to ``tree``: in place for an install, else plainly."""
    if isinstance(tree, InstalledTree) and tree.installed is not None:
        # Deselected on purpose (--skip, --only): doctor does not warn of them.
        skipped = [r.patch.id for r in plan.reports if not r.selected]
        return apply_in_place(tree.installed, plan.edits, skipped)
    return write_edits(tree.root, plan.edits)


def _rel(installed: InstalledVllm, path: Path) -> str:
    return path.relative_to(installed.site_packages).as_posix()


def _original(relpath: str) -> str:
    """Where a file's original bytes live, relative to the dist-info folder."""
    return f"{ORIGINALS_DIR}/{relpath}"


def apply_in_place(
    installed: InstalledVllm, edits: Sequence[FileEdit], skipped: list[str]
) -> list[str]:
    """Rewrite an install's modules and everything that must follow them.

    Returns the relative paths written (removed bytecode is in the record).
    """
    if not edits:
        return []  # a second apply is a no-op: the record stays as it was
    _refuse_whole_files(edits)
    root = installed.site_packages
    dist = _rel(installed, installed.dist_info)
    record_rel = f"{dist}/RECORD"
    record_raw = (installed.dist_info / "RECORD").read_bytes()
    require_rows(
        record_raw, [edit.relpath for edit in edits], record_rel, installed.version
    )
    document = load_change_record(installed.dist_info / RECORD_NAME)
    changes = Changes(edits=list(edits))
    new_files: dict[str, bytes | None] = {}
    if document is None:
        document = _new_record(installed, record_rel)
        _keep_original(changes, new_files, root, dist, record_rel, record_raw)
    earlier = {entry["path"]: entry for entry in document["files"]}
    stamp = int(time.time())
    for edit in edits:
        changes.mtimes[edit.relpath] = stamp * 1_000_000_000
        new_files[edit.relpath] = edit.new
        entry = earlier.get(edit.relpath)
        if entry is None:
            entry = _file_entry(root, edit)
            document["files"].append(entry)
            _keep_original(changes, new_files, root, dist, edit.relpath, edit.old)
        entry["sha256_after"] = sha256_hex(edit.new)
    jobs = _bytecode_jobs(root, edits, stamp)
    results = rebuild_bytecode(installed.python, jobs)
    for job, result in zip(jobs, results, strict=True):
        if result.new is not None:
            changes.edits.append(FileEdit(job.pyc, job.old, result.new))
        else:
            changes.extra.append(ExtraChange(job.pyc, None))
        new_files[job.pyc] = result.new
        recorded = {entry["path"] for entry in document["bytecode"]}
        # Bytecode written after an earlier run of this tool has no original
        # worth keeping: revert removes it.
        if job.pyc not in recorded and job.module not in earlier:
            document["bytecode"].append(_bytecode_entry(root, job.pyc, result))
            _keep_original(changes, new_files, root, dist, job.pyc, job.old)
    document["applied"] = sorted(
        set(document["applied"]) | {pid for edit in edits for pid in edit.patch_ids}
    )
    document["skipped"] = sorted(skipped)
    document["date"] = _now()
    document["tool_version"] = __version__
    content = dump_change_record(document)
    _put(changes, root, f"{dist}/{RECORD_NAME}", content, like=record_rel)
    new_files[f"{dist}/{RECORD_NAME}"] = content
    _list_earlier_files(installed, document, new_files)
    new_record = updated_record(record_raw, new_files, record_rel)
    changes.edits.append(FileEdit(record_rel, record_raw, new_record))
    return changes.write(root)


def _refuse_whole_files(edits: Sequence[FileEdit]) -> None:
    """A file a patch adds or deletes is not written into an install: its
    RECORD, its bytecode and revert's change record follow files that are
    there, and revert could not give a deleted module back nor remove a new
    one. Nothing is written."""
    whole = next((edit for edit in edits if edit.action != "change"), None)
    if whole is None:
        return
    patch_id = whole.patch_ids[-1] if whole.patch_ids else "a patch"
    verb = "adds" if whole.action == "add" else "deletes"
    raise DeepstackError(
        f"{patch_id} {verb} {whole.relpath}: an installed vLLM is patched only "
        "in the files it has, which revert can give back; nothing was written",
        "apply it to a source tree or the release's sdist (deepstack-patch "
        "backport), or build a patched wheel (deepstack-patch wheel) and install "
        f"that; or leave it out with --skip {patch_id}",
    )


def _put(changes: Changes, root: Path, relpath: str, content: bytes, like: str) -> None:
    """Create ``relpath``, or replace what an interrupted run left there."""
    path = root / relpath
    if not path.exists():
        changes.extra.append(ExtraChange(relpath, content, like=like))
    elif (old := path.read_bytes()) != content:
        changes.edits.append(FileEdit(relpath, old, content))


def _list_earlier_files(
    installed: InstalledVllm, document: dict[str, Any], new_files: dict[str, Any]
) -> None:
    """RECORD rows for what earlier runs wrote, in case one was interrupted."""
    root = installed.site_packages
    for entry in document["files"]:
        if entry["path"] not in new_files:
            new_files[entry["path"]] = (root / entry["path"]).read_bytes()
    kept = installed.dist_info / ORIGINALS_DIR
    for path in kept.rglob("*") if kept.is_dir() else []:
        relpath = _rel(installed, path)
        if path.is_file() and relpath not in new_files:
            new_files[relpath] = path.read_bytes()


def _new_record(installed: InstalledVllm, record_rel: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "tool_version": __version__,
        "date": _now(),
        "distribution": {"name": "vllm", "version": installed.version},
        "applied": [],
        "skipped": [],
        "files": [],
        "bytecode": [],
        "record": {"path": record_rel, "original": _original(record_rel)},
    }


def _now() -> str:
    moment = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


def _file_entry(root: Path, edit: FileEdit) -> dict[str, Any]:
    info = (root / edit.relpath).stat()
    return {
        "path": edit.relpath,
        "sha256_before": sha256_hex(edit.old),
        "sha256_after": sha256_hex(edit.new),
        "size_before": len(edit.old),
        "mtime_ns_before": info.st_mtime_ns,
        "original": _original(edit.relpath),
    }


def _keep_original(
    changes: Changes,
    new_files: dict[str, bytes | None],
    root: Path,
    dist: str,
    relpath: str,
    content: bytes,
) -> None:
    """Keep ``content`` under the dist-info folder, with the file's permissions."""
    kept = f"{dist}/{_original(relpath)}"
    _put(changes, root, kept, content, like=relpath)
    new_files[kept] = content


@dataclass(frozen=True)
class _Job(BytecodeJob):
    module: str = ""  # the module's relative path


def _bytecode_jobs(root: Path, edits: Sequence[FileEdit], stamp: int) -> list[_Job]:
    return [
        _Job(
            pyc=pyc,
            old=(root / pyc).read_bytes(),
            source_path=root / edit.relpath,
            source=edit.new,
            mtime=stamp,
            module=edit.relpath,
        )
        for edit in edits
        for pyc in bytecode_files(root, edit.relpath)
    ]


def _bytecode_entry(root: Path, pyc: str, result: BytecodeResult) -> dict[str, Any]:
    return {
        "path": pyc,
        "action": "rewritten" if result.new is not None else "removed",
        "invalidation_mode": result.mode,
        "reason": result.why,
        "permissions": stat.S_IMODE((root / pyc).stat().st_mode),
        "original": _original(pyc),
    }


@dataclass(frozen=True)
class RevertResult:
    """What ``revert`` gave back; ``nothing`` when the install has no record."""

    installed: InstalledVllm
    files: list[str]
    bytecode: list[str]
    applied: list[str]
    nothing: bool = False


def revert_in_place(installed: InstalledVllm) -> RevertResult:
    """Give back every file this tool changed, byte for byte, and drop the record.

    Refuses (nothing changed) when a file changed after this tool wrote it:
    its current bytes are someone else's work.
    """
    root = installed.site_packages
    dist_info = installed.dist_info
    document = load_change_record(dist_info / RECORD_NAME)
    if document is None:
        return RevertResult(installed, [], [], [], nothing=True)
    dist = _rel(installed, dist_info)
    changes = Changes()
    # A file already back to its original bytes is what an interrupted run
    # (or revert) left: nothing to give back there, but nothing lost either.
    current = {e["path"]: _sha256_or_none(root / e["path"]) for e in document["files"]}
    changed_since = [
        entry["path"]
        for entry in document["files"]
        if current[entry["path"]] not in (entry["sha256_after"], entry["sha256_before"])
    ]
    if changed_since:
        raise DeepstackError(
            f"{', '.join(changed_since)}: changed after deepstack-patch wrote it "
            f"(its sha256 differs from the record in {dist}/{RECORD_NAME}); "
            "nothing was reverted",
            reinstall_hint(installed.version, " to return to the release's files"),
        )
    for entry in document["files"]:
        if current[entry["path"]] == entry["sha256_before"]:
            continue
        original = _read_original(dist_info, entry, entry["sha256_before"])
        path = entry["path"]
        changes.edits.append(FileEdit(path, (root / path).read_bytes(), original))
        if "mtime_ns_before" in entry:
            changes.mtimes[path] = int(entry["mtime_ns_before"])
    record = document["record"]
    record_now = (root / record["path"]).read_bytes()
    record_then = _read_original(dist_info, record, None)
    if record_now != record_then:
        changes.edits.append(FileEdit(record["path"], record_now, record_then))
    restored = _give_back_bytecode(root, dist_info, document, changes)
    changes.extra.append(ExtraChange(f"{dist}/{RECORD_NAME}", None))
    kept = dist_info / ORIGINALS_DIR
    for path in sorted(p for p in kept.rglob("*") if p.is_file()):
        changes.extra.append(ExtraChange(_rel(installed, path), None))
    changes.write(root)
    _remove_empty_folders(dist_info / ORIGINALS_DIR.partition("/")[0])
    return RevertResult(
        installed,
        files=[entry["path"] for entry in document["files"]],
        bytecode=restored,
        applied=list(document["applied"]),
    )


def _sha256_or_none(path: Path) -> str | None:
    try:
        return sha256_hex(path.read_bytes())
    except OSError:
        return None


def _read_original(dist_info: Path, entry: dict[str, Any], sha256: str | None) -> bytes:
    path = dist_info / entry["original"]
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise DeepstackError(
            f"{path}: cannot read the original of {entry['path']}: {exc.strerror}; "
            "nothing was reverted",
            reinstall_hint(_version_of(dist_info)),
        ) from None
    if sha256 is not None and sha256_hex(content) != sha256:
        raise DeepstackError(
            f"{path}: the kept original of {entry['path']} is damaged (sha256 "
            "differs from the record); nothing was reverted",
            reinstall_hint(_version_of(dist_info)),
        )
    return content


def _version_of(dist_info: Path) -> str:
    """The release a ``vllm-X.Y.Z.dist-info`` folder names."""
    return dist_info.name.removeprefix("vllm-").removesuffix(".dist-info")


def _give_back_bytecode(
    root: Path, dist_info: Path, document: dict[str, Any], changes: Changes
) -> list[str]:
    """Restore recorded bytecode; remove bytecode of the modules written since."""
    restored: list[str] = []
    recorded = {entry["path"]: entry for entry in document["bytecode"]}
    for path, entry in recorded.items():
        original = _read_original(dist_info, entry, None)
        if (root / path).exists():
            current = (root / path).read_bytes()
            if current != original:
                changes.edits.append(FileEdit(path, current, original))
        else:
            mode = int(entry.get("permissions", 0o644))
            changes.extra.append(ExtraChange(path, original, mode=mode))
        restored.append(path)
    for entry in document["files"]:
        for pyc in bytecode_files(root, entry["path"]):
            if pyc not in recorded:
                changes.extra.append(ExtraChange(pyc, None))
                restored.append(pyc)
    return sorted(restored)


def _remove_empty_folders(top: Path) -> None:
    if not top.is_dir():
        return
    for folder in sorted(
        (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
    ):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()

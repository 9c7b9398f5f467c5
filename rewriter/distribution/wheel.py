"""A patched binary release: the official vLLM wheel, rewritten by the plan.

Building vLLM from a patched sdist compiles CUDA kernels for hours; the
official wheel already holds them. Only its Python files change here: the
``vllm/**/*.py`` members are extracted to a temporary tree, planned exactly as
``apply`` plans a source tree, and the wheel is written again with

* the version ``V+deepstack.N`` (PEP 440 local version) in the file name
  (PEP 427), the ``.dist-info`` folder's name, ``METADATA`` and
  ``vllm/_version.py`` (as ``backport`` writes it, :mod:`.sdist`);
* every member it does not change as the compressed bytes it came in as,
  with its CRC, date, permissions, compression method and extra fields
  (:mod:`.zipcopy`; the renamed ``.dist-info`` files too, under their new
  names): compressing the 3,135 unchanged members of vLLM 0.20.2's wheel
  again took 20-35 s of CPU, copying them about as long as copying the file;
* the rewritten members compressed anew, with their original attributes;
* ``RECORD`` written again: the official rows of the copied members (renamed
  with the ``.dist-info`` folder), new rows for the rewritten ones.

Reading goes through ``WheelFile``, so every member the plan reads is checked
against the official wheel's ``RECORD``; the copied members are not inflated,
so only their sizes are checked against it (``--release`` checks the whole
file's sha256 against the index).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.distribution.quilt import PatchStep, plan_steps, write_series
from deepstack_patch.distribution.sdist import (
    VERSION_MODULE,
    local_version,
    version_edits,
)
from deepstack_patch.distribution.zipcopy import copy_member
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import Plan
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.recognition_cache import RecognitionCache
from deepstack_patch.engine.tree import ASKED_FOR, VllmTree, glob_matcher
from deepstack_patch.fetch.cache import sha256_of

if TYPE_CHECKING:
    from wheel.wheelfile import WheelFile

Progress = Callable[[str], None]
#: Signatures of the old RECORD; they cannot sign the new one.
_RECORD_SIGNATURES = ("RECORD.jws", "RECORD.p7s")


@dataclass
class PatchedWheel:
    """What :func:`patch_wheel` did. ``path`` is None when nothing was written
    (a selected patch drifted)."""

    source: Path
    release: str
    version: str
    plan: Plan
    path: Path | None = None
    sha256: str = ""
    #: Members whose bytes differ from the official wheel's (new names).
    replaced: list[str] = field(default_factory=list)
    #: Members copied as the compressed bytes they came in as, with their
    #: attributes (the renamed ``.dist-info`` files among them).
    copied: int = 0
    #: The series of the applied patches against the official wheel's files,
    #: and the CycloneDX SBOM of the patched wheel, beside it.
    series: Path | None = None
    sbom: Path | None = None
    seconds: float = 0.0


def patch_wheel(
    wheel: Path,
    series: Sequence[Patch],
    selected: set[str],
    label: str,
    out_dir: Path,
    progress: Progress | None = None,
) -> PatchedWheel:
    """Plan ``series`` on ``wheel``'s Python files and write the patched wheel
    into ``out_dir`` (nothing is written if a selected patch drifted)."""
    from wheel.wheelfile import WheelError, WheelFile

    started = time.monotonic()
    say = progress or (lambda _message: None)
    release, name = _release_of(wheel)
    new_version = local_version(release, label)
    try:
        with WheelFile(wheel) as source, tempfile.TemporaryDirectory() as scratch:
            say(f"extracting the Python files of {wheel.name}")
            tree = _extract_tree(source, Path(scratch), series)
            say(f"planning {len(series)} patch(es) on vllm {release}")
            # Patch by patch, as a series: the SBOM carries each one's diff.
            # The plans see the official release's files: what a run before
            # (or `status` on the same release) recognised is not parsed again.
            cache = RecognitionCache.for_series(series)
            plan, steps = plan_steps(tree, series, selected, cache=cache)
            result = PatchedWheel(wheel, release, new_version, plan)
            if any(r.selected and r.state is PatchState.DRIFTED for r in plan.reports):
                return result
            old_dist_info = source.dist_info_path
            replaced = {e.relpath: e.new for e in plan.edits if e.action == "change"}
            added = {e.relpath: e.new for e in plan.edits if e.action == "add"}
            removed = {e.relpath for e in plan.edits if e.action == "delete"}
            replaced.update(
                (e.relpath, e.new)
                for e in version_edits(tree.root, release, new_version)
            )
            metadata = f"{old_dist_info}/METADATA"
            replaced[metadata] = _versioned_metadata(
                source.read(metadata), release, new_version
            )
            target = out_dir / _wheel_name(wheel.name, name, release, new_version)
            new_dist_info = f"{name}-{new_version}.dist-info"
            members = Members(replaced, added, removed)
            _write(source, target, old_dist_info, new_dist_info, members, say, result)
            _write_provenance(wheel, steps, out_dir, result)
    except (WheelError, zipfile.BadZipFile, EOFError) as exc:
        raise DeepstackError(
            f"{wheel}: not a valid wheel: {exc}",
            "download it again (or let `wheel --release V` fetch it)",
        ) from None
    result.seconds = round(time.monotonic() - started, 2)
    return result


def _write_provenance(
    wheel: Path, steps: Sequence[PatchStep], out_dir: Path, result: PatchedWheel
) -> None:
    """The series and the SBOM beside the patched wheel, as ``backport`` writes
    them beside the patched sdist."""
    from deepstack_patch.distribution.provenance import (
        UpstreamArtefact,
        read_applied,
        write_sbom,
    )

    assert result.path is not None
    stem = f"vllm-{result.version}"
    result.series = out_dir / f"{stem}.series"
    names = write_series(result.series, steps, result.release)
    result.sbom = write_sbom(
        out_dir / f"{stem}.cdx.json",
        release=result.release,
        local_version=result.version,
        upstream=UpstreamArtefact(wheel.name, sha256_of(wheel), "wheel"),
        applied=read_applied(
            result.series, [step.patch for step in steps], names, out_dir
        ),
        output=result.path,
        output_sha256=result.sha256,
    )


def _release_of(wheel: Path) -> tuple[str, str]:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _build, _tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise DeepstackError(
            f"--wheel {wheel}: {exc}", "give a vllm-*.whl file as the index names it"
        ) from None
    if name != "vllm":
        raise DeepstackError(
            f"--wheel {wheel}: a wheel of {name}, not of vllm",
            "give a vllm-*.whl file, or fetch one with --release VERSION",
        )
    if not wheel.is_file():
        raise DeepstackError(
            f"--wheel {wheel}: no such file",
            "give the path of a vllm-*.whl file, or fetch one with --release VERSION",
        )
    return str(version), name


def _extract_tree(
    source: zipfile.ZipFile, scratch: Path, series: Sequence[Patch]
) -> VllmTree:
    """The wheel's ``vllm/**/*.py`` members the plan can read (those the
    series' globs match, the package's ``__init__.py`` and ``_version.py``)
    as a tree: 405 of the 1,723 in vLLM 0.20.2's wheel; writing all of them
    took seconds on a busy disk."""
    # Where a patch adds a file, whether its folder is there is read from
    # the folder's __init__.py.
    folders = [
        f"{path.rpartition('/')[0]}/__init__.py"
        for patch in series
        for path in patch.whole_files
    ]
    patterns = [*(pattern for patch in series for pattern in patch.paths), *folders]
    wanted = glob_matcher(patterns)
    members = [
        info
        for info in source.infolist()
        if info.filename.startswith("vllm/")
        and info.filename.endswith(".py")
        and (
            wanted is None
            or wanted(info.filename)
            or info.filename in ("vllm/__init__.py", VERSION_MODULE)
        )
    ]
    for info in members:
        path = scratch / info.filename
        if ".." in Path(info.filename).parts:
            raise DeepstackError(
                f"{source.filename}: unsafe member {info.filename} (it would "
                "land outside the folder)",
                "give the official wheel from the package index",
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source.read(info))
    if wanted is not None:
        # A partial extraction of this tool's says what it was asked for, so
        # that a file asked for and absent is known to be missing, and no
        # other file is taken as missing (engine/tree.py, ASKED_FOR).
        asked = [*patterns, "vllm/__init__.py", VERSION_MODULE]
        (scratch / ASKED_FOR).write_text("".join(f"{p}\n" for p in asked))
    return VllmTree.open(scratch)


def _versioned_metadata(old: bytes, release: str, new_version: str) -> bytes:
    new, count = re.subn(
        rb"^Version: " + re.escape(release.encode()) + rb"\r?$",
        b"Version: " + new_version.encode(),
        old,
        count=1,
        flags=re.MULTILINE,
    )
    if count != 1:
        raise DeepstackError(
            f"METADATA: no 'Version: {release}' line",
            "give the official wheel, not one that was patched or rebuilt",
        )
    return new


def _wheel_name(filename: str, name: str, release: str, new_version: str) -> str:
    """PEP 427: only the version part of the file name changes."""
    prefix = f"{name}-{release}-"
    if not filename.startswith(prefix):
        raise DeepstackError(
            f"{filename}: expected a name starting with {prefix}",
            "give the wheel under the name the index gives it (PEP 427)",
        )
    return f"{name}-{new_version}-{filename[len(prefix) :]}"


@dataclass
class Members:
    """What the patched wheel changes: members replaced, added (a file a
    patch adds, mode 0644), removed (a file a patch deletes)."""

    replaced: dict[str, bytes]
    added: dict[str, bytes] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)


def _write(
    source: WheelFile,
    target: Path,
    old_dist_info: str,
    new_dist_info: str,
    members: Members,
    say: Progress,
    result: PatchedWheel,
) -> None:
    """Write ``target`` beside itself, then move it in place (never half a wheel)."""
    replaced = members.replaced
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".wheel-", dir=target.parent))
    except OSError as exc:
        raise DeepstackError(
            f"--out {target.parent}: cannot write there: {exc.strerror}",
            "give a folder you can write to with --out",
        ) from None
    partial = staging / target.name
    infos = source.infolist()
    old_record = f"{old_dist_info}/RECORD"
    official_rows = _record_rows(source, old_record)
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    try:
        with (
            open(str(source.filename), "rb") as raw,
            zipfile.ZipFile(partial, "w") as out,
        ):
            for index, info in enumerate(infos, 1):
                name = info.filename
                if name == old_record or name.endswith(
                    tuple(f"{old_dist_info}/{s}" for s in _RECORD_SIGNATURES)
                ):
                    continue  # written again last
                new_name = _renamed(name, old_dist_info, new_dist_info)
                data = replaced.get(name)
                if name in members.removed:
                    seen.add(name)
                elif data is None:
                    copy_member(raw, info, out, new_name)
                    if not name.endswith("/"):
                        row = _official_row(official_rows, info, source.filename)
                        rows.append((new_name, *row))
                    result.copied += 1
                else:
                    out.writestr(_same_attributes(info, new_name), data)
                    rows.append((new_name, _record_hash(data), str(len(data))))
                    seen.add(name)
                    result.replaced.append(new_name)
                if index % 500 == 0:
                    say(f"written {index}/{len(infos)} members")
            for name, data in members.added.items():
                info = zipfile.ZipInfo(name, date_time=_zip_time())
                info.external_attr = (stat.S_IFREG | 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(info, data)
                rows.append((name, _record_hash(data), str(len(data))))
                result.replaced.append(name)
            say(f"writing RECORD of {target.name}")
            new_record = f"{new_dist_info}/RECORD"
            rows.append((new_record, "", ""))
            out.writestr(
                _same_attributes(source.getinfo(old_record), new_record),
                _record_bytes(rows),
            )
        missing = sorted({*replaced, *members.removed} - seen)
        if missing:
            raise DeepstackError(
                f"{source.filename}: has no member {', '.join(missing)}",
                "the wheel does not hold the files the plan read",
            )
        os.replace(partial, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    result.path = target.resolve()
    result.sha256 = sha256_of(target)


def _zip_time() -> tuple[int, int, int, int, int, int]:
    """A new member's time: the build date (``SOURCE_DATE_EPOCH``), which a
    zip file cannot hold before 1980."""
    from deepstack_patch.distribution.quilt import build_date

    stamp = build_date().timetuple()[:6]
    return max(stamp, (1980, 1, 1, 0, 0, 0))  # type: ignore[return-value]


def _record_rows(source: WheelFile, record: str) -> dict[str, tuple[str, str]]:
    """The official ``RECORD``: member name → (hash, size), as written there."""
    text = source.read(record).decode("utf-8")
    return {
        row[0]: (row[1], row[2])
        for row in csv.reader(io.StringIO(text, newline=""))
        if len(row) == 3
    }


def _official_row(
    rows: dict[str, tuple[str, str]], info: zipfile.ZipInfo, wheel: str | None
) -> tuple[str, str]:
    """The copied member's row of the official ``RECORD``, whose size must be
    the member's: the data itself is not read (:mod:`.zipcopy`)."""
    match rows.get(info.filename):
        case (digest, size) if digest and size == str(info.file_size):
            return digest, size
        case (digest, size) if digest:
            raise DeepstackError(
                f"{wheel}: RECORD gives {info.filename} {size} bytes, the zip "
                f"{info.file_size}",
                "download the wheel again (or let `wheel --release V` fetch it)",
            )
        case _:
            raise DeepstackError(
                f"{wheel}: {info.filename} has no hash in RECORD",
                "give the official wheel, not one that was patched or rebuilt",
            )


def _record_hash(data: bytes) -> str:
    """PEP 376 / 427: ``sha256=`` and the urlsafe base64 digest, unpadded."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "sha256=" + digest.rstrip(b"=").decode("ascii")


def _record_bytes(rows: Sequence[tuple[str, str, str]]) -> bytes:
    """``RECORD`` as the ``wheel`` package writes it (CSV, ``\\n`` line ends)."""
    text = io.StringIO()
    csv.writer(text, delimiter=",", quotechar='"', lineterminator="\n").writerows(rows)
    return text.getvalue().encode("utf-8")


def _renamed(name: str, old_dist_info: str, new_dist_info: str) -> str:
    if name.startswith(old_dist_info + "/"):
        return new_dist_info + name[len(old_dist_info) :]
    return name


def _same_attributes(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    """A fresh entry with ``info``'s date, permissions and compression method.

    Fresh, because a ZipInfo read from one archive carries its offsets and
    sizes there; ``extra`` is left out for the same reason (ZIP64 fields).
    """
    copied = zipfile.ZipInfo(name, date_time=info.date_time)
    copied.compress_type = info.compress_type
    copied.external_attr = info.external_attr
    copied.create_system = info.create_system
    copied.comment = info.comment
    return copied

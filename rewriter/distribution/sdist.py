"""A patched source release: local version scheme and the repacked sdist.

Scheme: ``<release>+deepstack.<N>`` (PEP 440 local version). ``N`` is the
vendor's build number for that release (``--local-version deepstack.2`` when
the series changes); a release that already has a local part gets
``.deepstack.N`` appended. The version is written where a vLLM sdist build
reads it: ``PKG-INFO`` (setuptools-scm takes the version from it outside
git), ``vllm.egg-info/PKG-INFO`` and ``vllm/_version.py``. vLLM's setup.py
then appends its platform label with ``.`` (``0.20.2+deepstack.1.cu129``).
"""

from __future__ import annotations

import copy
import gzip
import io
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import FileEdit

METADATA_FILES = ("PKG-INFO", "vllm.egg-info/PKG-INFO")
VERSION_MODULE = "vllm/_version.py"


def local_version(release: str, label: str) -> str:
    """``0.20.2`` + ``deepstack.1`` -> ``0.20.2+deepstack.1``, checked by PEP 440."""
    from packaging.version import InvalidVersion, Version

    joined = f"{release}{'.' if '+' in release else '+'}{label}"
    try:
        version = Version(joined)
    except InvalidVersion:
        raise DeepstackError(
            f"--local-version {label!r}: {joined!r} is not a valid PEP 440 version",
            "use letters, digits and dots, e.g. deepstack.1",
        ) from None
    # PEP 440's normal form (DeepStack_2 -> deepstack.2): what pip, wheel
    # names and the index will call the release.
    return str(version)


def version_edits(root: Path, release: str, new_version: str) -> list[FileEdit]:
    """Edits that set the version to ``new_version`` in the tree's metadata."""
    edits = []
    for relpath in METADATA_FILES:
        path = root / relpath
        if not path.is_file():
            continue
        old = path.read_bytes()
        new, count = re.subn(
            rb"^Version: " + re.escape(release.encode()) + rb"$",
            b"Version: " + new_version.encode(),
            old,
            count=1,
            flags=re.MULTILINE,
        )
        if count != 1:
            raise DeepstackError(
                f"{relpath}: no 'Version: {release}' line",
                "the tree is not a pristine extraction of the release; "
                "backport from a fresh --out folder",
            )
        edits.append(FileEdit(relpath, old, new, ["local-version"]))
    path = root / VERSION_MODULE
    if path.is_file():
        old = path.read_bytes()
        text = old.decode()
        text, count = re.subn(
            r"^(__version__ = version = )(['\"])" + re.escape(release) + r"\2$",
            lambda m: f"{m.group(1)}{m.group(2)}{new_version}{m.group(2)}",
            text,
            count=1,
            flags=re.MULTILINE,
        )
        if count != 1:
            raise DeepstackError(
                f"{VERSION_MODULE}: no `__version__ = version = '{release}'` line",
                "the tree is not a pristine extraction of the release; "
                "backport from a fresh --out folder",
            )
        # setuptools-scm's tuple for a local version ends with the local part.
        local = new_version.split("+", 1)[1]
        text = re.sub(
            r"^(__version_tuple__ = version_tuple = \()(.*)(\))$",
            lambda m: f"{m.group(1)}{m.group(2)}, {local!r}{m.group(3)}",
            text,
            count=1,
            flags=re.MULTILINE,
        )
        edits.append(FileEdit(VERSION_MODULE, old, text.encode(), ["local-version"]))
    return edits


def repack_sdist(
    archive: Path,
    edits: Sequence[FileEdit],
    new_version: str,
    out: Path,
    mtime: int,
) -> Path:
    """Copy ``archive`` to ``out``, renaming its top folder for ``new_version``
    and replacing the members the ``edits`` change (tree-relative paths);
    the files a patch adds come last (mode 0644), those it deletes are left
    out.

    Member order, modes and owners are kept, so the result differs from the
    release only where the tree does. ``mtime`` stamps replaced members and
    the gzip header (``SOURCE_DATE_EPOCH`` gives reproducible tarballs).
    """
    top = f"vllm-{new_version}"
    replaced = {e.relpath: e.new for e in edits if e.action == "change"}
    added = {e.relpath: e.new for e in edits if e.action == "add"}
    removed = {e.relpath for e in edits if e.action == "delete"}
    seen: set[str] = set()
    partial = out.with_name(out.name + ".partial")
    try:
        with (
            tarfile.open(archive, "r:gz") as source,
            open(partial, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as zipped,
            tarfile.open(fileobj=zipped, mode="w", format=source.format) as target,
        ):
            for member in source:
                old_top, _, relpath = member.name.partition("/")
                member = _copy(member, name=f"{top}/{relpath}" if relpath else top)
                if member.isfile() and relpath in removed:
                    seen.add(relpath)
                elif member.isfile() and relpath in replaced:
                    content = replaced[relpath]
                    member = _copy(member, size=len(content), mtime=mtime)
                    seen.add(relpath)
                    target.addfile(member, io.BytesIO(content))
                elif member.isfile():
                    target.addfile(member, source.extractfile(member))
                else:
                    if member.islnk() and member.linkname.startswith(old_top + "/"):
                        link = member.linkname.partition("/")[2]
                        member = _copy(member, linkname=f"{top}/{link}")
                    target.addfile(member)
            for relpath, content in added.items():
                member = tarfile.TarInfo(f"{top}/{relpath}")
                member.size, member.mtime, member.mode = len(content), mtime, 0o644
                target.addfile(member, io.BytesIO(content))
        missing = sorted({*replaced, *removed} - seen)
        if missing:
            raise DeepstackError(
                f"{archive.name}: has no member for {', '.join(missing)}",
                "the extracted tree does not match its archive; backport again "
                "into an empty --out folder",
            )
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def _copy(member: tarfile.TarInfo, **changes: object) -> tarfile.TarInfo:
    # TarInfo.replace() is missing from older 3.10/3.11 patch releases.
    copied = copy.copy(member)
    # A long name's PAX "path" record would override the new name on reading;
    # tarfile writes fresh records for the fields that need them.
    copied.pax_headers = {
        key: value
        for key, value in member.pax_headers.items()
        if key not in ("path", "linkpath", "size", "mtime")
    }
    for name, value in changes.items():
        setattr(copied, name, value)
    return copied

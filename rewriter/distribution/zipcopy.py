"""Copy a zip member into another archive as the compressed bytes it came in as.

A patched wheel changes a handful of Python files among thousands of members
(vLLM 0.20.2's wheel: 3,144 members, 244 MB, 7 changed); inflating and
deflating the rest again cost 20 s of CPU for bytes that come out equal.
:func:`copy_member` moves a member's compressed bytes unread: the copy has
the source's CRC, sizes, compression method, date, permissions and extra
fields, under a new local header at its new offset.

Built on the standard library's :mod:`zipfile`, which writes everything
else: the members that do change (``ZipFile.writestr``), the central
directory, the end records and every ZIP64 field (a member or an offset past
4 GiB, more than 65,535 members), so the archive has one writer and one set
of ZIP64 rules. :mod:`zipfile` has no public call for a raw copy; this one
does what ``ZipFile.open(..., "w")`` does around a member (seek to
``start_dir``, write ``ZipInfo.FileHeader()``, the data, then register the
entry in ``filelist`` and ``NameToInfo`` and move ``start_dir``), all of them
attributes without an underscore, used the same way from Python 3.6 to 3.13,
and pinned by ``tests/test_zipcopy.py``. No third-party zip library was
worth a dependency for these few lines; the ``wheel`` package has no raw
copy either.

What is not checked: the copied data is never inflated, so its CRC is not
recomputed; a member damaged inside the source file is copied damaged, and
an installer that checks RECORD (or ``wheel unpack``) finds it. The local
header is checked against the central directory (signature, name), and the
data must be all there.
"""

from __future__ import annotations

import struct
import zipfile
from typing import BinaryIO

#: Local file header (APPNOTE 4.3.7): signature, versions, flags, method,
#: time, date, CRC, sizes, name and extra lengths.
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ENCRYPTED = 0x1
#: CRC and sizes after the data; the copy puts them in its local header.
_DATA_DESCRIPTOR = 0x8
_UTF8_NAME = 0x800
#: The ZIP64 extended information field: the writer adds its own.
_ZIP64_EXTRA = 0x0001
_CHUNK = 1 << 20


def copy_member(
    source: BinaryIO,
    info: zipfile.ZipInfo,
    out: zipfile.ZipFile,
    name: str | None = None,
) -> zipfile.ZipInfo:
    """Append ``info``'s member, read raw from ``source`` (the archive file
    ``info`` came from, opened ``"rb"``), to ``out`` (opened ``"w"`` on a
    seekable file), as ``name`` (default: its own); returns the new entry.

    Raises :class:`zipfile.BadZipFile` when the source's local header does not
    match ``info`` or its data is cut short.
    """
    if info.flag_bits & _ENCRYPTED:
        raise zipfile.BadZipFile(f"{info.filename}: encrypted member")
    source.seek(info.header_offset)
    data_offset = info.header_offset + _local_header_length(source, info)
    copied = _same_entry(info, name or info.filename)
    out.fp.seek(out.start_dir)
    copied.header_offset = out.fp.tell()
    out.fp.write(copied.FileHeader())
    source.seek(data_offset)
    remaining = info.compress_size
    while remaining:
        chunk = source.read(min(remaining, _CHUNK))
        if not chunk:
            raise zipfile.BadZipFile(f"{info.filename}: data cut short")
        out.fp.write(chunk)
        remaining -= len(chunk)
    out.start_dir = out.fp.tell()
    out.filelist.append(copied)
    out.NameToInfo[copied.filename] = copied
    return copied


def _local_header_length(source: BinaryIO, info: zipfile.ZipInfo) -> int:
    """The length of the local header at ``source``'s position, checked
    against the central directory's ``info``."""
    header = source.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
        raise zipfile.BadZipFile(f"{info.filename}: bad local file header")
    *_, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    raw_name = source.read(name_length)
    encoding = "utf-8" if info.flag_bits & _UTF8_NAME else "cp437"
    if raw_name.decode(encoding, errors="replace") != info.orig_filename:
        raise zipfile.BadZipFile(
            f"{info.filename}: the local header names {raw_name!r}"
        )
    return _LOCAL_HEADER.size + name_length + extra_length


def _same_entry(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    """A fresh entry for ``name`` with every attribute of ``info`` but its
    offset (set by the writer) and its ZIP64 field (written again as needed)."""
    copied = zipfile.ZipInfo(name, date_time=info.date_time)
    copied.compress_type = info.compress_type
    copied.comment = info.comment
    copied.create_system = info.create_system
    copied.create_version = info.create_version
    copied.extract_version = info.extract_version
    copied.internal_attr = info.internal_attr
    copied.external_attr = info.external_attr
    copied.flag_bits = info.flag_bits & ~_DATA_DESCRIPTOR
    copied.CRC = info.CRC
    copied.compress_size = info.compress_size
    copied.file_size = info.file_size
    copied.extra = _without_zip64(info.extra)
    return copied


def _without_zip64(extra: bytes) -> bytes:
    """``extra`` without its ZIP64 field: sizes and offset are the writer's."""
    kept = []
    position = 0
    while position + 4 <= len(extra):
        field_id, length = struct.unpack_from("<HH", extra, position)
        end = position + 4 + length
        if field_id != _ZIP64_EXTRA:
            kept.append(extra[position:end])
        position = end
    # A malformed tail (shorter than a field header) is kept as it was.
    kept.append(extra[position:])
    return b"".join(kept)

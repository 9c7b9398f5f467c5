"""Read a zip member's compressed bytes and attributes, for comparing archives.

Written apart from ``deepstack_patch.distribution.zipcopy`` on purpose: a
test that read members the way the code under test copies them would share
its mistakes.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path


def compressed_bytes(archive: Path, info: zipfile.ZipInfo) -> bytes:
    """The member's data as stored: after its local header, ``compress_size``
    bytes, whatever the compression method."""
    with archive.open("rb") as handle:
        handle.seek(info.header_offset)
        header = handle.read(30)
        assert header[:4] == b"PK\x03\x04", f"{info.filename}: no local header"
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        handle.seek(name_length + extra_length, 1)
        return handle.read(info.compress_size)


def local_extra(archive: Path, info: zipfile.ZipInfo) -> bytes:
    """The extra field of the member's local header (the central directory's
    may differ)."""
    with archive.open("rb") as handle:
        handle.seek(info.header_offset)
        header = handle.read(30)
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        handle.seek(name_length, 1)
        return handle.read(extra_length)


def entry(info: zipfile.ZipInfo) -> tuple:
    """What a copied member keeps: everything in its central directory entry
    but its name, offset and the data-descriptor flag."""
    return (
        info.CRC,
        info.compress_size,
        info.file_size,
        info.compress_type,
        info.date_time,
        info.external_attr,
        info.internal_attr,
        info.create_system,
        info.flag_bits & ~0x8,
        info.comment,
    )

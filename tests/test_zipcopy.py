"""``zipcopy.copy_member``: a member copied as its compressed bytes, on small
archives built here (no network): every compression method and flag a wheel
can hold, a data descriptor, extra fields, ZIP64, and damaged sources."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from deepstack_patch.distribution.zipcopy import copy_member

from tests.support.zips import compressed_bytes, entry, local_extra

#: An extra field of our own (id 0xCAFE), which a copy must keep.
CUSTOM_EXTRA = struct.pack("<HH", 0xCAFE, 3) + b"abc"


def source_archive(folder: Path) -> Path:
    """Members of every kind: deflated, stored, a folder, a UTF-8 name, an
    extra field, a comment, odd attributes."""
    path = folder / "source.zip"
    with zipfile.ZipFile(path, "w") as out:
        for index, (name, method, data) in enumerate(
            [
                ("pkg/module.py", zipfile.ZIP_DEFLATED, b"x = 1\n" * 200),
                ("pkg/kernel.so", zipfile.ZIP_STORED, bytes(range(256)) * 8),
                ("pkg/data/", zipfile.ZIP_STORED, b""),
                ("pkg/naïve.txt", zipfile.ZIP_BZIP2, "é".encode() * 300),
                ("pkg/extra.bin", zipfile.ZIP_LZMA, b"\0" * 5000),
            ]
        ):
            info = zipfile.ZipInfo(name, date_time=(2021, 2, 3, 4, 5, 6 + 2 * index))
            info.compress_type = method
            info.external_attr = (0o40755 if name.endswith("/") else 0o100751) << 16
            info.internal_attr = index % 2
            info.create_system = 3
            info.comment = f"member {index}".encode()
            if name.endswith(".bin"):
                info.extra = CUSTOM_EXTRA
            out.writestr(info, data)
    return path


def copy_all(
    source: Path, target: Path, rename: dict[str, str] | None = None
) -> list[zipfile.ZipInfo]:
    """Copy every member of ``source`` raw, with one member written anew in
    between (the writer must find its place after a raw copy)."""
    rename = rename or {}
    with (
        zipfile.ZipFile(source) as old,
        source.open("rb") as raw,
        zipfile.ZipFile(target, "w") as new,
    ):
        copies = []
        for index, info in enumerate(old.infolist()):
            copies.append(copy_member(raw, info, new, rename.get(info.filename)))
            if index == 1:
                new.writestr("written/anew.txt", b"new " * 100, zipfile.ZIP_DEFLATED)
    return copies


def test_members_keep_their_compressed_bytes_and_attributes(tmp_path: Path) -> None:
    source = source_archive(tmp_path)
    target = tmp_path / "copy.zip"
    copy_all(source, target, {"pkg/module.py": "renamed/module.py"})
    compared = 0
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target) as new:
        assert new.testzip() is None
        assert new.read("written/anew.txt") == b"new " * 100
        for info in old.infolist():
            name = "renamed/module.py" if info.filename == "pkg/module.py" else None
            copied = new.getinfo(name or info.filename)
            assert entry(copied) == entry(info), info.filename
            assert copied.extra == info.extra, info.filename
            assert compressed_bytes(target, copied) == compressed_bytes(source, info)
            assert new.read(copied) == old.read(info), info.filename
            compared += 1
        assert new.getinfo("pkg/extra.bin").extra == CUSTOM_EXTRA
        assert new.getinfo("pkg/naïve.txt").flag_bits & 0x800
        assert len(new.infolist()) == len(old.infolist()) + 1
    assert compared == 5
    checked = subprocess.run(
        [sys.executable, "-m", "zipfile", "-t", str(target)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    assert "Done testing" in checked.stdout


class Unseekable(io.BytesIO):
    """A stream without ``tell``/``seek``: zipfile writes data descriptors."""

    def tell(self) -> int:
        raise OSError("unseekable")

    def seek(self, *_args: object) -> int:
        raise OSError("unseekable")


def extra_fields(extra: bytes) -> list[tuple[int, bytes]]:
    fields = []
    position = 0
    while position + 4 <= len(extra):
        field_id, length = struct.unpack_from("<HH", extra, position)
        fields.append((field_id, extra[position + 4 : position + 4 + length]))
        position += 4 + length
    assert position == len(extra), extra
    return fields


def test_a_data_descriptor_becomes_a_local_header(tmp_path: Path) -> None:
    """A member streamed without seeking has CRC and sizes after its data;
    the copy states them in its local header instead."""
    stream = Unseekable()
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("streamed.txt", b"streamed " * 50)
    source = tmp_path / "streamed.zip"
    source.write_bytes(stream.getvalue())
    target = tmp_path / "copy.zip"
    (copied,) = copy_all(source, target)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target) as new:
        (info,) = old.infolist()
        assert info.flag_bits & 0x8
        assert not new.getinfo("streamed.txt").flag_bits & 0x8
        assert entry(new.getinfo("streamed.txt")) == entry(info)
        assert new.read("streamed.txt") == b"streamed " * 50
        assert new.testzip() is None


@pytest.mark.parametrize("source_limit", [100, zipfile.ZIP64_LIMIT])
@pytest.mark.parametrize("copy_limit", [100, zipfile.ZIP64_LIMIT])
def test_zip64_fields_are_written_where_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source_limit: int, copy_limit: int
) -> None:
    """With the ZIP64 limit lowered, sizes and offsets past it take ZIP64
    fields (as a member or an offset past 4 GiB would); a source's own ZIP64
    field is never carried over: the copy has one where it needs one."""
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", source_limit)
    source = source_archive(tmp_path)
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", copy_limit)
    target = tmp_path / "copy.zip"
    copy_all(source, target)
    monkeypatch.undo()
    compared = zip64 = 0
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target) as new:
        assert new.testzip() is None
        for info in old.infolist():
            copied = new.getinfo(info.filename)
            assert entry(copied) == entry(info), info.filename
            assert new.read(copied) == old.read(info), info.filename
            large = max(info.file_size, info.compress_size) > copy_limit
            central = extra_fields(copied.extra)
            local = extra_fields(local_extra(target, copied))
            needs_zip64 = large or copied.header_offset > copy_limit
            assert [i for i, _ in central].count(0x0001) == needs_zip64, info.filename
            assert [i for i, _ in local].count(0x0001) == large, info.filename
            for fields in (central, local):
                assert [f for f in fields if f[0] != 0x0001] == [
                    f for f in extra_fields(info.extra) if f[0] != 0x0001
                ]
            zip64 += needs_zip64
            compared += 1
    assert compared == 5
    assert zip64 == (5 if copy_limit == 100 else 0)


def test_a_damaged_local_header_is_refused(tmp_path: Path) -> None:
    source = source_archive(tmp_path)
    with zipfile.ZipFile(source) as old:
        stored = old.getinfo("pkg/kernel.so")
    damaged = bytearray(source.read_bytes())
    damaged[stored.header_offset] ^= 0xFF
    source.write_bytes(bytes(damaged))
    with pytest.raises(zipfile.BadZipFile, match="kernel.so: bad local file header"):
        copy_all(source, tmp_path / "copy.zip")


def test_data_cut_short_is_refused(tmp_path: Path) -> None:
    source = source_archive(tmp_path)
    with zipfile.ZipFile(source) as old:
        info = old.getinfo("pkg/kernel.so")
    cut = tmp_path / "cut.zip"
    cut.write_bytes(source.read_bytes()[: info.header_offset + 100])
    with (
        cut.open("rb") as raw,
        zipfile.ZipFile(tmp_path / "copy.zip", "w") as new,
        pytest.raises(zipfile.BadZipFile, match="data cut short"),
    ):
        copy_member(raw, info, new)

"""`deepstack-patch wheel`: the official wheel, patched, versioned V+deepstack.N.

The fast tests build a small wheel of our own (a granite4_vision.py from the
patch's own example); the `release` tests take vLLM 0.20.2's official wheel
from the index (cached), install the result into a fresh venv, and compare it
member by member with the official wheel and with `apply` on its files.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.fetch.wheels import choose_wheel, download_wheel, find_wheel
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite
from wheel.wheelfile import WheelFile

from tests.support.zips import compressed_bytes, entry

RELEASE = "0.20.2"
MODEL = "vllm/model_executor/models/granite4_vision.py"
VERSION_PY = (
    "__version__ = version = '{v}'\n__version_tuple__ = version_tuple = (0, 1)\n"
)
OFFICIAL_NAMES = [
    "vllm-0.20.2-cp38-abi3-manylinux_2_35_aarch64.whl",
    "vllm-0.20.2-cp38-abi3-manylinux_2_35_x86_64.whl",
]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def small_wheel(folder: Path, model: str = granite.BEFORE) -> Path:
    """A vllm wheel of three modules and a data file, one member executable."""
    path = folder / "vllm-0.1.0-py3-none-any.whl"
    members = {
        "vllm/__init__.py": b"",
        "vllm/_version.py": VERSION_PY.format(v="0.1.0").encode(),
        MODEL: model.encode(),
        "vllm/data/kernel.bin": bytes(range(256)) * 4,
        "vllm-0.1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\n"
        b"Version: 0.1.0\n",
        "vllm-0.1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    with WheelFile(path, "w") as out:
        for index, (name, data) in enumerate(members.items()):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 2, 3, 4, 6 + 2 * index))
            info.external_attr = (0o100755 if name.endswith(".bin") else 0o100644) << 16
            info.compress_type = (
                zipfile.ZIP_STORED if name.endswith(".bin") else zipfile.ZIP_DEFLATED
            )
            out.writestr(info, data)
    return path


def attributes(info: zipfile.ZipInfo) -> tuple:
    return (info.date_time, info.external_attr, info.compress_type, info.create_system)


def test_small_wheel_is_patched_and_versioned(tmp_path: Path) -> None:
    source = small_wheel(tmp_path)
    code, output = run(
        "wheel", "--wheel", str(source), "--out", str(tmp_path / "out"),
        "--format", "json",
    )  # fmt: skip
    assert code == 0, output
    document = json.loads(output[output.index("{") :])
    written = Path(document["outputs"]["wheel"])
    assert written.name == "vllm-0.1.0+deepstack.1-py3-none-any.whl"
    assert document["applied"] == ["vllm#40917"]
    assert len(document["outputs"]["wheel_sha256"]) == 64
    sbom = json.loads(Path(document["outputs"]["sbom"]).read_text())
    assert sbom["metadata"]["component"]["version"] == "0.1.0+deepstack.1"
    (output_hash,) = sbom["metadata"]["component"]["hashes"]
    assert output_hash["content"] == document["outputs"]["wheel_sha256"]
    assert output_hash["content"] == hashlib.sha256(written.read_bytes()).hexdigest()
    (ancestor,) = sbom["metadata"]["component"]["pedigree"]["ancestors"]
    assert ancestor["purl"] == "pkg:pypi/vllm@0.1.0"
    assert (
        ancestor["hashes"][0]["content"]
        == hashlib.sha256(source.read_bytes()).hexdigest()
    )
    patches = sbom["metadata"]["component"]["pedigree"]["patches"]
    assert [p["resolves"][0]["id"] for p in patches] == ["vllm#40917"]
    series_file = Path(document["outputs"]["series"]) / "series"
    assert series_file.read_text().count(".patch") == 1
    with WheelFile(written) as new, zipfile.ZipFile(source) as old:  # checks RECORD
        names = new.namelist()
        assert "vllm-0.1.0+deepstack.1.dist-info/RECORD" in names
        assert not [n for n in names if n.startswith("vllm-0.1.0.dist-info")]
        assert b"Version: 0.1.0+deepstack.1\n" in new.read(
            "vllm-0.1.0+deepstack.1.dist-info/METADATA"
        )
        assert "'0.1.0+deepstack.1'" in new.read("vllm/_version.py").decode()
        assert new.read(MODEL).decode() != granite.BEFORE
        assert "[:n]" in new.read(MODEL).decode()
        compared = 0
        for info in old.infolist():
            renamed = info.filename.replace("vllm-0.1.0.", "vllm-0.1.0+deepstack.1.")
            if renamed.endswith("/RECORD"):
                continue  # regenerated, dated now
            assert attributes(new.getinfo(renamed)) == attributes(info), renamed
            if info.filename in ("vllm/__init__.py", "vllm/data/kernel.bin"):
                assert new.read(renamed) == old.read(info)
                compared += 1
        assert compared == 2


def record_rows(archive: zipfile.ZipFile, name: str) -> dict[str, list[str]]:
    lines = archive.read(name).decode().splitlines()
    return {row[0]: row[1:] for row in csv.reader(lines)}


def fast_deflated_wheel(folder: Path) -> Path:
    """:func:`small_wheel` deflated at level 1 with a table of 2,000 lines:
    deflating its members again at the default level would give other bytes,
    so only a copy of the compressed bytes keeps them."""
    (folder / "base").mkdir()
    base = small_wheel(folder / "base")
    path = folder / base.name
    table = "".join(f"{i},{i * i}\n" for i in range(2000)).encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(table).digest()).rstrip(b"=")
    record = "vllm-0.1.0.dist-info/RECORD"
    with zipfile.ZipFile(base) as old, zipfile.ZipFile(path, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename == record:
                info = zipfile.ZipInfo("vllm/data/table.csv", info.date_time)
                info.compress_type = zipfile.ZIP_DEFLATED
                new.writestr(info, table, compresslevel=1)
                row = f"vllm/data/table.csv,sha256={digest.decode()},{len(table)}\n"
                data += row.encode()
                info = old.getinfo(record)
            new.writestr(info, data, compresslevel=1)
    return path


def test_unchanged_members_are_copied_as_compressed(tmp_path: Path) -> None:
    """Every member but the rewritten ones keeps its compressed bytes and
    entry (the renamed .dist-info files too), and its official RECORD row."""
    source = fast_deflated_wheel(tmp_path)
    code, output = run("wheel", "--wheel", str(source), "--out", str(tmp_path / "o"))
    assert code == 0, output
    written = tmp_path / "o" / "vllm-0.1.0+deepstack.1-py3-none-any.whl"
    rewritten = {MODEL, "vllm/_version.py", "vllm-0.1.0.dist-info/METADATA"}
    compared = 0
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(written) as new:
        old_rows = record_rows(old, "vllm-0.1.0.dist-info/RECORD")
        new_rows = record_rows(new, "vllm-0.1.0+deepstack.1.dist-info/RECORD")
        for info in old.infolist():
            if info.filename in rewritten or info.filename.endswith("/RECORD"):
                continue
            name = info.filename.replace("vllm-0.1.0.", "vllm-0.1.0+deepstack.1.")
            copied = new.getinfo(name)
            assert entry(copied) == entry(info), name
            assert compressed_bytes(written, copied) == compressed_bytes(source, info)
            assert new_rows[name] == old_rows[info.filename], name
            compared += 1
        for name in rewritten:
            name = name.replace("vllm-0.1.0.", "vllm-0.1.0+deepstack.1.")
            assert new_rows[name] != old_rows.get(name), name
            assert new_rows[name][1] == str(len(new.read(name))), name
    assert compared == 4  # vllm/__init__.py, the kernel, the table, WHEEL


def test_a_damaged_member_leaves_no_partial_wheel(tmp_path: Path) -> None:
    """The writer fails on the kernel, half way through the members: no wheel
    and no staging folder are left in --out."""
    source = small_wheel(tmp_path)
    with zipfile.ZipFile(source) as old:
        kernel = old.getinfo("vllm/data/kernel.bin")
    damaged = bytearray(source.read_bytes())
    damaged[kernel.header_offset] ^= 0xFF  # its local header's signature
    source.write_bytes(bytes(damaged))
    out = tmp_path / "o"
    code, output = run("wheel", "--wheel", str(source), "--out", str(out))
    assert code == 2, output
    assert "not a valid wheel" in output
    assert "kernel.bin: bad local file header" in " ".join(output.split())
    assert out.is_dir()  # made for the wheel, then left empty
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "row, message",
    [
        (None, "vllm/data/kernel.bin has no hash in RECORD"),
        ("vllm/data/kernel.bin,sha256=AAAA,1000", "RECORD gives vllm/data/kernel.bin"),
    ],
)
def test_a_copied_member_must_match_its_record_row(
    tmp_path: Path, row: str | None, message: str
) -> None:
    """A copied member is not inflated: its RECORD row must exist and give
    its size, or the wheel is refused and nothing is written."""
    source = small_wheel(tmp_path)
    edited = tmp_path / "edited" / source.name
    edited.parent.mkdir()
    record = "vllm-0.1.0.dist-info/RECORD"
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(edited, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename == record:
                kept = [
                    line
                    for line in data.decode().splitlines()
                    if not line.startswith("vllm/data/kernel.bin,")
                ]
                data = "\n".join(kept + ([row] if row else []) + [""]).encode()
            new.writestr(info, data)
    out = tmp_path / "o"
    code, output = run("wheel", "--wheel", str(edited), "--out", str(out))
    assert code == 2, output
    assert message in " ".join(output.split())
    assert list(out.iterdir()) == []


def test_a_wheel_that_needs_nothing_still_gets_its_version(tmp_path: Path) -> None:
    fixed = small_wheel(tmp_path, granite.AFTER)
    code, output = run("wheel", "--wheel", str(fixed), "--out", str(tmp_path))
    assert code == 0, output
    assert "patches applied: none (nothing needed)" in " ".join(output.split())
    with WheelFile(tmp_path / "vllm-0.1.0+deepstack.1-py3-none-any.whl") as new:
        assert new.read(MODEL).decode() == granite.AFTER


def test_a_drifted_wheel_writes_nothing(tmp_path: Path) -> None:
    source = small_wheel(tmp_path, granite.SLICED_OTHERWISE)
    code, output = run("wheel", "--wheel", str(source), "--out", str(tmp_path / "o"))
    assert code == 2, output
    assert "drifted" in output
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "exactly one of --release VERSION and --wheel FILE"),
        (("--wheel", "x.whl", "--release", "1"), "exactly one of"),
        (("--wheel", "torch-2.0-py3-none-any.whl"), "not of vllm"),
        (("--wheel", "nonsense.whl"), "error:"),
        (("--wheel", "vllm-0.1-py3-none-any.whl"), "no such file"),
    ],
)
def test_bad_wheel_arguments_are_errors(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    code, output = run("wheel", *args, "--out", str(tmp_path))
    assert code == 2
    assert message in output


def test_an_out_folder_that_cannot_be_made_is_an_error(tmp_path: Path) -> None:
    source = small_wheel(tmp_path)
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"  # under a file: nobody, root included, can
    code, output = run("wheel", "--wheel", str(source), "--out", str(out))
    assert code == 2
    assert "cannot write there" in " ".join(output.split())


def test_a_corrupt_member_is_caught_by_record(tmp_path: Path) -> None:
    source = small_wheel(tmp_path)
    broken = tmp_path / "broken" / source.name
    broken.parent.mkdir()
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(broken, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            new.writestr(info, data + b"#" if info.filename == MODEL else data)
    code, output = run("wheel", "--wheel", str(broken), "--out", str(tmp_path / "o"))
    assert code == 2
    assert "Hash mismatch" in output


@pytest.mark.parametrize(
    "platform, expected",
    [
        (None, None),  # this machine's: whichever fits, checked below
        ("aarch64", OFFICIAL_NAMES[0]),
        ("x86_64", OFFICIAL_NAMES[1]),
        ("manylinux_2_35_x86_64", OFFICIAL_NAMES[1]),
    ],
)
def test_choose_wheel_by_platform(platform: str | None, expected: str | None) -> None:
    from packaging.tags import sys_tags

    if platform is None:
        fits = {str(t) for t in sys_tags()}
        chosen = choose_wheel(OFFICIAL_NAMES, None)
        assert chosen in OFFICIAL_NAMES
        assert any(chosen.endswith(t.rsplit("-", 1)[1] + ".whl") for t in fits)
    else:
        assert choose_wheel(OFFICIAL_NAMES, platform) == expected


def test_choose_wheel_refuses_an_unknown_platform() -> None:
    from deepstack_patch.engine.errors import DeepstackError

    with pytest.raises(DeepstackError, match="no wheel fits"):
        choose_wheel(OFFICIAL_NAMES, "win_amd64")


# --- the official wheel --------------------------------------------------------


@pytest.fixture(scope="module")
def official_wheel() -> Path:
    return download_wheel(find_wheel(RELEASE, "x86_64"))


@pytest.fixture(scope="module")
def patched_wheel(official_wheel: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("wheel-out")
    code, output = run("wheel", "--wheel", str(official_wheel), "--out", str(out),
                       "--format", "json")  # fmt: skip
    assert code == 0, output
    return json.loads(output[output.index("{") :])


@pytest.mark.release
def test_official_wheel_members_equal_except_the_rewritten(
    official_wheel: Path, patched_wheel: dict, tmp_path: Path
) -> None:
    """Rewritten members equal `apply` on the official wheel's vllm/; every
    other member has the official bytes and attributes."""
    new_version = f"{RELEASE}+deepstack.1"
    rewritten = set(patched_wheel["written"])
    assert {"vllm/_version.py", f"vllm-{new_version}.dist-info/METADATA"} < rewritten
    tree = tmp_path / "extracted"
    with zipfile.ZipFile(official_wheel) as old:
        old.extractall(tree, [n for n in old.namelist() if n.startswith("vllm/")])
    code, output = run("apply", "--vllm-src", str(tree))
    assert code == 0, output
    compared_rewritten = compared_other = 0
    with (
        zipfile.ZipFile(official_wheel) as old,
        WheelFile(patched_wheel["outputs"]["wheel"]) as new,
    ):
        for info in old.infolist():
            name = info.filename.replace(f"vllm-{RELEASE}.", f"vllm-{new_version}.")
            if name.endswith(".dist-info/RECORD"):
                continue
            assert attributes(new.getinfo(name)) == attributes(info), name
            is_fix = name.startswith("vllm/") and name != "vllm/_version.py"
            if name in rewritten and is_fix:
                assert new.read(name) == (tree / name).read_bytes(), name
                assert new.read(name) != old.read(info), name
                compared_rewritten += 1
            elif name not in rewritten:
                assert new.read(name) == old.read(info), name
                if name.startswith("vllm/"):  # nor did apply change it
                    assert (tree / name).read_bytes() == old.read(info), name
                compared_other += 1
        assert len(new.namelist()) == len(old.namelist())
    assert compared_rewritten == len(rewritten) - 2 >= 3
    assert compared_other > 1000


@pytest.mark.release
def test_official_wheel_unchanged_members_keep_their_compressed_bytes(
    official_wheel: Path, patched_wheel: dict
) -> None:
    """The members the plan does not change (3,135 of 3,144) are copied as
    they were compressed: same bytes, CRC, attributes and RECORD row."""
    new_version = f"{RELEASE}+deepstack.1"
    rewritten = set(patched_wheel["written"])
    written = Path(patched_wheel["outputs"]["wheel"])
    compared = 0
    with zipfile.ZipFile(official_wheel) as old, zipfile.ZipFile(written) as new:
        old_rows = record_rows(old, f"vllm-{RELEASE}.dist-info/RECORD")
        new_rows = record_rows(new, f"vllm-{new_version}.dist-info/RECORD")
        for info in old.infolist():
            name = info.filename.replace(f"vllm-{RELEASE}.", f"vllm-{new_version}.")
            if name in rewritten or name.endswith(".dist-info/RECORD"):
                continue
            copied = new.getinfo(name)
            assert entry(copied) == entry(info), name
            assert copied.extra == info.extra, name
            assert compressed_bytes(written, copied) == compressed_bytes(
                official_wheel, info
            ), name
            assert new_rows[name] == old_rows[info.filename], name
            compared += 1
    assert compared > 3000
    assert compared == patched_wheel["copied_members"]


@pytest.mark.release
def test_official_wheel_passes_zipfile_and_wheel_unpack(
    patched_wheel: dict, tmp_path: Path
) -> None:
    """Two readers other than ours: the zip layer's CRCs (``zipfile -t``) and
    every member's RECORD hash (``wheel unpack``)."""
    written = patched_wheel["outputs"]["wheel"]
    tested = subprocess.run(
        [sys.executable, "-m", "zipfile", "-t", written],
        capture_output=True, text=True,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stderr
    assert "Done testing" in tested.stdout
    unpacked = tmp_path / "unpacked"
    done = subprocess.run(
        [sys.executable, "-m", "wheel", "unpack", "-d", str(unpacked), written],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    folder = unpacked / f"vllm-{RELEASE}+deepstack.1"
    assert (folder / "vllm" / "_version.py").is_file()
    shutil.rmtree(unpacked)  # 550 MB


@pytest.mark.release
def test_official_wheel_installs_with_its_local_version(
    patched_wheel: dict, tmp_path: Path
) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
         "--no-deps", "--no-compile", patched_wheel["outputs"]["wheel"]],
        check=True,
    )  # fmt: skip
    version = subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert version == f"{RELEASE}+deepstack.1"
    # The fixes are live in the interpreter that installed it.
    code, output = run("doctor", "--python", str(python))
    assert code == 0, output
    assert f"vllm    {RELEASE}+deepstack.1" in output
    shutil.rmtree(env)

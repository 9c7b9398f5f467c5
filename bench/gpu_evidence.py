"""The GPU evidence of every fix, on a machine with CUDA PyTorch and nothing else.

    python bench/gpu_evidence.py prepare            # here: network, the tool's venv
    python3 bench/gpu_evidence.py run [--device cuda|cpu] [--out DIR]   # there

``prepare`` (run with the tool's own Python, where the release tarballs can
be fetched) writes ``bench/gpu-evidence/`` (git-ignored):

- ``trees/<version>/{pristine,patched}/``: for 0.19.1, 0.20.1 and 0.20.2, the
  release as shipped and after ``apply``, holding only the files the series
  recognises (every file a patch's ``paths`` match that carries its markers)
  and the files the measurements read besides (an ``evidence.py``'s
  ``EXTRA_FILES``), plus ``PKG-INFO``: a few MB in all. The tool plans and
  measures them like the full trees: the states and the code measured are
  the same.
- ``wheels/``: the tool's dependencies for CPython 3.10 to 3.13 on
  manylinux x86_64 (``pip download``), since such a machine has none of them.

``run`` (on the GPU machine, from the repository root, no network) makes a
venv with ``--system-site-packages`` (so the machine's CUDA torch is the one
measured), installs the wheels into it offline, and runs
``deepstack-patch verify --gpu-evidence --against-pristine`` on each release,
writing ``<version>/evidence.{json,md}`` and ``evidence.md`` (the three
tables) to ``--out`` (default ``$OUT``, else ``bench/gpu-evidence/out``). The
tool runs from this checkout's source (``rewriter/``, ``patches/``); nothing
is built.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench" / "gpu-evidence"
RELEASES = ("0.19.1", "0.20.1", "0.20.2")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


# -- prepare (here) ----------------------------------------------------------------


def _bootstrap() -> None:
    """``deepstack_patch`` from this checkout, whatever else is installed
    (``rewriter/`` is ``deepstack_patch``: the proof runner's loader maps it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_proof_runner", ROOT / "rewriter" / "proof" / "runner.py"
    )
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    runner.load_package("deepstack_patch", str(ROOT / "rewriter"))
    runner.load_package("deepstack_patch.patches", str(ROOT / "patches"))


def _needed_files(tree: Path) -> list[str]:
    """What the series recognises in ``tree`` and the measurements read."""
    import importlib

    from deepstack_patch.engine.tree import VllmTree
    from deepstack_patch.patches import SERIES

    vllm_tree = VllmTree.open(tree)
    files = {"PKG-INFO"}
    for patch in SERIES:
        for relpath in vllm_tree.glob(patch.paths):
            raw = (tree / relpath).read_bytes()
            if not patch.markers or any(m in raw for m in patch.markers):
                files.add(relpath)
        try:
            evidence = importlib.import_module(f"{type(patch).__module__}.evidence")
        except ModuleNotFoundError:
            continue
        for relpath in getattr(evidence, "EXTRA_FILES", ()):
            if (tree / relpath).exists():
                files.add(relpath)
    return sorted(files)


def _copy(tree: Path, files: list[str], dest: Path) -> int:
    size = 0
    for relpath in files:
        target = dest / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / relpath, target)
        size += target.stat().st_size
    # The package marker VllmTree.open looks for.
    init = dest / "vllm" / "__init__.py"
    if not init.exists():
        init.parent.mkdir(parents=True, exist_ok=True)
        init.write_text("")
    return size


def prepare(args: argparse.Namespace) -> None:
    _bootstrap()
    import tempfile

    from deepstack_patch.engine.apply import WRITE, apply_tree
    from deepstack_patch.engine.cache import cache_dir
    from deepstack_patch.engine.tree import VllmTree, link_copy
    from deepstack_patch.fetch.releases import fetch_release
    from deepstack_patch.patches import SERIES

    if HERE.exists():
        shutil.rmtree(HERE)
    total = 0
    for version in RELEASES:
        pristine = fetch_release(version, cache_dir() / "pristine" / f"vllm-{version}")
        with tempfile.TemporaryDirectory() as scratch:
            patched = VllmTree.open(link_copy(pristine.root, Path(scratch) / "t"))
            apply_tree(patched, SERIES, {p.id for p in SERIES}, WRITE)
            for side, tree in (("pristine", pristine.root), ("patched", patched.root)):
                files = _needed_files(tree)
                size = _copy(tree, files, HERE / "trees" / version / side)
                total += size
                print(f"{version} {side}: {len(files)} files, {size / 1e6:.1f} MB")
    wheels = HERE / "wheels"
    requirements = _requirements()
    for python in PYTHONS:
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet",
                "--dest", str(wheels), "--only-binary=:all:",
                "--python-version", python, "--implementation", "cp",
                "--platform", "manylinux2014_x86_64",
                "--platform", "manylinux_2_17_x86_64",
                "--platform", "manylinux_2_28_x86_64",
                *requirements,
            ],
            check=True,
        )  # fmt: skip
    size = sum(f.stat().st_size for f in wheels.iterdir())
    print(f"wheels: {len(list(wheels.iterdir()))} files, {size / 1e6:.1f} MB")
    carried = sum(f.stat().st_size for f in HERE.rglob("*") if f.is_file())
    print(f"bench/gpu-evidence: {carried / 2**20:.1f} MiB to carry")


def _requirements() -> list[str]:
    """The tool's own dependencies, from pyproject.toml."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


# -- run (there) -------------------------------------------------------------------


def _venv_python(folder: Path, torch_site: str | None) -> Path:
    """A venv over the machine's site-packages (its CUDA torch), with the
    tool's dependencies installed offline from ``wheels/``; ``torch_site``
    adds another environment's site-packages (a CPU rehearsal)."""
    python = folder / "bin" / "python"
    if not python.exists():
        try:
            venv.EnvBuilder(system_site_packages=True, with_pip=True).create(folder)
        except subprocess.CalledProcessError:  # no ensurepip: the system's pip
            venv.EnvBuilder(system_site_packages=True, with_pip=False).create(folder)
    if torch_site:
        site = subprocess.run(
            [str(python), "-c", "import sysconfig as s; print(s.get_path('purelib'))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        Path(site, "torch-site.pth").write_text(str(Path(torch_site).resolve()) + "\n")
    pip = [str(python), "-m", "pip"]
    if subprocess.run([*pip, "--version"], capture_output=True).returncode != 0:
        pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run(
        [
            *pip, "install", "--quiet", "--no-index",
            "--find-links", str(HERE / "wheels"), *_requirements(),
        ],
        check=True,
    )  # fmt: skip
    return python


def run(args: argparse.Namespace) -> None:
    started = time.monotonic()
    out = Path(args.out or os.environ.get("OUT") or HERE / "out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = (
        Path(args.python)
        if args.python
        else _venv_python(HERE / "venv", args.torch_site)
    ).absolute()
    print(f"venv ready: {python} ({time.monotonic() - started:.0f} s)", flush=True)
    environ = dict(os.environ, DEEPSTACK_PATCH_CACHE=str(HERE / "cache"))
    tables, codes = [], {}
    for version in RELEASES:
        trees = HERE / "trees" / version
        began = time.monotonic()
        done = subprocess.run(
            [
                str(python), str(Path(__file__).resolve()), "_verify",
                "--vllm-src", str(trees / "patched"), "--against-pristine",
                "--pristine", str(trees / "pristine"), "--gpu-evidence",
                "--device", args.device, "--python", str(python),
                "--evidence-out", str(out / version),
            ],
            env=environ,
        )  # fmt: skip
        codes[version] = done.returncode
        print(f"{version}: exit {done.returncode} in {time.monotonic() - began:.0f} s")
        table = out / version / "evidence.md"
        if table.exists():
            tables.append(table.read_text())
    seconds = time.monotonic() - started
    (out / "evidence.md").write_text(
        "\n".join(tables) + f"\nWhole run: {seconds:.0f} s.\n"
    )
    (out / "exit-codes.json").write_text(json.dumps(codes))
    print((out / "evidence.md").read_text())
    sys.exit(max(codes.values()))


def _verify(argv: list[str]) -> None:
    """``deepstack-patch verify ...`` from this checkout's source."""
    _bootstrap()
    from deepstack_patch.cli import main

    main(["verify", *argv])


def main() -> None:
    if sys.argv[1:2] == ["_verify"]:
        _verify(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare", help="copy the trees' files and the wheels")
    running = commands.add_parser("run", help="measure (offline)")
    running.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    running.add_argument("--out", help="where the tables go (default $OUT)")
    running.add_argument(
        "--python", help="measure with this interpreter instead of the venv"
    )
    running.add_argument(
        "--torch-site",
        help="also see this site-packages folder in the venv (a CPU rehearsal "
        "with another environment's torch; on the GPU machine, leave it out)",
    )
    args = parser.parse_args()
    prepare(args) if args.command == "prepare" else run(args)


if __name__ == "__main__":
    main()

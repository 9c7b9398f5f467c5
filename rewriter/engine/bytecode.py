"""Bytecode beside an installed module: find it, read its header, rebuild it.

An unchecked-hash ``.pyc`` is loaded without looking at the source again, so
a rewritten module whose old bytecode stays would keep running the old code.
Every ``__pycache__/<name>.<tag>[.opt-N].pyc`` of a rewritten module is
rebuilt for the new source by the interpreter that will load it (its magic
number and source hash are its own), with the optimisation level its name
says and the invalidation mode its header says; bytecode that interpreter
cannot rebuild (another tag or magic number) is removed instead.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError

#: Header flags (PEP 552): bit 0 hash-based, bit 1 check the source hash.
FLAG_HASH_BASED = 0b01
FLAG_CHECK_SOURCE = 0b10


def invalidation_mode(header: bytes) -> str:
    """``timestamp``, ``checked-hash`` or ``unchecked-hash`` from a pyc header."""
    flags = int.from_bytes(header[4:8], "little")
    match flags & FLAG_HASH_BASED, flags & FLAG_CHECK_SOURCE:
        case 0, _:
            return "timestamp"
        case _, 0:
            return "unchecked-hash"
        case _:
            return "checked-hash"


def bytecode_files(root: Path, relpath: str) -> list[str]:
    """The ``__pycache__`` files of module ``relpath`` (relative to ``root``)."""
    folder, _, name = relpath.rpartition("/")
    stem = name.removesuffix(".py")
    cache = root / folder / "__pycache__"
    if not cache.is_dir():
        return []
    pattern = re.compile(rf"{re.escape(stem)}\.[A-Za-z0-9_-]+(\.opt-[12])?\.pyc")
    prefix = f"{folder}/__pycache__/" if folder else "__pycache__/"
    return sorted(
        prefix + path.name
        for path in cache.glob(f"{stem}.*.pyc")
        if pattern.fullmatch(path.name) and path.is_file()
    )


@dataclass(frozen=True)
class BytecodeJob:
    pyc: str  # relative path of the .pyc
    old: bytes  # its current bytes
    source_path: Path  # where the module lives (the code's co_filename)
    source: bytes  # the module's new source
    mtime: int  # the new source's mtime in seconds (timestamp pycs record it)


@dataclass(frozen=True)
class BytecodeResult:
    pyc: str
    mode: str  # the invalidation mode the old pyc had
    new: bytes | None  # None: cannot be rebuilt here; remove it
    why: str = ""


# Runs in the target interpreter (-I: no PYTHONPATH, no user site, no cwd).
_COMPILE_SCRIPT = r"""
import base64, importlib._bootstrap_external as bx, importlib.util, json, re, sys
jobs = json.load(sys.stdin)
tag = sys.implementation.cache_tag
out = []
for job in jobs:
    old = base64.b64decode(job["old"])
    name = job["pyc"].rpartition("/")[2]
    opt = re.search(r"\.opt-([12])\.pyc$", name)
    if tag is None or not name.endswith((f".{tag}.pyc", f".{tag}.opt-1.pyc",
                                         f".{tag}.opt-2.pyc")):
        out.append({"new": None, "why": f"not {tag} bytecode"}); continue
    if old[:4] != importlib.util.MAGIC_NUMBER:
        out.append({"new": None, "why": "another magic number"}); continue
    flags = int.from_bytes(old[4:8], "little")
    source = base64.b64decode(job["source"])
    try:
        code = compile(source, job["source_path"], "exec", dont_inherit=True,
                       optimize=int(opt.group(1)) if opt else 0)
    except SyntaxError as exc:
        out.append({"new": None, "why": f"does not compile here: {exc}"}); continue
    try:
        if flags & 1:
            data = bx._code_to_hash_pyc(code, importlib.util.source_hash(source),
                                        bool(flags & 2))
        else:
            data = bx._code_to_timestamp_pyc(code, job["mtime"], len(source))
    except AttributeError:  # a Python whose importlib has other helpers
        out.append({"new": None, "why": "cannot build bytecode here"}); continue
    out.append({"new": base64.b64encode(bytes(data)).decode(), "why": ""})
print("DEEPSTACK-PYC " + json.dumps(out))
"""


def rebuild_bytecode(python: Path, jobs: list[BytecodeJob]) -> list[BytecodeResult]:
    """New bytes for every job's pyc, compiled by ``python``; None to remove."""
    if not jobs:
        return []
    payload = json.dumps(
        [
            {
                "pyc": job.pyc,
                "old": base64.b64encode(job.old).decode(),
                "source_path": str(job.source_path),
                "source": base64.b64encode(job.source).decode(),
                "mtime": job.mtime,
            }
            for job in jobs
        ]
    )
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _COMPILE_SCRIPT],
            input=payload,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise DeepstackError(
            f"{python}: cannot run it to compile bytecode: {exc}; nothing was written",
            "pass the interpreter that runs vLLM with --python",
        ) from None
    answers = [
        json.loads(line.removeprefix("DEEPSTACK-PYC "))
        for line in done.stdout.splitlines()
        if line.startswith("DEEPSTACK-PYC ")
    ]
    if done.returncode != 0 or len(answers) != 1 or len(answers[0]) != len(jobs):
        detail = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise DeepstackError(
            f"{python}: compiling the new bytecode failed ({detail}); nothing "
            "was written",
            "check that this interpreter runs (and is the one that runs vLLM)",
        )
    return [
        BytecodeResult(
            pyc=job.pyc,
            mode=invalidation_mode(job.old[:16]),
            new=base64.b64decode(answer["new"]) if answer["new"] else None,
            why=answer["why"],
        )
        for job, answer in zip(jobs, answers[0], strict=True)
    ]

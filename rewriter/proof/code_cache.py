"""Compiled code for the tree's modules, cached by content, for proof processes.

Proofs and tree tests run with ``PYTHONDONTWRITEBYTECODE`` (a tree stays
byte-identical), so every process compiled the ~500 vLLM modules it imports
from source: about a second of CPU per process, three processes per verify.
This module, loaded first in those processes, gives the modules under the
tree a loader that keeps each module's code object in a cache folder, named
by the SHA-256 of the Python magic number, the optimisation level and the
source bytes. The same bytes give the same code whatever the tree's path (the
file name inside is set to the module's own file on load, so tracebacks point
into the tree), so a patched tree shares all but its changed files with its
pristine release, and a changed byte is a different name: never a stale
answer. Each entry carries the SHA-256 of its payload and is written to a
temporary name then renamed, so a torn or damaged entry is compiled again.

Loaded as ``-p deepstack_patch_code_cache`` by pytest (a copy next to the
run, like the results plugin) and by ``runner.py``; the folder is
:data:`ENV_VAR` (unset: nothing is installed). Standard library only.
"""

from __future__ import annotations

import _imp
import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The name the copy of this file is loaded under by pytest.
MODULE = "deepstack_patch_code_cache"
ENV_VAR = "DEEPSTACK_PATCH_CODE_CACHE"
#: An entry: this header, the payload's SHA-256, the marshalled code.
HEADER = b"deepstack-code-1\n"


def entry_name(source: bytes) -> str:
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    key.update(str(sys.flags.optimize).encode())
    key.update(source)
    return key.hexdigest()


def read_entry(path: Path) -> Any | None:
    """The code object stored at ``path``, or None if absent or damaged."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, payload = data[len(HEADER) : len(HEADER) + 32], data[len(HEADER) + 32 :]
    if not data.startswith(HEADER) or hashlib.sha256(payload).digest() != digest:
        return None
    try:
        return marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None


def write_entry(path: Path, code: Any) -> None:
    """Store ``code`` at ``path`` atomically; an unwritable cache is skipped."""
    payload = marshal.dumps(code)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(handle, "wb") as out:
            out.write(HEADER + hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, path)
    except OSError:
        return


class CachedSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader whose compiled code comes from :func:`cache_folder`."""

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        source = self.get_data(path)
        name = entry_name(source)
        entry = cache_folder() / name[:2] / name
        code = read_entry(entry)
        if code is None:
            code = self.source_to_code(source, path)
            write_entry(entry, code)
        else:
            # Compiled under another tree's path: name this tree's file.
            _imp._fix_co_filename(code, path)
        return code


_folder: Path | None = None


def cache_folder() -> Path:
    assert _folder is not None
    return _folder


def install(tree: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Load every module under ``tree`` through the cache in ``folder``."""
    global _folder
    _folder = Path(folder)
    root = os.path.realpath(tree)
    machinery = importlib.machinery
    finder = machinery.FileFinder.path_hook(
        (CachedSourceLoader, machinery.SOURCE_SUFFIXES),
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    )

    def tree_hook(entry: str) -> Any:
        real = os.path.realpath(entry or ".")
        if real != root and not real.startswith(root + os.sep):
            raise ImportError("not in the tree")  # the next hook takes it
        return finder(entry)

    sys.path_hooks.insert(0, tree_hook)
    sys.path_importer_cache.clear()


def install_from_environment(tree: str | os.PathLike[str]) -> None:
    folder = os.environ.get(ENV_VAR)
    if folder:
        install(tree, folder)


if __name__ == MODULE:
    # Loaded by pytest with -p, in the tree (verify runs pytest there).
    install_from_environment(os.getcwd())

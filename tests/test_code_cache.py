"""The proof processes' code cache: same bytes, same code; a changed byte, new code.

Each check imports a module from a small tree in a fresh interpreter (the
cache installs an import hook), so nothing here touches this process's imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deepstack_patch.proof import code_cache, results, runner
from deepstack_patch.proof.envs import subprocess_env

IMPORT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import importlib.util
spec = importlib.util.spec_from_file_location("cc", sys.argv[3])
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)
cc.install(sys.argv[1], sys.argv[2])
import pkg.mod, json as outside
def where():
    try:
        pkg.mod.boom()
    except ZeroDivisionError as exc:
        return exc.__traceback__.tb_next.tb_frame.f_code.co_filename
print(json.dumps({
    "value": pkg.mod.VALUE,
    "file": pkg.mod.boom.__code__.co_filename,
    "traceback": where(),
    "loader": type(pkg.mod.__loader__).__name__,
    "outside": type(outside.__loader__).__name__,
}))
"""


def _tree(root: Path, value: int) -> Path:
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(
        f"VALUE = {value}\n\ndef boom():\n    return 1 / 0\n"
    )
    return root


def _import(tree: Path, cache: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT, str(tree), str(cache), code_cache.__file__],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _entries(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in cache.rglob("*") if p.is_file()}


def test_same_bytes_share_code_under_each_tree_path(tmp_path: Path) -> None:
    cache = tmp_path / "code"
    first = _tree(tmp_path / "a", 1)
    seen = _import(first, cache)
    assert seen["value"] == 1 and seen["loader"] == "CachedSourceLoader"
    assert seen["outside"] != "CachedSourceLoader"  # only the tree's modules
    stored = _entries(cache)
    assert len(stored) == 2  # pkg/__init__.py and pkg/mod.py
    # Another tree with the same bytes is served from the cache, named as its own.
    second = _tree(tmp_path / "b", 1)
    again = _import(second, cache)
    assert _entries(cache) == stored
    assert again["file"] == str(second / "pkg" / "mod.py")
    assert again["traceback"] == str(second / "pkg" / "mod.py")
    assert not list(second.rglob("__pycache__"))  # the tree stays as it was


def test_a_changed_byte_is_never_served_the_old_code(tmp_path: Path) -> None:
    cache = tmp_path / "code"
    tree = _tree(tmp_path / "t", 1)
    assert _import(tree, cache)["value"] == 1
    before = _entries(cache)
    # Same size and mtime as before: only the bytes differ.
    mod = tree / "pkg" / "mod.py"
    stat = mod.stat()
    mod.write_text(mod.read_text().replace("VALUE = 1", "VALUE = 2"))
    os.utime(mod, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _import(tree, cache)["value"] == 2
    after = _entries(cache)
    assert len(after) == len(before) + 1 and set(before) < set(after)


def test_a_damaged_entry_is_compiled_again(tmp_path: Path) -> None:
    cache = tmp_path / "code"
    tree = _tree(tmp_path / "t", 7)
    _import(tree, cache)
    name = code_cache.entry_name((tree / "pkg" / "mod.py").read_bytes())
    entry = cache / name[:2] / name
    good = entry.read_bytes()
    for damage in (good[:-5], good[:20], good[:-1] + bytes([good[-1] ^ 1]), b""):
        entry.write_bytes(damage)
        assert code_cache.read_entry(entry) is None
        assert _import(tree, cache)["value"] == 7
        assert entry.read_bytes() == good  # written again, whole


def test_unwritable_cache_still_imports(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    tree = _tree(tmp_path / "t", 3)
    assert _import(tree, blocker / "code")["value"] == 3


def test_proof_processes_are_given_the_cache(tmp_path: Path) -> None:
    env = subprocess_env(tmp_path)
    assert env[code_cache.ENV_VAR].endswith("code")
    args = results.plugin_args(tmp_path / "r.json")
    assert args[args.index(code_cache.MODULE) - 1] == "-p"
    results.copy_plugin(tmp_path)
    assert (tmp_path / f"{code_cache.MODULE}.py").read_bytes() == Path(
        code_cache.__file__
    ).read_bytes()
    assert Path(runner.__file__).with_name("code_cache.py").is_file()

"""Each file's imports, found by a scan of its bytes and kept under its
content's hash: what the closures of :mod:`.closure` are walked over.

The lists are kept across runs (``runtime-names/import-lists-<scanner>.json``
in the cache folder, beside the verdicts, under a digest of this module: a
scan that changed never reads lists an older one made), so a run scans
only files it has not seen. Where none is kept, a forked child scans the
package as a plan starts (:func:`scan_ahead`), on the core ty has no
check for yet.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepstack_patch.engine.forked import Forked

#: An import as a file states it: (level, module, names); ``import a.b`` is
#: (0, "a.b", ()).
Import = tuple[int, str, tuple[str, ...]]


@dataclass(frozen=True)
class Summary:
    """What the key reads of one file: its content's hash and its imports."""

    code: str
    imports: tuple[Import, ...]


_KNOWN: dict[str, Summary] = {}
_LOADED: list[bool] = []
_NEW: dict[str, Summary] = {}
#: The same, by the bytes themselves, for this process.
_BY_CONTENT: dict[bytes, Summary] = {}


def summary(source: bytes | str) -> tuple[Summary, bool]:
    """The file's content hash and imports, and whether it was scanned
    here (not found kept, nor scanned ahead)."""
    raw = source.encode() if isinstance(source, str) else source
    known = _BY_CONTENT.get(raw)
    if known is not None:
        return known, False
    key = hashlib.blake2b(raw, digest_size=20).hexdigest()  # as Summary.code
    if not _LOADED:
        _LOADED.append(True)
        _KNOWN.update(_load())
    if _AHEAD:
        _take_ahead()
    found = _KNOWN.get(key)
    scanned = found is None
    if found is None:
        found = _KNOWN[key] = _NEW[key] = Summary(key, _scanned(raw))
    _BY_CONTENT[raw] = found
    return found, scanned


#: The scan of the package a forked child makes while the plan starts
#: (:func:`scan_ahead`).
_AHEAD: list[Forked] = []


def scan_ahead(root: Path) -> None:
    """Have a forked child scan the imports of every file of ``root``'s
    ``vllm`` package while this process goes on (the first closure of a
    plan scans 2,000 files, a quarter of a second, at a plan's start, when
    ty has yet to be given a check on the other core). Its summaries join
    the known ones, by content: a file that changed since is scanned here.
    Nothing where the lists are kept from an earlier run, or no child can
    be started (:class:`.forked.Forked`); :func:`end_ahead` ends it."""
    if _AHEAD or _LOADED:
        return
    kept = _cache_file()
    if kept is not None and kept.exists():
        return  # the package's import lists are kept: few files to scan
    child = Forked.start(functools.partial(_scanned_package, root))
    if child is not None:
        _AHEAD.append(child)


def _scanned_package(root: Path) -> dict[str, list[list[object]]]:
    """Each file of the package's imports, by its content's hash."""
    found: dict[str, list[list[object]]] = {}
    for folder, _dirs, names in os.walk(root / "vllm"):
        for name in names:
            if name.endswith((".py", ".pyi")):
                with open(os.path.join(folder, name), "rb") as handle:
                    summary = summarise(handle.read())
                found[summary.code] = [list(i) for i in summary.imports]
    return found


def _take_ahead() -> None:
    """The child's summaries (:func:`scan_ahead`), waited for, kept as this
    process's own (and for the cache): none where it gave no answer."""
    answer = _AHEAD.pop().answer()
    try:
        found = {
            code: Summary(code, tuple((lv, m, tuple(n)) for lv, m, n in imports))
            for code, imports in answer.items()  # type: ignore[union-attr]
        }
    except (ValueError, TypeError, AttributeError):
        return  # the child failed: each file is scanned here as it comes
    for code, summary in found.items():
        if code not in _KNOWN:
            _KNOWN[code] = _NEW[code] = summary


@contextlib.contextmanager
def scanning_ahead(root: Path) -> Iterator[None]:
    """:func:`scan_ahead` for as long as this lasts (a plan), then
    :func:`end_ahead`."""
    scan_ahead(root)
    try:
        yield
    finally:
        end_ahead()


def end_ahead() -> None:
    """Stop the child of :func:`scan_ahead` where nobody took its answer
    (a plan with no typed check, an interrupt)."""
    if _AHEAD:
        _AHEAD.pop().stop()


def summarise(raw: bytes) -> Summary:
    """A file's content hash and its imports (:func:`_scanned`)."""
    return Summary(hashlib.blake2b(raw, digest_size=20).hexdigest(), _scanned(raw))


def _scanned(raw: bytes) -> tuple[Import, ...]:
    """A file's imports, found by a scan of its bytes: parsing each module
    of a closure (800 files in vLLM) costs seconds, a scan milliseconds. It
    finds every import statement (one that stands after ``:`` or ``;`` too,
    a parenthesised or continued list of names), and may find more (an
    import in a string): a module too many only makes the key stricter."""
    imports: list[Import] = []
    for m in _statements(raw):
        if m["plain"] is not None:
            names = re.sub(rb"\s+as\s+\w+", b"", _words(m["plain"]))
            imports += [
                (0, name.decode(), ()) for name in re.findall(rb"[\w.]+", names)
            ]
            continue
        names = tuple(n.decode() for n in re.findall(rb"[\w*]+", _words(m["names"])))
        imports.append((len(m["dots"]), m["module"].decode(), names))
    return tuple(imports)


def _words(names: bytes) -> bytes:
    """An import's names without comments, parentheses and continuations."""
    return re.sub(rb"#[^\n]*|[()\\]", b" ", names)


#: An import statement: ``from .m import a, b``, ``from m import (a,\n b)``
#: or ``import m.n as o, p``; one counts at a line's start or after ``:``
#: or ``;`` (:func:`_statements`), and is matched only there.
_IMPORT = re.compile(
    rb"from[ \t]+(?P<dots>\.*)[ \t]*(?P<module>[\w.]*)[ \t]+import[ \t]*"
    rb"(?P<names>\((?:[^)#]|#[^\n]*)*\)|(?:[^\n#;\\]|\\\n)*)"
    rb"|import[ \t]+(?P<plain>(?:[^\n#;\\]|\\\n)+)"
)


def _statements(raw: bytes) -> Iterator[re.Match[bytes]]:
    """The import statements of ``raw``: each match of ``_IMPORT`` where a
    statement starts (after nothing but blanks since the line's start, a
    ``:`` or a ``;``), after the last one found.

    Every such statement holds the word ``import``, which ``bytes.find``
    finds fast: each is matched at the start of the statement the word
    would be in, where that is the word itself or ``from``. (A search of
    the pattern tried every ``f`` and ``i`` of 22 MB of vLLM: 0.27 s, now
    0.10 s; the same matches for every file of 0.20.2 and 30,000 made-up
    texts of its lines and of imports in strings, comments and after
    ``:`` and ``;``.)"""
    done = 0  # the end of the last statement found
    word = raw.find(b"import")
    while word >= 0:
        line = raw.rfind(b"\n", 0, word) + 1
        start = max(
            line, raw.rfind(b":", line, word) + 1, raw.rfind(b";", line, word) + 1
        )
        while start < word and raw[start] in b" \t":
            start += 1
        found = None
        if start >= done and (start == word or raw.startswith(b"from", start)):
            found = _IMPORT.match(raw, start)
        if found is None:
            word = raw.find(b"import", word + 1)
            continue
        yield found
        done = found.end()
        word = raw.find(b"import", max(done, word + 1))


def _cache_file() -> Path | None:
    from deepstack_patch.engine.cache import cache_dir
    from deepstack_patch.engine.errors import DeepstackError

    try:
        folder = cache_dir() / "runtime-names"
    except DeepstackError:
        return None
    return folder / f"import-lists-{_scanner_digest()}.json"


@functools.cache
def _scanner_digest() -> str:
    """This module's code: lists kept by another scan are another file's
    (where the code cannot be read, this package's version stands for it)."""
    try:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    except OSError:
        from deepstack_patch import __version__

        return f"v{__version__}"


def _load() -> dict[str, Summary]:
    file = _cache_file()
    try:
        stored: Any = json.loads(file.read_text()) if file else {}
        return {
            key: Summary(code, tuple((lv, m, tuple(n)) for lv, m, n in imports))
            for key, (code, imports) in stored.items()
        }
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # unreadable: parse again


def save() -> None:
    """Keep the summaries this process made (with those another process
    kept since): a cache that cannot be written only costs time."""
    file = _cache_file()
    if not _NEW or file is None:
        return
    merged = {**_load(), **_NEW}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(
            json.dumps(
                {k: [s.code, [list(i) for i in s.imports]] for k, s in merged.items()}
            )
        )
        partial.replace(file)
        _NEW.clear()
    except OSError:
        pass

"""What the series recognised in a file, kept between runs so it cannot go stale.

Recognising a file is a pure function of its bytes, its path in the tree and
the code that recognises: the patches of the series, the engine, and the
Python whose ``ast`` parses the file. An entry's key is a sha256 over all of
them (the package version, the Python version, the source of every module of
the engine and the patches, the ids of the patches that read the file, the
file's path and every byte of it), so a changed byte anywhere is a new key:
never a stale answer. Only pure recognition is stored (a file none of whose
patches was rewritten in the run), and an entry is used only where nothing
is rewritten from it, so a hit saves the parse and the recognition and
nothing else.

Entries live under ``$DEEPSTACK_PATCH_CACHE/recognised`` (default: the user
cache folder), one small JSON file each, written atomically. Set
``DEEPSTACK_PATCH_NO_CACHE=1`` to neither read nor write them.
"""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from deepstack_patch.engine.protocol import Finding, Patch, PatchState

NO_CACHE_ENV = "DEEPSTACK_PATCH_NO_CACHE"


class RecognitionCache:
    """Findings per (tool code, file path, file bytes), on disk."""

    def __init__(self, directory: Path, fingerprint: bytes) -> None:
        self.directory = directory
        self.fingerprint = fingerprint

    @classmethod
    def for_series(cls, series: Sequence[Patch]) -> RecognitionCache | None:
        """The cache for ``series``; None if disabled or a patch's code
        cannot be read (then nothing is cached)."""
        if os.environ.get(NO_CACHE_ENV) == "1":
            return None
        from deepstack_patch.engine.cache import cache_dir

        fingerprint = _fingerprint(series)
        if fingerprint is None:
            return None
        return cls(cache_dir() / "recognised", fingerprint)

    def _path(self, relpath: str, raw: bytes, patches: Sequence[Patch]) -> Path:
        import hashlib  # loads OpenSSL (about 4 ms): only when the cache is on

        digest = hashlib.sha256(self.fingerprint)
        for part in (relpath.encode(), ",".join(p.id for p in patches).encode()):
            digest.update(len(part).to_bytes(8, "little") + part)
        digest.update(raw)
        key = digest.hexdigest()
        return self.directory / key[:2] / f"{key}.json"

    def load(
        self, relpath: str, raw: bytes, patches: Sequence[Patch]
    ) -> list[list[Finding]] | None:
        """Each patch's findings in the file, or None if not cached."""
        try:
            document = json.loads(self._path(relpath, raw, patches).read_bytes())
            found = [[_finding(item) for item in per] for per in document["findings"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return found if len(found) == len(patches) else None

    def store(
        self,
        relpath: str,
        raw: bytes,
        patches: Sequence[Patch],
        found: Sequence[Sequence[Finding]],
    ) -> None:
        """Keep the findings; a finding that JSON cannot carry whole (a field
        this cache does not know) is not stored, nor is anything on a write
        error (the cache is an optimisation, never a failure)."""
        document = {"findings": [[_document(f) for f in per] for per in found]}
        try:
            # Through JSON and back: a detail JSON cannot carry whole (a
            # tuple, a node) makes the round trip differ, and is not stored.
            text = json.dumps(document, default=_read_only_mapping)
            restored = [
                [_finding(i) for i in per] for per in json.loads(text)["findings"]
            ]
        except (TypeError, ValueError):
            return
        if restored != [list(per) for per in found]:
            return
        from deepstack_patch.engine.cache import write_atomically

        write_atomically(self._path(relpath, raw, patches), text)


#: Fingerprints by the series' modules: the code a process loaded does not
#: change while it runs (a matrix worker asks once per release).
_FINGERPRINTS: dict[tuple[str, ...], bytes | None] = {}


def _fingerprint(series: Sequence[Patch]) -> bytes | None:
    # With the origins: derived patches share one module, and differ in data.
    modules = tuple(f"{type(patch).__module__} {patch.origin}" for patch in series)
    if modules not in _FINGERPRINTS:
        _FINGERPRINTS[modules] = _code_fingerprint(series)
    code = _FINGERPRINTS[modules]
    # A patch made from data (a derived patch) recognises what its data
    # says: the data is part of the code that recognises.
    data = [getattr(patch, "data_fingerprint", b"") for patch in series]
    if code is None or not any(data):
        return code
    import hashlib

    return hashlib.sha256(code + b"\0".join(data)).digest()


def _code_fingerprint(series: Sequence[Patch]) -> bytes | None:
    import hashlib

    from deepstack_patch import __version__
    from deepstack_patch.engine.series import patch_file

    sources = engine_sources()
    origins = [patch.origin for patch in series]
    tops: set[Path] = set()  # each walked once: 40 derived patches share one
    for patch in series:
        module = sys.modules.get(type(patch).__module__)
        filename = getattr(module, "__file__", None)
        if filename is None:
            return None
        # A patch from a --patches folder: its data file or module is its code.
        origin_file = patch_file(patch)
        if origin_file is not None:
            sources.add(origin_file)
            if Path(filename) == origin_file:
                continue  # a module loaded alone, not from a package
        # The whole package a patch lives in: a patch package imports its
        # siblings (shared helpers, follow-ups), and any of them can change
        # what it recognises.
        tops.add(_package_top(Path(filename).parent))
    for top in tops:
        sources.update(top.rglob("*.py"))
    digest = hashlib.sha256(f"{__version__}\0{sys.version}\0".encode())
    digest.update("\0".join(origins).encode())  # an installed package's version
    try:
        for path in sorted(sources):
            data = path.read_bytes()
            digest.update(f"{path.name}\0{len(data)}\0".encode() + data)
    except OSError:
        return None
    return digest.digest()


def engine_sources() -> set[Path]:
    """The engine's own code, its subpackages included: a derived patch is
    recognised by ``engine/derived``, whose change must make new keys as
    much as one of the engine's top modules."""
    return set(Path(__file__).parent.rglob("*.py"))


def _package_top(folder: Path) -> Path:
    """The outermost package folder holding ``folder``."""
    while (folder.parent / "__init__.py").exists():
        folder = folder.parent
    return folder


def _document(finding: Finding) -> dict[str, object]:
    return {
        "state": finding.state.value,
        "symbol": finding.symbol,
        "line": finding.line,
        "span": list(finding.span),
        "reason": finding.reason,
        "part": finding.part,
        "rewrites": list(finding.rewrites),
        "details": dict(finding.details),
    }


def _finding(item: dict[str, object]) -> Finding:
    first, last = item["span"]  # type: ignore[misc]
    return Finding(
        state=PatchState(item["state"]),
        symbol=str(item["symbol"]),
        line=int(item["line"]),  # type: ignore[call-overload]
        span=(int(first), int(last)),
        reason=str(item["reason"]),
        part=str(item["part"]),
        rewrites=tuple(str(name) for name in item["rewrites"]),  # type: ignore[attr-defined]
        details=_tuples(item.get("details", {})),  # type: ignore[arg-type]
    )


def _read_only_mapping(value: object) -> dict[str, object]:
    """``json.dumps``'s hook: a read-only mapping in ``details`` as an object."""
    if isinstance(value, types.MappingProxyType):
        return dict(value)
    raise TypeError(f"{type(value).__name__} in a finding's details")


def _tuples(value: object, top: bool = True) -> object:
    """JSON's lists back as the tuples recognition keeps in ``details``, and
    its objects as the read-only mappings (a detail that was a list comes
    back a tuple, differs, and is not stored)."""
    match value:
        case list():
            return tuple(_tuples(item, top=False) for item in value)
        case dict():
            items = {key: _tuples(item, top=False) for key, item in value.items()}
            return items if top else types.MappingProxyType(items)
    return value

"""A vLLM source tree on disk: where it is, which release it is, its files."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError

_VERSION_ASSIGNMENT = re.compile(
    r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE
)


@dataclass(frozen=True)
class VllmTree:
    root: Path
    version: str
    #: Where the version was read: ``PKG-INFO``, ``vllm/_version.py``,
    #: ``git describe`` or ``unknown``.
    version_source: str

    @classmethod
    def open(cls, path: str | Path) -> VllmTree:
        root = Path(path).expanduser()
        if not root.exists():
            raise DeepstackError(
                f"--vllm-src {path}: no such file or directory",
                "pass the root of a vLLM source tree (the folder that holds "
                "vllm/__init__.py), or use --release VERSION to fetch one",
            )
        if not root.is_dir():
            raise DeepstackError(
                f"--vllm-src {path}: is a file, not a directory",
                "pass the root of a vLLM source tree (the folder that holds "
                "vllm/__init__.py)",
            )
        if not (root / "vllm" / "__init__.py").is_file():
            raise DeepstackError(
                f"--vllm-src {path}: not a vLLM source tree "
                f"(looked for {root / 'vllm' / '__init__.py'})",
                "pass the folder that contains the vllm/ package, e.g. the root "
                "of a vLLM git checkout or of an extracted vllm-X.Y.Z.tar.gz",
            )
        root = root.resolve()
        version, source = detect_version(root)
        return cls(root=root, version=version, version_source=source)

    def glob(self, patterns: tuple[str, ...] | list[str]) -> list[str]:
        """Relative paths of the regular ``.py`` files matching any pattern.

        As ``Path.glob`` finds them (``**`` spans folders without entering a
        linked one; a link counts as a file), from one ``os.walk`` of the
        pattern's fixed folder: a third of the time on a vLLM tree.
        """
        found: set[str] = set()
        for pattern in patterns:
            folders = pattern.split("/")[:-1]
            if "[" in pattern or any(
                ("*" in part or "?" in part) and part != "**" for part in folders
            ):  # classes, or wildcard folders (which enter links): pathlib
                found.update(
                    path.relative_to(self.root).as_posix()
                    for path in self.root.glob(pattern)
                    if path.is_file() or path.is_symlink()
                )
            else:
                found.update(_walk_glob(self.root, pattern))
        return sorted(found)


def detect_version(root: Path) -> tuple[str, str]:
    """The release of a tree: sdist metadata, setuptools-scm file, or git."""
    pkg_info = root / "PKG-INFO"
    if pkg_info.is_file():
        fields = dict(
            line.split(": ", 1)
            for line in pkg_info.read_text(errors="replace").splitlines()[:20]
            if ": " in line
        )
        if fields.get("Name", "").lower() == "vllm" and "Version" in fields:
            return fields["Version"].strip(), "PKG-INFO"
    version_file = root / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION_ASSIGNMENT.search(version_file.read_text(errors="replace"))
        if match:
            return match.group(1), "vllm/_version.py"
    if (root / ".git").exists():
        import subprocess  # a checkout without version metadata only

        try:
            described = subprocess.run(
                ["git", "-C", str(root), "describe", "--tags", "--always"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            described = ""
        if described:
            return described.removeprefix("v"), "git describe"
    return "unknown", "unknown"


def _walk_glob(root: Path, pattern: str) -> Iterator[str]:
    parts = pattern.split("/")
    fixed = 0
    while fixed < len(parts) and not any(c in parts[fixed] for c in "*?"):
        fixed += 1
    if fixed == len(parts):
        path = root / pattern
        if path.exists() and (path.is_file() or path.is_symlink()):
            yield pattern
        return
    matches = glob_regex(pattern).match
    # Without "**" a match lies this many folders below the fixed part.
    depth = None if "**" in parts[fixed:] else len(parts) - fixed - 1
    base = os.path.join(root, *parts[:fixed])
    prefix = "/".join(parts[:fixed])
    for folder, dirs, files in os.walk(base):
        relative = os.path.relpath(folder, base).replace(os.sep, "/")
        below = "" if relative == "." else relative + "/"
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        if depth is not None and below.count("/") >= depth:
            dirs[:] = []
        for name in [*files, *links]:
            relpath = f"{prefix}/{below}{name}" if prefix else f"{below}{name}"
            if matches(relpath):
                yield relpath


def glob_matcher(patterns: Iterable[str]) -> Callable[[str], bool] | None:
    """Whether a relative path can be one of :meth:`VllmTree.glob`'s files for
    ``patterns``: to choose what to extract from an archive before there is a
    tree. None when a pattern has a character class (``[ab]``), which only
    pathlib's rules decide."""
    patterns = list(patterns)
    if any("[" in pattern for pattern in patterns):
        return None
    combined = re.compile("|".join(glob_regex(p).pattern for p in patterns))
    return lambda relpath: combined.match(relpath) is not None


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A tree glob (``**/`` spans folders, ``*`` does not) as a regex."""
    pieces = []
    for piece in re.split(r"(\*\*/|\*|\?)", pattern):
        if piece == "**/":
            pieces.append("(?:[^/]+/)*")
        elif piece == "*":
            pieces.append("[^/]*")
        elif piece == "?":
            pieces.append("[^/]")
        else:
            pieces.append(re.escape(piece))
    return re.compile("".join(pieces) + r"\Z")


def link_copy(source: Path, destination: Path) -> Path:
    """A copy of the tree ``source`` at ``destination``, made of hard links
    where the file system allows (else copies); ``.git`` and bytecode left out.

    Safe to patch: the engine replaces files (write, then rename), never
    writes into them, so the source tree's files never change.
    """
    import shutil

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(
        source,
        destination,
        copy_function=link,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", "__pycache__"),
    )
    return destination


def dist_info_beside(root: Path) -> Path | None:
    """The ``vllm-*.dist-info`` folder beside ``root/vllm``, if ``root`` has one."""
    found = [
        path
        for path in sorted(root.glob("vllm-*.dist-info"))
        if (path / "METADATA").is_file() and (path / "RECORD").is_file()
    ]
    match found:
        case []:
            return None
        case [one]:
            return one
        case _:
            raise DeepstackError(
                f"{root}: holds several vllm distributions: "
                + ", ".join(p.name for p in found),
                "remove the stale dist-info folder(s) (pip left them behind), "
                "keeping the one whose RECORD matches the installed files",
            )


# -- whole trees and partial extractions (read by engine/context.py) -----------


#: A tree with one of these files is whole: a file it lacks is not in the
#: release (as is any tree without :data:`ASKED_FOR`).
_WHOLE_TREE = ("pyproject.toml", "setup.py")

#: So is an installed vLLM (site-packages): its wheel put every file there.
_INSTALLED = "vllm-*.dist-info"

#: The file in which a partial extraction lists the globs it was asked for,
#: one a line (written by ``fetch.archives.extract_release``): a file that
#: matches one and is not there is not in the release.
ASKED_FOR = ".deepstack-asked-for"


def _asked_for(root: Path) -> Callable[[str], bool] | None:
    """What the tree at ``root`` was asked to hold: None for a whole tree
    (every file of the release: a checkout, an sdist, an installed vLLM, or
    a folder this tool did not extract partially whose package holds what
    it imports: a vendor's repository that holds ``vllm/`` without
    ``pyproject.toml``), else a matcher of the paths the tool's partial
    extraction was asked for (nothing, where its list cannot be read or the
    tree cannot tell)."""
    if any((root / name).is_file() for name in _WHOLE_TREE) or any(
        (found / "RECORD").is_file() for found in root.glob(_INSTALLED)
    ):
        return None
    if not (root / ASKED_FOR).exists():
        # Not the tool's partial extraction: whole where its package holds
        # what its own files import (a copy of a release, a vendor's
        # repository), so that what a derived patch reads is looked up; a
        # few files of it (a vendor's fork) cannot tell: nothing is lacked,
        # and a derived patch says its runtime names went unchecked.
        return None if holds_its_package(root) else (lambda _relpath: False)
    try:
        listed = (root / ASKED_FOR).read_text().split("\n")
    except (OSError, UnicodeDecodeError):
        listed = []
    # A class glob ([ab]) is left out: its files are then unknown, never lacked.
    patterns = [line for line in listed if line and "[" not in line]
    matcher = glob_matcher(patterns) if patterns else None
    return matcher or (lambda _relpath: False)


#: The share of the ``vllm`` modules a tree's own files import that a tree
#: without a marker must hold to be read as whole: an sdist lacks only its
#: compiled extensions and vendored builds (0.20.2: 1,018 of 1,035); a
#: vendor's five files of it hold 2 of the 61 they import.
_HELD_SHARE = 0.9

_VLLM_IMPORT = re.compile(
    rb"^[ \t]*(?:from[ \t]+(vllm(?:\.\w+)*)[ \t]+import|import[ \t]+(vllm(?:\.\w+)*))",
    re.MULTILINE,
)


def holds_its_package(root: Path) -> bool:
    """Whether the tree's ``vllm`` package holds the ``vllm`` modules its own
    files import (:data:`_HELD_SHARE` of them; none imported: nothing says a
    file is missing)."""
    imported: set[str] = set()
    for folder, _dirs, names in os.walk(root / "vllm"):
        for name in names:
            if name.endswith((".py", ".pyi")):
                try:
                    raw = Path(folder, name).read_bytes()
                except OSError:
                    continue
                imported.update(
                    (m[1] or m[2]).decode() for m in _VLLM_IMPORT.finditer(raw)
                )
    if not imported:
        return True
    held = sum(
        (root / f"{base}.py").is_file() or (root / base).is_dir()
        for base in (module.replace(".", "/") for module in imported)
    )
    return held >= _HELD_SHARE * len(imported)

"""A vLLM source tree on disk: where it is, which release it is, its files."""

from __future__ import annotations

import re
import subprocess
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
        """Relative paths of the regular ``.py`` files matching any pattern."""
        found: set[str] = set()
        for pattern in patterns:
            for path in self.root.glob(pattern):
                if path.is_file() or path.is_symlink():
                    found.add(path.relative_to(self.root).as_posix())
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

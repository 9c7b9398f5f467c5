"""targets.toml: the supported releases and what each patch must be on each."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .errors import DeepstackError
from .protocol import PatchState

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class PatchTargets:
    expected: dict[str, PatchState]
    cpu_tests: list[str] = field(default_factory=list)
    gpu_tests: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Targets:
    releases: list[str]
    patches: dict[str, PatchTargets]

    def expected(self, release: str) -> dict[str, PatchState]:
        return {
            patch_id: rows.expected[release]
            for patch_id, rows in self.patches.items()
            if release in rows.expected
        }


def default_targets_path() -> Path:
    """The targets.toml shipped with the package (the repo's top-level one)."""
    return Path(str(resources.files("deepstack_patch").joinpath("targets.toml")))


def load_targets(path: Path | None = None) -> Targets:
    path = path or default_targets_path()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DeepstackError(f"{path}: cannot read targets: {exc}") from None
    patches = {}
    for patch_id, table in data.get("patches", {}).items():
        try:
            expected = {
                release: PatchState(state)
                for release, state in table.get("expected", {}).items()
            }
        except ValueError as exc:
            raise DeepstackError(
                f"{path}: [patches.{patch_id!r}.expected]: {exc}",
                "states are: " + ", ".join(s.value for s in PatchState),
            ) from None
        patches[patch_id] = PatchTargets(
            expected=expected,
            cpu_tests=list(table.get("cpu_tests", [])),
            gpu_tests=list(table.get("gpu_tests", [])),
        )
    return Targets(releases=list(data.get("releases", [])), patches=patches)

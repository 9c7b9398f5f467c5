"""targets.toml: the supported releases and what each patch must be on each."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import PatchState

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class PatchTargets:
    expected: dict[str, PatchState]
    cpu_tests: list[str] = field(default_factory=list)
    gpu_tests: list[str] = field(default_factory=list)
    #: test -> (release specifier, why): a test given as a table
    #: ``{test = "...", releases = ">=0.20.0", why = "..."}`` runs only on
    #: the releases the specifier matches (a file a release ships but cannot
    #: collect, say).
    test_releases: dict[str, tuple[str, str]] = field(default_factory=dict)

    def runs_on(self, test: str, version: str) -> tuple[bool, str]:
        """Whether ``test`` runs on release ``version``, and why not."""
        if test not in self.test_releases:
            return True, ""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        spec, why = self.test_releases[test]
        try:
            matches = Version(version) in SpecifierSet(spec)
        except InvalidVersion:
            matches = True  # a checkout's version: run it, and let it judge
        return matches, "" if matches else f"only on vLLM {spec}: {why}"


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
        raise DeepstackError(
            f"{path}: cannot read targets: {exc}",
            "give a readable targets.toml (see the one shipped with the tool, "
            "and docs/vendor.md)",
        ) from None
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
        conditions: dict[str, tuple[str, str]] = {}
        tests = {
            kind: _tests(path, patch_id, table.get(kind, []), conditions)
            for kind in ("cpu_tests", "gpu_tests")
        }
        patches[patch_id] = PatchTargets(
            expected=expected,
            cpu_tests=tests["cpu_tests"],
            gpu_tests=tests["gpu_tests"],
            test_releases=conditions,
        )
    return Targets(releases=list(data.get("releases", [])), patches=patches)


def _tests(
    path: Path, patch_id: str, entries: list, conditions: dict[str, tuple[str, str]]
) -> list[str]:
    """Test ids from strings or ``{test, releases, why}`` tables."""
    tests = []
    for entry in entries:
        if isinstance(entry, str):
            tests.append(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("test"), str):
            tests.append(entry["test"])
            if "releases" in entry:
                conditions[entry["test"]] = (
                    str(entry["releases"]),
                    str(entry.get("why", "")),
                )
        else:
            raise DeepstackError(
                f"{path}: [patches.{patch_id!r}]: test entry {entry!r} is neither "
                "a pytest node id nor a table with `test`",
                'write "tests/x.py::test_y" or {test = "tests/x.py", releases = '
                '">=0.20.0", why = "..."}',
            )
    return tests

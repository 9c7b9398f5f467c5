"""Which of a patch's changed files its recorded tests exercised.

A derived patch's recorded tests are its pull request's, and a pull request
that changes three files may test one of them (vllm#46308 changes three tool
parsers; on 0.20.2 one parser's test passed and the other two's could not
run). A verdict that says ``proven`` must hold for every file the fix
changes, so each changed file is matched with the recorded tests that test
it, as test-impact tools select tests, statically, by import and by name:

- by import: the test file imports the file's module (``import vllm.a.b``,
  ``from vllm.a.b import x``, ``from vllm.a import b``, at any depth of the
  test file);
- by name: the test file is named after it (``test_b.py`` or ``b_test.py``
  for ``vllm/a/b.py``): vllm#46308's hunyuan test reaches its parser through
  the parsers' registry, by name, and imports none of it.

A changed file is exercised where at least one of its tests passed on the
patched tree and, where the run watched the lines of the file's changed
functions (``executed.py``), ran one of them: a test that passed without
running them counts as :data:`NOT_RUN_HERE`, and a test that ran them is
the file's even where it neither imports it nor is named after it. Its
other tests' outcomes are counted with the words the proof's message uses
(``could not run``, ``does not fit this release``...).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from deepstack_patch.engine.protocol import RecordedTest
from deepstack_patch.proof.imports import module_name
from deepstack_patch.proof.recorded_tests import sort_cases
from deepstack_patch.proof.results import TestCase

NO_TEST = "no recorded test imports it or is named after it"
#: A test that passed without running the file's changed functions.
NOT_RUN_HERE = "passed without running its changed code"


@dataclass(frozen=True)
class ChangedFile:
    """One file a patch changes, and what its recorded tests said there."""

    path: str
    #: The outcomes of the recorded tests that test it, on the patched tree,
    #: as counts by the proof's words (``passed``, ``could not run``...).
    outcomes: tuple[tuple[str, int], ...] = ()

    @property
    def exercised(self) -> bool:
        return dict(self.outcomes).get("passed", 0) > 0

    @property
    def words(self) -> str:
        """``vllm/a.py (2 could not run)``, or why no test of it ran."""
        counts = ", ".join(f"{count} {label}" for label, count in self.outcomes)
        return f"{self.path} ({counts or NO_TEST})"

    def json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "exercised": self.exercised,
            "tests": dict(self.outcomes),
        }


def changed_files_exercised(
    changed_files: Sequence[str],
    recorded: Sequence[RecordedTest],
    cases: Sequence[TestCase],
    misfits: Mapping[str, str],
    watched: frozenset[str] = frozenset(),
) -> list[ChangedFile]:
    """Each changed file with the outcomes, on the patched tree (``cases``),
    of the recorded tests that test it (see the module docstring);
    ``watched``: the changed units whose lines the run watched."""
    found = []
    for path in changed_files:
        mine = {part for part in watched if part.split("::")[0] == path}
        own_files = {test.path for test in recorded if covers(test, path)}
        own_cases = [
            case
            for case in cases
            if case.file in own_files or mine & set(case.reached or ())
        ]
        sorted_cases = sort_cases(own_cases, False, misfits)
        if mine:  # passed, but ran none of the file's watched code
            ran, missed = [], []
            for case in sorted_cases["passed"]:
                ran_it = case.reached is None or mine & set(case.reached)
                (ran if ran_it else missed).append(case)
            sorted_cases["passed"], sorted_cases[NOT_RUN_HERE] = ran, missed
        outcomes = tuple(
            (label, len(told)) for label, told in sorted_cases.items() if told
        )
        found.append(ChangedFile(path, outcomes))
    return found


def covers(test: RecordedTest, path: str) -> bool:
    """The recorded test file imports ``path``'s module or is named after it."""
    stem = PurePosixPath(path).stem
    named = PurePosixPath(test.path).stem
    if stem != "__init__" and stem in (
        named.removeprefix("test_"),
        named.removesuffix("_test"),
    ):
        return True
    module = module_name(path)
    return module is not None and module in imported_modules(test.content)


def imported_modules(source: str) -> set[str]:
    """Every module a test file names in an absolute import, anywhere in it:
    ``from a.b import c`` names ``a.b`` and ``a.b.c`` (``c`` may be a module)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        match node:
            case ast.Import(names=names):
                found.update(alias.name for alias in names)
            case ast.ImportFrom(module=str(module), level=0, names=names):
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in names)
    return found

"""The whole series on every release in targets.toml, fetched from the index.

For each release: `status` equals targets.toml; `apply` to a copy leaves
every needed patch applied; a second `apply` writes nothing; no file other
than the targets changes; and each rewritten function equals upstream's fixed
function wherever the release's code was upstream's base.

These are the release states' one place: other files take a release's plan
from the same ``release_plan`` fixture (``tests/support/plans.py``), made
once per run, rather than assert these states again.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.syntax import iter_functions
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES

from tests.support import TARGETS
from tests.support.facts import asserted
from tests.support.plans import ReleasePlans

pytestmark = pytest.mark.release
RELEASES = [pytest.param(v, id=v) for v in TARGETS.releases]
RELEASES_NEEDING_PATCHES = [
    pytest.param(v, id=v)
    for v in TARGETS.releases
    if PatchState.NEEDED in TARGETS.expected(v).values()
]


def states(plan: Plan) -> dict[str, PatchState]:
    return {report.patch.id: report.state for report in plan.reports}


def test_every_patch_has_rows_for_every_release() -> None:
    """targets.toml names an expected state for every patch on every
    release: what makes the release tests below complete (no release read)."""
    for patch in SERIES:
        assert patch.id in TARGETS.patches, (
            f"targets.toml has no [patches.{patch.id!r}]"
        )
        missing = set(TARGETS.releases) - set(TARGETS.patches[patch.id].expected)
        assert not missing, f"{patch.id}: no expected state for {sorted(missing)}"


@pytest.mark.parametrize("version", RELEASES)
def test_status_matches_targets(
    version: str, release_tree: Callable[[str], Path], release_plan: ReleasePlans
) -> None:
    """The state of every patch on the release, as ``status`` reads it
    (recognition only, nothing rewritten), is targets.toml's: the one test
    of each release's expected states."""
    tree = VllmTree.open(release_tree(version))
    assert tree.version == version
    plan = release_plan(version, rewrite=False)
    assert states(plan) == TARGETS.expected(version), _describe(plan)
    for patch_id in states(plan):
        asserted("status equals targets.toml", version, patch_id)


@pytest.mark.parametrize("version", RELEASES)
def test_apply(
    version: str,
    patched_copy: Callable[[str], Path],
    release_tree: Callable[[str], Path],
    release_plan: ReleasePlans,
) -> None:
    """The plan that writes (every rewrite made) agrees with ``status``;
    writing it into a copy changes exactly the files it names and leaves the
    pristine release intact; after it every needed patch is ``applied`` and a
    second plan writes nothing. The plan is the run's shared one: the copy
    has the release's bytes."""
    root = patched_copy(version)
    tree = VllmTree.open(root)
    before = release_plan(version)
    # The plan that writes agrees with `status`, which skips most rewrites.
    assert states(before) == TARGETS.expected(version), _describe(before)
    for patch_id in states(before):
        asserted("the writing plan equals targets.toml", version, patch_id)
    pristine = {edit.relpath: edit.old for edit in before.edits}
    inodes = _inodes(root)

    written = write_edits(root, before.edits)

    expected_files = {
        loc.path
        for report in before.reports
        for loc in report.locations
        if loc.state is PatchState.NEEDED
    }
    assert set(written) == expected_files
    changed = {
        path for path, inode in _inodes(root).items() if inodes.get(path) != inode
    }
    assert changed == expected_files, "files other than the targets changed"
    original = release_tree(version)
    for relpath, old in pristine.items():  # the hard-linked original is intact
        assert (original / relpath).read_bytes() == old
    asserted("apply writes the targets only", version, "series")

    after = plan_tree(tree, SERIES)
    for report in after.reports:
        was = before.report(report.patch.id).state
        want = PatchState.APPLIED if was is PatchState.NEEDED else was
        assert report.state is want, f"{report.patch.id}: {report.state} after apply"
        asserted("the state after apply", version, report.patch.id)
    assert after.edits == [], "a second apply would write again"
    asserted("a second apply writes nothing", version, "series")


@pytest.mark.parametrize("version", RELEASES_NEEDING_PATCHES)
def test_rewrites_equal_upstream(
    version: str, release_tree: Callable[[str], Path], release_plan: ReleasePlans
) -> None:
    """Each patch's functions are upstream's, where its input was upstream's base.

    Patches are taken one by one in series order, each on the code the
    patches before it left (two patches may rewrite the same function), and
    compared with the first upstream release that has the fix. Where the code
    a patch saw differs from upstream's base (the last release needing it),
    the release has its own shape and identity cannot be asked for.
    """
    pristine = release_tree(version)
    earlier: set[str] = set()
    previous: dict[str, bytes] = {}
    compared = 0
    # A model file upstream's fixed release does not have (a class the patch
    # fixes by its shape, added after upstream's fix): nothing to compare.
    without_upstream: list[str] = []
    for patch in SERIES:
        plan = release_plan(version, earlier | {patch.id})
        current = {edit.relpath: edit.new for edit in plan.edits}
        base = _upstream_base(patch.id, patch.fixed_in)
        for loc in plan.report(patch.id).locations:
            if loc.state is not PatchState.NEEDED:
                continue
            fixed_file = release_tree(patch.fixed_in) / loc.path
            if not fixed_file.exists():
                without_upstream.append(f"{patch.id} {loc.path}")
                continue
            fixed = _functions(fixed_file.read_bytes())
            seen = _functions(
                previous.get(loc.path) or (pristine / loc.path).read_bytes()
            )
            patched = _functions(current[loc.path])
            base_file = release_tree(base) / loc.path if base else None
            base_functions = (
                _functions(base_file.read_bytes())
                if base_file and base_file.exists()
                else {}
            )
            for name in loc.finding.rewrites:
                if name not in fixed:
                    continue  # upstream moved or renamed it: nothing to compare
                compared += 1
                if _dump(patched.get(name)) != _dump(fixed[name]):
                    assert _dump(seen.get(name)) != _dump(base_functions.get(name)), (
                        f"{patch.id}: {loc.path} {name} was upstream's base in "
                        f"{version} but differs from vLLM {patch.fixed_in}'s after "
                        "the rewrite"
                    )
                check = f"the rewrite of {loc.path} {name} is upstream's"
                asserted(check, version, patch.id)
        earlier.add(patch.id)
        previous = current
    assert compared or without_upstream, (
        f"no rewritten function of {version} was compared with upstream"
    )


def _upstream_base(patch_id: str, fixed_in: str) -> str | None:
    """The last release before ``fixed_in`` that needs the patch."""
    from packaging.version import Version

    needing = [
        release
        for release, state in TARGETS.patches[patch_id].expected.items()
        if state is PatchState.NEEDED and Version(release) < Version(fixed_in)
    ]
    return max(needing, key=Version) if needing else None


def _functions(source: bytes) -> dict[str, ast.AST]:
    return dict(iter_functions(ast.parse(source)))


def _dump(node: ast.AST | None) -> str | None:
    return ast.dump(node) if node is not None else None


def _inodes(root: Path) -> dict[str, int]:
    return {
        path.relative_to(root).as_posix(): path.stat().st_ino
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink()
    }


def _describe(plan: Plan) -> str:
    return "\n".join(
        f"{r.patch.id}: {r.state} {r.reason} "
        + ", ".join(f"{loc.path}:{loc.finding.line}" for loc in r.locations)
        for r in plan.reports
    )

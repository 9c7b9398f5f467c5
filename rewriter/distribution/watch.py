"""Watch upstream: which releases changed the code a carried fix depends on.

For each pair of consecutive releases, every patch's footprint (see
:mod:`deepstack_patch.engine.footprint`) is compared function by function,
without comments, formatting or docstrings. Every change is classed:

- ``carried``: the series itself writes it. The series is applied in memory
  to the earlier release, and the function then equals the later release's.
  A change that holds a carried fix plus anything else is not carried: the
  rest is unreviewed code, so it is ``new`` (its diff shows both).
- ``known``: a person reviewed it for that patch and recorded why it is
  harmless, in ``watch.toml`` (beside ``targets.toml``).
- ``new``: someone should read it.

Release sources come from the verified cache, in the same partial extraction
``status --release`` reads; the index's list of releases is cached too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.footprint import (
    FootprintFunction,
    FunctionCode,
    SourceReader,
    footprints,
    function_diff,
)
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.tree import VllmTree

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CARRIED = "carried"
KNOWN = "known"
NEW = "new"


@dataclass(frozen=True)
class Reviewed:
    """A change a person read and recorded as harmless to a patch."""

    patch: str
    release: str
    symbol: str
    reason: str
    reviewed: str
    path: str = ""

    def matches(self, change: WatchChange) -> bool:
        return (self.patch, self.release, self.symbol) == (
            change.patch_id,
            change.release,
            change.symbol,
        ) and self.path in ("", change.path)


@dataclass(frozen=True)
class UpstreamCommit:
    sha: str
    subject: str
    pull_request: str

    def json(self) -> dict[str, Any]:
        return {"sha": self.sha, "subject": self.subject, "pr": self.pull_request}


@dataclass
class WatchChange:
    """One footprint function that changed between two releases."""

    patch_id: str
    previous: str
    release: str
    path: str
    symbol: str
    #: The function's first line in ``release`` (in ``previous`` if removed).
    line: int
    #: ``changed``, ``added`` or ``removed``.
    kind: str
    #: Why the function is in the footprint (rewritten, writes self.x, ...).
    why: str
    diff: str
    classification: str = NEW
    #: ``carried``: the patches whose rewrite makes this change.
    carried_by: list[str] = field(default_factory=list)
    #: ``known``: the reason recorded in watch.toml.
    reason: str = ""
    #: ``new``: the series rewrites this function too, but not into this.
    series_rewrites: bool = False
    commits: list[UpstreamCommit] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        return {
            "patch": self.patch_id,
            "previous": self.previous,
            "release": self.release,
            "path": self.path,
            "line": self.line,
            "symbol": self.symbol,
            "kind": self.kind,
            "why": self.why,
            "class": self.classification,
            "carried_by": self.carried_by,
            "reason": self.reason,
            "series_rewrites": self.series_rewrites,
            "commits": [c.json() for c in self.commits],
            "diff": self.diff,
        }


@dataclass
class WatchResult:
    releases: list[str]
    patch_ids: list[str]
    #: patch id -> release -> number of footprint functions there.
    sizes: dict[str, dict[str, int]]
    changes: list[WatchChange]
    reviewed_file: str
    #: The reviewed changes are the tool's own watch.toml (no --reviewed):
    #: a user's review belongs in a file of their own, which an upgrade of
    #: the tool does not replace.
    reviewed_shipped: bool = False

    @property
    def new(self) -> list[WatchChange]:
        return [c for c in self.changes if c.classification == NEW]

    def json(self) -> dict[str, Any]:
        return {
            "releases": self.releases,
            "reviewed_file": self.reviewed_file,
            "patches": [
                {"id": patch_id, "footprint_sizes": self.sizes[patch_id]}
                for patch_id in self.patch_ids
            ],
            "changes": [c.json() for c in self.changes],
            "counts": {
                name: sum(c.classification == name for c in self.changes)
                for name in (CARRIED, KNOWN, NEW)
            },
        }


def default_reviewed_path() -> Path:
    """The watch.toml shipped with the package (the repo's top-level one)."""
    # Resolved: in a checkout the packaged name is a link to the top-level file,
    # which is the one to edit.
    return Path(
        str(resources.files("deepstack_patch").joinpath("watch.toml"))
    ).resolve()


def _reason(exc: Exception) -> str:
    """An OSError's reason without its errno and repeated file name."""
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


def load_reviewed(path: Path | None = None) -> list[Reviewed]:
    path = path or default_reviewed_path()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        message = f"{path}: cannot read the reviewed changes: {_reason(exc)}"
        raise DeepstackError(
            message,
            "give a readable TOML file of [[reviewed]] entries with --reviewed, "
            "or leave --reviewed out for the watch.toml shipped with the tool",
        ) from None
    entries = []
    for number, entry in enumerate(data.get("reviewed", []), start=1):
        missing = [k for k in ("patch", "release", "symbol", "reason", "reviewed")]
        missing = [k for k in missing if not str(entry.get(k, "")).strip()]
        if missing:
            raise DeepstackError(
                f"{path}: [[reviewed]] entry {number} lacks {', '.join(missing)}",
                "each entry names patch, release, symbol, a one-line reason and "
                "the reviewed date (YYYY-MM-DD); path is optional",
            )
        entries.append(
            Reviewed(
                patch=entry["patch"],
                release=entry["release"],
                symbol=entry["symbol"],
                reason=entry["reason"],
                reviewed=str(entry["reviewed"]),
                path=entry.get("path", ""),
            )
        )
    return entries


def releases_between(
    since: str, until: str | None, available: Sequence[str]
) -> list[str]:
    """The releases from ``since`` to ``until`` (both included), oldest first."""
    from packaging.version import InvalidVersion, Version

    try:
        low, high = Version(since), Version(until) if until else None
    except InvalidVersion as exc:
        raise DeepstackError(f"{exc}", "give versions like 0.23.0") from None
    if high is not None and high < low:
        raise DeepstackError(
            f"--until {until} is older than --since {since}", "swap them"
        )
    for bound, name in ((since, "--since"), (until, "--until")):
        if bound is not None and bound not in available:
            raise DeepstackError(
                f"{name} {bound}: the package index has no source release of it",
                "choose one of: " + ", ".join(available[-12:]),
            )
    chosen = [
        v
        for v in available
        if low <= Version(v) and (high is None or Version(v) <= high)
    ]
    if len(chosen) < 2:
        raise DeepstackError(
            f"from {since} to {until or 'the newest release'} there is only "
            f"{', '.join(chosen) or 'no release'}: nothing to compare",
            "give an earlier --since or a later --until",
        )
    return chosen


@dataclass
class _Release:
    version: str
    tree: VllmTree
    reader: SourceReader
    footprints: dict[str, list[FootprintFunction]]
    #: The patches upstream's code has fixed in this release (state applied).
    applied: frozenset[str] = frozenset()
    #: The release with some of the series applied in memory, by selection:
    #: (new file contents, patch ids by (path, symbol) they rewrite).
    patched: dict[
        frozenset[str], tuple[dict[str, bytes], dict[tuple[str, str], set[str]]]
    ] = field(default_factory=dict)


def watch(
    series: Sequence[Patch],
    releases: Sequence[str],
    open_release: Callable[[str], VllmTree],
    reviewed: Sequence[Reviewed],
    reviewed_file: str = "",
    vllm_git: Path | None = None,
    progress: Callable[[int, int | None, str], None] | None = None,
) -> WatchResult:
    """Compare every patch's footprint over consecutive ``releases``.

    ``vllm_git`` is opened, and its tags checked for every release, before
    any comparison: a clone without them is refused first, not last."""
    repo = _open_repo(vllm_git) if vllm_git is not None else None
    tags = _release_tags(repo, vllm_git, releases) if repo is not None else {}
    changes: list[WatchChange] = []
    sizes: dict[str, dict[str, int]] = {p.id: {} for p in series}
    previous: _Release | None = None
    for done, version in enumerate(releases):
        if progress:
            progress(done, len(releases), version)
        current = _read_release(version, open_release(version), series)
        for patch_id, functions in current.footprints.items():
            sizes[patch_id][version] = len(functions)
        if previous is not None:
            for patch in series:
                changes += _compare(patch, previous, current, series, reviewed)
        previous = current
    if progress:
        progress(len(releases), len(releases), "")
    if repo is not None:
        for change in changes:
            change.commits = upstream_commits(repo, change, tags)
    return WatchResult(
        list(releases), [p.id for p in series], sizes, changes, reviewed_file
    )


def _read_release(version: str, tree: VllmTree, series: Sequence[Patch]) -> _Release:
    plan = plan_tree(tree, series, rewrite=False)
    reader = SourceReader(tree)
    found = footprints(tree, plan.reports, reader)
    applied = frozenset(
        r.patch.id for r in plan.reports if r.state is PatchState.APPLIED
    )
    return _Release(
        version, tree, reader, {f.patch_id: f.functions for f in found}, applied
    )


def _compare(
    patch: Patch,
    old: _Release,
    new: _Release,
    series: Sequence[Patch],
    reviewed: Sequence[Reviewed],
) -> list[WatchChange]:
    entries: dict[tuple[str, str], list[FootprintFunction]] = {}
    for f in [*old.footprints[patch.id], *new.footprints[patch.id]]:
        entries.setdefault((f.path, f.symbol), []).append(f)
    changes = []
    for (path, symbol), both in sorted(entries.items()):
        function = both[-1]
        # Watched whole in either release: the whole function; else its writes.
        attributes = (
            ()
            if any(not f.attributes for f in both)
            else tuple(sorted({a for f in both for a in f.attributes}))
        )
        before = old.reader.code(path, symbol, attributes)
        after = new.reader.code(path, symbol, attributes)
        if _same(before, after):
            continue
        kind = "added" if before is None else "removed" if after is None else "changed"
        change = WatchChange(
            patch_id=patch.id,
            previous=old.version,
            release=new.version,
            path=path,
            symbol=symbol,
            line=(after or before).line,  # type: ignore[union-attr]
            kind=kind,
            why=function.why,
            diff=function_diff(before, after, old.version, new.version),
        )
        _classify(change, old, new, after, attributes, series, reviewed)
        changes.append(change)
    return changes


def _same(before: FunctionCode | None, after: FunctionCode | None) -> bool:
    if before is None or after is None:
        return before is after
    return before.normalized == after.normalized


def _classify(
    change: WatchChange,
    old: _Release,
    new: _Release,
    after: FunctionCode | None,
    attributes: tuple[str, ...],
    series: Sequence[Patch],
    reviewed: Sequence[Reviewed],
) -> None:
    # Only the fixes the later release has: 0.20.2 has vllm#40932 but not
    # vllm#43617, so its code is the earlier release with vllm#40932 alone.
    patched_reader, rewriters = _patched(old, series, new.applied)
    by_series = patched_reader.code(change.path, change.symbol, attributes)
    before = old.reader.code(change.path, change.symbol, attributes)
    touched = not _same(before, by_series)
    if touched and _same(by_series, after):
        change.classification = CARRIED
        change.carried_by = sorted(
            rewriters.get((change.path, change.symbol), set())
        ) or sorted(rewriters.get((change.path, ""), set()))
        return
    change.series_rewrites = touched
    for entry in reviewed:
        if entry.matches(change):
            change.classification = KNOWN
            change.reason = entry.reason
            return
    change.classification = NEW


def _patched(
    old: _Release, series: Sequence[Patch], selected: frozenset[str]
) -> tuple[SourceReader, dict[tuple[str, str], set[str]]]:
    """The earlier release with the ``selected`` patches applied, in memory."""
    if selected not in old.patched:
        plan = plan_tree(old.tree, series, set(selected), rewrite=True)
        rewriters: dict[tuple[str, str], set[str]] = {}
        for report in plan.reports:
            if not report.selected:
                continue
            for location in report.locations:
                if location.state is not PatchState.NEEDED:
                    continue
                finding = location.finding
                for symbol in (finding.symbol, *finding.rewrites, ""):
                    key = (location.path, symbol)
                    rewriters.setdefault(key, set()).add(report.patch.id)
        edits = {edit.relpath: edit.new for edit in plan.edits}
        old.patched[selected] = (edits, rewriters)
    edits, rewriters = old.patched[selected]
    return SourceReader(old.tree, edits), rewriters


# Upstream's squash-merge subjects end in the pull request: "Fix x (#12345)".
_PULL_REQUEST = re.compile(r"\(#(\d+)\)\s*$")


def _open_repo(path: Path) -> Any:
    try:
        import git
    except ImportError:
        raise DeepstackError(
            "--vllm-git needs gitpython, which is not installed",
            "pip install 'deepstack-patch[vendor]' (or pip install gitpython)",
        ) from None
    try:
        return git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise DeepstackError(
            f"--vllm-git {path}: not a git repository",
            "pass a clone of https://github.com/vllm-project/vllm with its tags "
            "(git fetch --tags)",
        ) from None


def _release_tags(
    repo: Any, given: Path | None, releases: Sequence[str]
) -> dict[str, str]:
    """The tag of each release in the clone (``vX.Y.Z`` or ``X.Y.Z``); every
    release without one, named in one error with the path as given."""
    names = {tag.name for tag in repo.tags}
    found = {
        version: next((n for n in (f"v{version}", version) if n in names), "")
        for version in releases
    }
    missing = [f"v{version}" for version, tag in found.items() if not tag]
    if missing:
        newest = _newest_tag(names)
        has = f" (its newest release tag is {newest})" if newest else " (it has none)"
        raise DeepstackError(
            f"--vllm-git {given}: no tag {', '.join(missing)}{has}",
            "fetch upstream's release tags into that clone "
            "(git fetch --tags https://github.com/vllm-project/vllm), or drop "
            "--vllm-git",
        )
    return found


def _newest_tag(names: set[str]) -> str:
    """The newest ``vX.Y.Z`` among tag names; "" where there is none."""
    from packaging.version import InvalidVersion, Version

    versions = []
    for name in names:
        if re.fullmatch(r"v\d+\.\d+\.\d+", name):
            try:
                versions.append((Version(name[1:]), name))
            except InvalidVersion:
                continue
    return max(versions)[1] if versions else ""


def upstream_commits(
    repo: Any, change: WatchChange, tags: dict[str, str] | None = None
) -> list[UpstreamCommit]:
    """The commits between the two release tags that changed the function.

    ``git log A..B -- file`` lists the commits touching the file; a commit
    counts when the function's code (compared as the watch compares it)
    differs between its parent and itself. ``tags``: each release's tag
    (:func:`_release_tags`); by default they are looked up here.
    """
    from deepstack_patch.engine.footprint import function_code_in

    releases = [change.previous, change.release]
    tags = tags or _release_tags(repo, Path(repo.git_dir), releases)
    old_tag, new_tag = tags[change.previous], tags[change.release]
    found = []
    for commit in repo.iter_commits(f"{old_tag}..{new_tag}", paths=change.path):
        parent = commit.parents[0] if commit.parents else None
        before = _blob(parent, change.path)
        after = _blob(commit, change.path)
        if not _same(
            function_code_in(before, change.path, change.symbol),
            function_code_in(after, change.path, change.symbol),
        ):
            subject = commit.summary
            match = _PULL_REQUEST.search(subject)
            found.append(
                UpstreamCommit(commit.hexsha, subject, match.group(1) if match else "")
            )
    return list(reversed(found))


def _blob(commit: Any, path: str) -> bytes | None:
    if commit is None:
        return None
    try:
        return commit.tree[path].data_stream.read()
    except KeyError:
        return None


def run_watch(
    series: Sequence[Patch],
    since: str,
    until: str | None,
    reviewed_path: Path | None = None,
    vllm_git: Path | None = None,
) -> WatchResult:
    """``deepstack-patch watch``: the releases from the index, their sources
    from the verified cache (fetched once), every footprint compared."""
    from deepstack_patch.distribution.matrix import status_patterns, status_tree
    from deepstack_patch.fetch.releases import release_archive, release_versions
    from deepstack_patch.output.progress import note, progress

    shipped = reviewed_path is None
    reviewed_path = reviewed_path or default_reviewed_path()
    reviewed = load_reviewed(reviewed_path)
    releases = releases_between(since, until, release_versions(until, note))
    if vllm_git is not None:  # refused before any release is read
        _release_tags(_open_repo(vllm_git), vllm_git, releases)
    patterns = status_patterns(series)  # status's own extraction, shared

    def open_release(version: str) -> VllmTree:
        with progress(f"downloading vllm-{version}.tar.gz") as update:
            archive = release_archive(version, update)
        return status_tree(archive, version, patterns)

    note(
        f"watching {len(series)} patches over {len(releases)} releases "
        f"({releases[0]} to {releases[-1]})"
    )
    with progress("comparing footprints", unit="items") as update:
        result = watch(
            series,
            releases,
            open_release,
            reviewed,
            str(reviewed_path),
            vllm_git,
            update,
        )
    result.reviewed_shipped = shipped
    return result

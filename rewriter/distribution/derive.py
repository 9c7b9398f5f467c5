"""``derive``: turn an upstream diff into a derived patch (a data file).

The diff (as GitHub serves ``/pull/N.diff``, or ``git format-patch`` /
``git diff`` writes it) must apply exactly to the base: the release or tree
the pull request was made against. Each Python file it changes becomes units
(:func:`deepstack_patch.engine.derived_units.units_of_change`); its test
files are recorded as the patch's tests. Before anything is written the
patch is checked on the base: it is needed exactly at the diff's own sites,
its rewrite gives the diff's result, that result is recognised applied, and a
second pass changes nothing. Any failure is a DeepstackError (exit 2).
"""

from __future__ import annotations

import ast
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch.engine.derived import (
    DerivedPatch,
    Unit,
    data_file_name,
    write_derived,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import PatchState, RecordedTest
from deepstack_patch.engine.tree import VllmTree

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

BASE_HINT = (
    "give the release (--base) or tree (--base-src) the pull request was made "
    "against: its diff applies exactly there"
)


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    #: (" " | "-" | "+", the line's text without its newline)
    lines: list[tuple[str, str]]
    header: str
    #: The hunk's line in the diff file.
    line: int
    old_ends_without_newline: bool = False
    new_ends_without_newline: bool = False


@dataclass
class FileDiff:
    old_path: str | None
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    rename: bool = False
    new_file: bool = False
    deleted: bool = False
    line: int = 0

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


@dataclass
class DeriveResult:
    """What ``derive`` made and checked."""

    patch: DerivedPatch
    data_file: Path | None
    base_version: str
    #: How the round trip compared: ``text`` (the files' text is the diff's
    #: result) or ``ast`` (the same code; formatting around the replaced
    #: statements is the base's, not the diff's).
    round_trip: str
    units: list[Unit]
    tests: list[RecordedTest]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def parse_diff(text: str, name: str = "diff") -> list[FileDiff]:
    """The files of a unified diff; a DeepstackError if it is not one."""
    lines = text.splitlines()
    files: list[FileDiff] = []
    current: FileDiff | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        number = index + 1
        if line.startswith("diff --git "):
            paths = _git_paths(line[len("diff --git ") :])
            current = FileDiff(paths[0], paths[1], line=number)
            files.append(current)
        elif (
            current is not None
            and not current.hunks
            and line.startswith(
                ("new file mode", "deleted file mode", "rename from", "rename to")
            )
        ):
            if line.startswith("new file mode"):
                current.new_file = True
            elif line.startswith("deleted file mode"):
                current.deleted = True
            elif line.startswith("rename from "):
                current.rename, current.old_path = True, line[len("rename from ") :]
            else:
                current.rename, current.new_path = True, line[len("rename to ") :]
        elif line.startswith("Binary files ") or line == "GIT binary patch":
            if current is None:
                current = FileDiff(None, None, line=number)
                files.append(current)
            current.binary = True
        elif (
            line.startswith("--- ")
            and index + 1 < len(lines)
            and lines[index + 1].startswith("+++ ")
        ):
            old, new = _header_path(line[4:]), _header_path(lines[index + 1][4:])
            if current is None or current.hunks or current.binary:
                current = FileDiff(old, new, line=number)
                files.append(current)
            else:
                current.old_path, current.new_path = old, new
            current.new_file = current.new_file or old is None
            current.deleted = current.deleted or new is None
            index += 1
        elif line.startswith("@@"):
            if current is None:
                raise DeepstackError(
                    f"a hunk before any file header (line {number})",
                    "give a whole unified diff (the PR's .diff, git diff, or "
                    "git format-patch output)",
                    path=name,
                    line=number,
                )
            hunk, index = _read_hunk(lines, index, name)
            current.hunks.append(hunk)
            continue
        index += 1
    if not files:
        raise DeepstackError(
            "not a diff: no file header (diff --git, or ---/+++ lines) in it",
            "give a unified diff: GitHub serves a PR's at "
            "https://github.com/OWNER/REPO/pull/N.diff; git diff or git "
            "format-patch writes one",
            path=name,
        )
    return files


def _git_paths(rest: str) -> tuple[str | None, str | None]:
    match = re.match(r"a/(.*) b/(.*)$", rest)
    if match:
        return match.group(1), match.group(2)
    return None, None


def _header_path(text: str) -> str | None:
    text = text.split("\t")[0].strip()
    if text == "/dev/null":
        return None
    if text.startswith(("a/", "b/")):
        return text[2:]
    return text


def _read_hunk(lines: list[str], index: int, name: str) -> tuple[Hunk, int]:
    header = lines[index]
    match = _HUNK.match(header)
    if match is None:
        raise DeepstackError(
            f"a malformed hunk header: {header!r}",
            "give the diff unchanged, as git or GitHub wrote it",
            path=name,
            line=index + 1,
        )
    old_start, old_count, new_start, new_count = (
        int(match.group(1)),
        int(match.group(2) or 1),
        int(match.group(3)),
        int(match.group(4) or 1),
    )
    hunk = Hunk(old_start, old_count, new_start, new_count, [], header, index + 1)
    old_seen = new_seen = 0
    index += 1
    while index < len(lines) and (old_seen < old_count or new_seen < new_count):
        line = lines[index]
        tag, text = (line[:1], line[1:]) if line else (" ", "")
        if tag == "\\":
            index += 1
            continue
        if tag not in " -+":
            break
        hunk.lines.append((tag, text))
        old_seen += tag in " -"
        new_seen += tag in " +"
        index += 1
    if (old_seen, new_seen) != (old_count, new_count):
        raise DeepstackError(
            f"hunk {header} ends early: {old_seen} of {old_count} old and "
            f"{new_seen} of {new_count} new lines",
            "give the diff unchanged, as git or GitHub wrote it (an editor may "
            "have cut lines or trailing spaces)",
            path=name,
            line=hunk.line,
        )
    # "\ No newline at end of file" right after the hunk's last old/new line.
    position = index
    while position < len(lines) and lines[position].startswith("\\"):
        previous = hunk.lines[-1][0] if hunk.lines else " "
        if previous in " -":
            hunk.old_ends_without_newline = True
        if previous in " +":
            hunk.new_ends_without_newline = True
        position += 1
    return hunk, position


def apply_file_diff(file_diff: FileDiff, base_text: str) -> str:
    """The file after the diff: every hunk applies exactly (no fuzz; a hunk
    may sit at other lines than its header says, as git apply allows)."""
    base = base_text.splitlines(keepends=True)
    plain = [line.rstrip("\r\n") for line in base]
    out: list[str] = []
    position = 0
    for number, hunk in enumerate(file_diff.hunks, 1):
        old = [text for tag, text in hunk.lines if tag in " -"]
        new = [text for tag, text in hunk.lines if tag in " +"]
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        found = _nearest(plain, old, start, position)
        if found is None:
            raise DeepstackError(
                f"hunk {number} ({hunk.header}) of {file_diff.path} does not "
                "apply: " + _mismatch(plain, old, max(start, position)),
                BASE_HINT,
                path=file_diff.path,
                line=hunk.old_start,
            )
        out.extend(base[position:found])
        newline = "\n"
        out.extend(text + newline for text in new)
        if new and hunk.new_ends_without_newline:
            out[-1] = out[-1][:-1]
        position = found + len(old)
    out.extend(base[position:])
    return "".join(out)


def _nearest(plain: list[str], old: list[str], start: int, earliest: int) -> int | None:
    size = len(old)
    for distance in range(len(plain) + 1):
        for at in (start - distance, start + distance) if distance else (start,):
            if earliest <= at <= len(plain) - size and plain[at : at + size] == old:
                return at
    return None


def _mismatch(plain: list[str], old: list[str], start: int) -> str:
    for offset, expected in enumerate(old):
        at = start + offset
        if at >= len(plain):
            return f"the file ends at line {len(plain)}, the hunk expects more"
        if plain[at] != expected:
            return (
                f"line {at + 1} is {plain[at].strip()[:60]!r}, "
                f"the hunk expects {expected.strip()[:60]!r}"
            )
    return "its lines are not there"


def is_test_path(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (
        "tests" in parts[:-1]
        or "test" in parts[:-1]
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


def check_patch_id(patch_id: str, taken: Sequence[str]) -> None:
    if not patch_id or any(c.isspace() for c in patch_id):
        raise DeepstackError(
            f"--id {patch_id!r}: an id is short text without spaces",
            "e.g. --id vllm#49397, --id acme#12 or --id local#F1",
        )
    if patch_id in taken:
        raise DeepstackError(
            f"--id {patch_id}: already taken by a patch of the series",
            "choose another id (see 'deepstack-patch list'); a fix the series "
            "carries needs no derived patch",
        )


def derive_patch_from_text(
    diff_text: str,
    base: VllmTree,
    patch_id: str,
    *,
    title: str = "",
    symptom: str = "",
    diff_name: str = "diff",
    taken_ids: Sequence[str] = (),
    base_label: str = "",
) -> DeriveResult:
    """Derive and check a patch from a diff on ``base``; nothing is written."""
    started = time.monotonic()
    check_patch_id(patch_id, taken_ids)
    files = parse_diff(diff_text, diff_name)
    notes: list[str] = []
    units: list[Unit] = []
    tests: list[RecordedTest] = []
    results: dict[str, tuple[str, str]] = {}  # path -> (before, after)
    for file_diff in files:
        path = file_diff.path
        _refuse_shape(file_diff, diff_name)
        if is_test_path(path):
            test = _recorded_test(file_diff, base, notes)
            if test is not None:
                tests.append(test)
            continue
        if not path.endswith(".py"):
            notes.append(f"{path}: not Python, left out")
            continue
        if file_diff.new_file or file_diff.deleted:
            action = "adds" if file_diff.new_file else "deletes"
            raise DeepstackError(
                f"the diff {action} {path}: a derived patch changes code that "
                "is there, and never adds or deletes a file",
                "carry the file's change by hand (a patch module), or leave "
                "that file out of the diff",
                path=diff_name,
                line=file_diff.line,
            )
        before = _base_text(base, path, base_label)
        after = apply_file_diff(file_diff, before)
        _parses(after, path, "after the diff")
        from deepstack_patch.engine.derived_units import units_of_change

        changed = units_of_change(path, before, after)
        if not changed:
            notes.append(f"{path}: only comments, docstrings or formatting change")
            continue
        units.extend(changed)
        results[path] = (before, after)
    if not units:
        raise DeepstackError(
            "the diff changes no Python code: "
            + (
                "; ".join(notes)
                if notes
                else "only test files (recorded tests need a fix to test)"
            ),
            "give the diff of the fix itself (its .py files outside tests/)",
            path=diff_name,
        )
    patch = DerivedPatch(
        id=patch_id,
        title=title or f"{patch_id}, derived from its diff",
        symptom=symptom,
        base=base.version,
        base_tree="" if not base_label.startswith("tree ") else str(base.root),
        paths=list(results),
        units=units,
        tests=tests,
    )
    round_trip = self_check(patch, base, results, files)
    return DeriveResult(
        patch=patch,
        data_file=None,
        base_version=base.version,
        round_trip=round_trip,
        units=units,
        tests=tests,
        seconds=time.monotonic() - started,
        notes=notes,
    )


def _refuse_shape(file_diff: FileDiff, diff_name: str) -> None:
    if file_diff.binary:
        raise DeepstackError(
            f"{file_diff.path or 'a file'}: a binary diff; a derived patch "
            "carries Python code only",
            "leave the binary file out of the diff",
            path=diff_name,
            line=file_diff.line,
        )
    if file_diff.rename and not file_diff.hunks:
        raise DeepstackError(
            f"{file_diff.old_path} -> {file_diff.new_path}: a rename without "
            "a change of code; a derived patch never moves files",
            "leave the rename out of the diff",
            path=diff_name,
            line=file_diff.line,
        )
    if file_diff.rename:
        raise DeepstackError(
            f"{file_diff.old_path} -> {file_diff.new_path}: a renamed file; a "
            "derived patch never moves files",
            "give the diff of the code change without the rename",
            path=diff_name,
            line=file_diff.line,
        )


def _base_text(base: VllmTree, path: str, base_label: str) -> str:
    file = base.root / path
    if not file.is_file():
        raise DeepstackError(
            f"the diff changes {path}, which {base_label or f'vLLM {base.version}'} "
            "does not have",
            BASE_HINT,
        )
    return file.read_text(encoding="utf-8")


def _parses(text: str, path: str, when: str) -> None:
    try:
        ast.parse(text)
    except SyntaxError as exc:
        raise DeepstackError(
            f"{path} does not parse {when}: {exc.msg}",
            "give a diff whose result is valid Python",
            path=path,
            line=exc.lineno,
        ) from None


def _recorded_test(
    file_diff: FileDiff, base: VllmTree, notes: list[str]
) -> RecordedTest | None:
    path = file_diff.path
    if file_diff.deleted:
        notes.append(f"{path}: a deleted test, not recorded")
        return None
    if file_diff.new_file:
        return RecordedTest(path, apply_file_diff(file_diff, ""))
    file = base.root / path
    if not file.is_file():
        notes.append(
            f"{path}: not in the base, so its content after the fix is unknown"
        )
        return None
    return RecordedTest(path, apply_file_diff(file_diff, file.read_text("utf-8")))


def self_check(
    patch: DerivedPatch,
    base: VllmTree,
    results: dict[str, tuple[str, str]],
    files: Sequence[FileDiff],
) -> str:
    """The checks before anything is written; how the round trip compared."""
    from deepstack_patch.engine.plan import plan_tree, rewrite_text
    from deepstack_patch.engine.source import SourceFile

    hunk_lines = {
        f.path: [(h.old_start, h.old_start + max(h.old_count, 1) - 1) for h in f.hunks]
        for f in files
    }
    plan = plan_tree(base, [patch], rewrite=True)
    report = plan.report(patch.id)
    # On the base it is needed at the diff's own sites, and nowhere else.
    for unit in patch.units:
        where = [loc for loc in report.locations if loc.finding.part == unit.part]
        if not where:
            raise _check_failed(f"{unit.description} is not found on the base")
        for location in where:
            finding = location.finding
            if finding.state is not PatchState.NEEDED:
                raise _check_failed(
                    f"on the base {unit.description} is {finding.state}, not "
                    f"needed: {finding.reason}"
                )
            first, last = finding.span
            if not any(
                first <= end and start <= last
                for start, end in hunk_lines.get(location.path, [])
            ):
                raise _check_failed(
                    f"on the base {unit.description} matches at "
                    f"{location.path}:{first}-{last}, which the diff does not change"
                )
    # Applied to the base, it gives the diff's result.
    edited = {edit.relpath: edit.new for edit in plan.edits}
    compared = "text"
    for path, (_before, after) in results.items():
        if path not in edited:
            raise _check_failed(f"its rewrite leaves {path} unchanged")
        ours = SourceFile(path, edited[path]).text
        if ours == after:
            continue
        if ast.dump(ast.parse(ours)) != ast.dump(ast.parse(after)):
            raise _check_failed(
                f"its rewrite of {path} is not the diff's result:\n"
                + _short_diff(after, ours)
            )
        compared = "ast"
        # The result is recognised applied, and a second pass changes nothing.
    for path, (_before, after) in results.items():
        for text, what in (
            (edited[path].decode("utf-8"), "its rewrite"),
            (after, "the diff's result"),
        ):
            states = patch.recognise(ast.parse(text), path)
            wrong = [f for f in states if f.state is not PatchState.APPLIED]
            if wrong or len(states) != sum(u.path == path for u in patch.units):
                raise _check_failed(
                    f"{what} of {path} is not recognised applied: "
                    + (
                        ", ".join(
                            f"{f.symbol} {f.state} {f.reason}".strip() for f in wrong
                        )
                        or "a unit is missing"
                    )
                )
            if rewrite_text(patch, text, path) != text:
                raise _check_failed(f"a second pass over {what} of {path} changes it")
    return compared


def _check_failed(reason: str) -> DeepstackError:
    return DeepstackError(
        f"the derived patch fails its self-check: {reason}",
        "nothing was written; the diff may change code this tool cannot carry "
        "as data (report it), or the base is not the one the PR was made "
        "against",
    )


def _short_diff(expected: str, got: str) -> str:
    import difflib

    lines = difflib.unified_diff(
        expected.splitlines(keepends=True),
        got.splitlines(keepends=True),
        "the diff's result",
        "the rewrite",
        n=1,
    )
    return "".join(list(lines)[:30])


def derive(
    diff: Path,
    *,
    patch_id: str,
    out: Path,
    base_version: str | None = None,
    base_src: Path | None = None,
    title: str = "",
    symptom: str = "",
    taken_ids: Sequence[str] = (),
    note: Callable[[str], None] | None = None,
) -> DeriveResult:
    """Derive a patch from the diff file ``diff`` on a release or tree, check
    it, and write its data file into ``out``."""
    started = time.monotonic()
    if (base_version is None) == (base_src is None):
        raise DeepstackError(
            "give exactly one of --base VERSION and --base-src PATH",
            "e.g. --base 0.27.1 (the release the PR was made against)",
        )
    check_patch_id(patch_id, taken_ids)
    target = out / data_file_name(patch_id)
    _check_out(out, target, patch_id)
    diff_text = _read_diff(diff)
    files = parse_diff(diff_text, str(diff))
    if base_src is not None:
        base = VllmTree.open(base_src)
        label = f"tree {base_src}"
    else:
        assert base_version is not None
        base = _release_base(base_version, [f.path for f in files if f.path], note)
        label = f"vLLM {base_version}"
    result = derive_patch_from_text(
        diff_text,
        base,
        patch_id,
        title=title,
        symptom=symptom,
        diff_name=str(diff),
        taken_ids=taken_ids,
        base_label=label,
    )
    if base_version is not None:
        result.patch.base = base_version
    out.mkdir(parents=True, exist_ok=True)
    result.data_file = write_derived(result.patch, out)
    result.seconds = time.monotonic() - started
    return result


def _check_out(out: Path, target: Path, patch_id: str) -> None:
    if out.exists() and not out.is_dir():
        raise DeepstackError(
            f"--out {out}: is a file, not a folder", "give a folder for the data file"
        )
    existing = (
        out
        if out.is_dir()
        else next((p for p in out.absolute().parents if p.exists()), None)
    )
    if existing is None or not os.access(existing, os.W_OK | os.X_OK):
        raise DeepstackError(
            f"--out {out}: {existing or out} is not writable by this user",
            "choose a folder you may write, or make it writable",
        )
    if target.exists():
        raise DeepstackError(
            f"--id {patch_id}: {target} already exists",
            "choose another id, or remove the old data file first",
        )


def _read_diff(diff: Path) -> str:
    try:
        return diff.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DeepstackError(
            f"--diff {diff}: no such file",
            "save the PR's diff first (https://github.com/OWNER/REPO/pull/N.diff)",
        ) from None
    except UnicodeDecodeError:
        raise DeepstackError(
            f"--diff {diff}: not a text file (not UTF-8)",
            "give a unified diff as git or GitHub writes it",
        ) from None
    except OSError as exc:
        raise DeepstackError(f"--diff {diff}: cannot read: {exc.strerror}") from None


def _release_base(
    version: str, paths: list[str], note: Callable[[str], None] | None
) -> VllmTree:
    """The diff's files of a release, extracted once into the cache."""
    from deepstack_patch.distribution.matrix import status_tree
    from deepstack_patch.fetch.releases import release_archive

    archive = release_archive(version, None, note)
    return status_tree(archive, version, sorted(set(paths)))

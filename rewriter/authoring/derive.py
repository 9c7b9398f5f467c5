"""``derive``: turn an upstream diff into a derived patch (a data file).

The diff (as GitHub serves ``/pull/N.diff``, or ``git format-patch`` /
``git diff`` writes it) must apply exactly to the base: the release or tree
the pull request was made against. Each Python file it changes becomes units
(:func:`deepstack_patch.engine.derived.units.units_of_change`); its test
files are recorded as the patch's tests. Before anything is written the
patch is checked on the base: it is needed exactly at the diff's own sites,
its rewrite gives the diff's result, that result is recognised applied, and a
second pass changes nothing. Any failure is a DeepstackError (exit 2).
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch.authoring.changed_tests import changed_tests
from deepstack_patch.authoring.check import checked_round_trip
from deepstack_patch.authoring.sources import (
    id_of_mail,
    mail_subject,
    read_diff,
    release_base,
    source_base,
)
from deepstack_patch.authoring.unified_diff import (
    BASE_HINT,
    FileDiff,
    apply_file_diff,
    parse_diff,
)
from deepstack_patch.engine.derived import (
    DerivedPatch,
    SkippedTest,
    Unit,
    data_file_name,
    docstrings,
    write_derived,
)
from deepstack_patch.engine.derived.data import (
    file_holding_id,
    url_problem,
    version_problem,
    whole_file_unit,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import RecordedTest
from deepstack_patch.engine.tree import VllmTree

# The diff's API is importable from here too.
__all__ = [
    "DeriveResult",
    "FileDiff",
    "apply_file_diff",
    "derive",
    "derive_patch_from_text",
    "parse_diff",
]


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
    #: What the user should know of the result (a base far past its tag).
    warnings: list[str] = field(default_factory=list)
    #: With ``--commit``: the commit the diff is (its full sha); else "".
    commit: str = ""
    #: The base tree the patch was checked on (a release's files, extracted
    #: into the cache, or --base-src).
    tree: VllmTree | None = None


#: derive's note for a file whose change no unit carries (comment lines
#: between statements are units, engine/derived/comments.py).
ONLY_FORMATTING = (
    "only formatting, or comments at the end of a line or a block, change; left out"
)


#: Folders of vLLM's repository that no build or run of it reads: what
#: derive leaves out there is noted, never listed as not carried.
NEVER_SHIPPED = (".buildkite/", ".github/", "docs/", "examples/", "benchmarks/")


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


def id_words(patch_id: str, named_by: str = "") -> str:
    """The id as an error names it: ``--id X``, or where it came from (a
    commit's or a mail's subject) where no ``--id`` was given."""
    return f"{patch_id} (the id {named_by} names)" if named_by else f"--id {patch_id}"


def check_patch_id(patch_id: str, taken: Sequence[str], named_by: str = "") -> None:
    if not patch_id or any(c.isspace() for c in patch_id):
        raise DeepstackError(
            f"--id {patch_id!r}: an id is short text without spaces",
            "e.g. --id vllm#49397, --id acme#12 or --id local#F1",
        )
    if patch_id in taken:
        raise DeepstackError(
            f"{id_words(patch_id, named_by)}: already taken by a patch of the series",
            "choose another id (see 'deepstack-patch list'); a fix the series "
            "carries needs no derived patch",
        )


def check_upstream(upstream_url: str, fixed_in: str) -> None:
    """--upstream-url and --fixed-in go into commits, DEP-3 headers and the
    SBOM as they are: refuse what those cannot carry (the loader refuses a
    data file with them by the same rules)."""
    if url_problem(upstream_url):
        raise DeepstackError(
            f"--upstream-url {upstream_url!r}: {url_problem(upstream_url)}",
            "e.g. --upstream-url https://github.com/vllm-project/vllm/pull/49397",
        )
    if version_problem(fixed_in):
        raise DeepstackError(
            f"--fixed-in {fixed_in!r}: {version_problem(fixed_in)}",
            "the first vLLM release with the fix, e.g. --fixed-in 0.21.0 "
            "(leave it out while no release has it)",
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
    upstream_url: str = "",
    fixed_in: str = "",
    checked_on: Callable[[DerivedPatch], VllmTree] | None = None,
) -> DeriveResult:
    """Derive and check a patch from a diff on ``base``; nothing is written.

    ``upstream_url`` defaults to the pull request's URL for an id
    ``vllm#N``; ``fixed_in`` (the first release with the fix) to none.
    ``checked_on``: the tree to check the patch on, where ``base`` is not
    (see :func:`release_base`)."""
    started = time.monotonic()
    check_patch_id(patch_id, taken_ids)
    check_upstream(upstream_url, fixed_in)
    files = parse_diff(diff_text, diff_name)
    units, tests, skipped, results, notes, not_carried = _read_changes(
        files, base, diff_name, base_label
    )
    by_entries = any(edit.kind == "entry" for unit in units for edit in unit.edits)
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

    def made_of(units: list[Unit]) -> DerivedPatch:
        return DerivedPatch(
            id=patch_id,
            title=title or f"{patch_id}, derived from its diff",
            symptom=symptom,
            base=base.version,
            base_tree="" if not base_label.startswith("tree ") else str(base.root),
            paths=list(results),
            units=units,
            tests=tests,
            skipped_tests=skipped,
            upstream_url=upstream_url,
            fixed_in=fixed_in,
        )

    patch = made_of(units)
    try:
        try:
            round_trip, checked = checked_round_trip(patch, base, checked_on, results)
        except DeepstackError:
            if not by_entries:
                raise
            # A large literal's entries that do not check out as edits of
            # their own: its statement whole, as before they were.
            units = _read_changes(files, base, diff_name, base_label, False)[0]
            patch = made_of(units)
            round_trip, checked = checked_round_trip(patch, base, checked_on, results)
    except DeepstackError:
        raise
    except Exception as exc:  # noqa: BLE001 - the last guard: never a traceback
        described = [unit.description for unit in units]
        where = "; ".join(described[:3]) + (" and more" if len(described) > 3 else "")
        raise _unexpected(exc, "checking " + where, diff_name) from exc
    notes += checked
    # What status shows with the patch's state, which speaks of these units.
    patch.not_carried = (*not_carried, *checked)
    return DeriveResult(
        patch=patch,
        data_file=None,
        base_version=base.version,
        round_trip=round_trip,
        units=units,
        tests=tests,
        seconds=time.monotonic() - started,
        notes=notes,
        tree=base,
    )


#: What :func:`_read_changes` reads of a diff (see there).
_Changes = tuple[
    list[Unit],
    list[RecordedTest],
    list[SkippedTest],
    dict[str, tuple[str, str]],
    list[str],
    list[str],
]


def _read_changes(
    files: Sequence[FileDiff],
    base: VllmTree,
    diff_name: str,
    base_label: str,
    by_entries: bool = True,
) -> _Changes:
    """The diff's units, its recorded tests, the test files left out of the
    proof, each Python file before and after, notes on what was left out,
    and those of them that are of the fix's code (not its tests)."""
    from deepstack_patch.engine.derived.units import units_of_change

    notes: list[str] = []
    not_carried: list[str] = []

    def leave_out(path: str, note: str) -> None:
        notes.append(note)
        # A test asset, CI or the docs: nothing a user's vLLM builds or runs.
        if not is_test_path(path) and not path.startswith(NEVER_SHIPPED):
            not_carried.append(note)

    recorded: dict[str, str] = {}  # test path -> content after the fix
    tested: dict[str, str] = {}  # test path -> content before the fix
    skipped: dict[str, SkippedTest] = {}
    texts: dict[str, tuple[str, str]] = {}  # path -> (before, after)
    whole: dict[str, str] = {}  # path -> the unit kind of a file added or deleted
    # A format-patch series may change a file in several patches: each
    # applies to the file as the ones before it left it.
    for file_diff in files:
        path = file_diff.path
        if file_diff.binary:  # a test asset, an image: no code to carry
            leave_out(path, f"{path or 'a file'}: a binary file, left out")
            continue
        _refuse_shape(file_diff, diff_name)
        if is_test_path(path):
            if path not in tested:
                tested[path] = _base_test(base, path)
            if path not in skipped:
                _record_test(file_diff, base, notes, recorded, skipped)
            continue
        if not path.endswith(".py"):
            leave_out(path, f"{path}: not Python, left out")
            continue
        if not path.startswith("vllm/"):
            # setup.py, tools/, benchmarks/: no installed vLLM runs them.
            leave_out(path, f"{path}: outside the vllm package, left out")
            continue
        if file_diff.new_file or file_diff.deleted:
            _whole_file(file_diff, base, base_label, texts, whole)
            continue
        if path not in texts:
            before = _base_text(base, path, base_label)
            texts[path] = (before, before)
        before, current = texts[path]
        texts[path] = (before, apply_file_diff(file_diff, current))
    units: list[Unit] = []
    results: dict[str, tuple[str, str]] = {}
    for path, (before, after) in texts.items():
        _parses(after, path, "after the diff")
        if path in whole:  # the whole text is the change
            units.append(whole_file_unit(path, whole[path], before or after))
            results[path] = (before, after)
            continue
        try:
            changed = units_of_change(path, before, after, by_entries)
        except Exception as exc:  # noqa: BLE001 - the last guard: never a traceback
            raise _unexpected(exc, f"reading the change of {path}", diff_name) from exc
        if not changed:  # comment lines between statements are units
            leave_out(path, f"{path}: {ONLY_FORMATTING}")
            continue
        for name in docstrings.left_out(before, after, changed):
            leave_out(
                path,
                f"{path}: {_docstring_of(name)} changes alone; left out "
                "(docstrings never count for a derived patch)",
            )
        units.extend(changed)
        results[path] = (before, after)
    tests = [
        RecordedTest(path, content, changed_tests(tested[path], content))
        for path, content in recorded.items()
    ]
    return units, tests, list(skipped.values()), results, notes, not_carried


def _whole_file(
    file_diff: FileDiff,
    base: VllmTree,
    base_label: str,
    texts: dict[str, tuple[str, str]],
    whole: dict[str, str],
) -> None:
    """A file the diff adds or deletes: its text before and after into
    ``texts`` (as git apply would, the base must lack a file it adds, and
    have exactly the text of one it deletes), its unit kind into ``whole``."""
    path = file_diff.path
    base_name = base_label or f"vLLM {base.version}"
    if path in texts:  # a series that changes, then adds or deletes it
        raise DeepstackError(
            f"the diff changes {path} and also adds or deletes it",
            "give the change as one diff against the base (git diff BASE FIX)",
        )
    if file_diff.new_file:
        if (base.root / path).exists():
            raise DeepstackError(
                f"the diff adds {path}, which {base_name} already has", BASE_HINT
            )
        texts[path] = ("", apply_file_diff(file_diff, ""))
        whole[path] = "new-file"
        return
    before = _base_text(base, path, base_label)
    if apply_file_diff(file_diff, before) != "":
        raise DeepstackError(
            f"the diff deletes {path}, whose text in {base_name} is not the "
            "one the diff deletes",
            BASE_HINT,
        )
    texts[path] = (before, "")
    whole[path] = "deleted-file"


def _docstring_of(name: str) -> str:
    return f"the docstring of {name}" if name else "the module's docstring"


def _base_test(base: VllmTree, path: str) -> str:
    """A test file as the base has it ("" where it has none: a new test)."""
    file = base.root / path
    return file.read_text("utf-8") if file.is_file() else ""


def _refuse_shape(file_diff: FileDiff, diff_name: str) -> None:
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


def _record_test(
    file_diff: FileDiff,
    base: VllmTree,
    notes: list[str],
    recorded: dict[str, str],
    skipped: dict[str, SkippedTest],
) -> None:
    """A test file's content after the fix into ``recorded`` (an earlier
    patch of the diff may have changed it already); one whose content cannot
    be known into ``skipped``: the fix is derived all the same, and proven
    without it."""
    path = file_diff.path
    if file_diff.deleted:
        notes.append(f"{path}: a deleted test, not recorded")
        recorded.pop(path, None)
        return
    current = recorded.get(path)
    reason = ""
    if current is None and not file_diff.new_file:
        file = base.root / path
        if file.is_file():
            current = file.read_text("utf-8")
        else:
            reason = "not in the base, so its content after the fix is unknown"
    if not reason:
        try:
            recorded[path] = apply_file_diff(file_diff, current or "")
            return
        except DeepstackError as exc:  # the test drifted, not the fix
            reason = f"its hunks do not apply to the base ({exc.message})"
    recorded.pop(path, None)
    skipped[path] = SkippedTest(path, reason)
    notes.append(f"{path}: {reason}; left out of the proof")


def _unexpected(exc: Exception, doing: str, diff_name: str) -> DeepstackError:
    """An error derive did not foresee, said as an error, not a traceback."""
    return DeepstackError(
        f"derive failed {doing}: {type(exc).__name__}: {exc}",
        "nothing was written; this is a bug of deepstack-patch: please report "
        "it with the diff. Meanwhile the fix can be carried by hand "
        "(docs/adding-a-patch.md)",
        path=diff_name,
    )


def derive(
    diff: Path,
    *,
    patch_id: str = "",
    out: Path,
    base_version: str | None = None,
    base_src: Path | None = None,
    tree_version: str | None = None,
    title: str = "",
    symptom: str = "",
    taken_ids: Sequence[str] = (),
    note: Callable[[str], None] | None = None,
    upstream_url: str = "",
    fixed_in: str = "",
    force: bool = False,
) -> DeriveResult:
    """Derive a patch from the diff file ``diff`` on a release or tree, check
    it, and write its data file into ``out`` (with ``force``, in the place of
    the one there that holds its id).

    ``tree_version`` (``--base-version``) is the version of a ``base_src``
    tree, which a tree without version metadata must be given. Without a
    ``title``, a ``git format-patch`` mail's subject is the title; without a
    ``patch_id``, the id it names (``... (#N)``: ``vllm#N``)."""
    started = time.monotonic()
    if (base_version is None) == (base_src is None):
        raise DeepstackError(
            "give exactly one of --base VERSION and --base-src PATH",
            "e.g. --base 0.27.1 (the release the PR was made against)",
        )
    if base_version is not None and tree_version is not None:
        raise DeepstackError(
            "--base-version goes with --base-src or --commit: --base is a "
            "release, and its version",
            "leave out --base-version",
        )
    diff_text = read_diff(diff)
    if not diff_text.strip():
        raise DeepstackError(
            f"--diff {diff}: the file is empty",
            "save the PR's diff into it first "
            "(https://github.com/OWNER/REPO/pull/N.diff)",
        )
    subject = mail_subject(diff_text)
    named_by = "" if patch_id else "the mail's subject"
    patch_id = patch_id or id_of_mail(subject, diff)
    replacing = prepare_out(
        out, patch_id, taken_ids, upstream_url, fixed_in, named_by, force
    )
    files = parse_diff(diff_text, str(diff))
    checked_on = None
    if base_src is not None:
        base = source_base(base_src, tree_version)
        label = f"tree {base_src}"
    else:
        assert base_version is not None
        paths = [f.path for f in files if f.path]
        base, checked_on = release_base(base_version, paths, note)
        label = f"vLLM {base_version}"
    result = derive_patch_from_text(
        diff_text,
        base,
        patch_id,
        title=title or subject,
        symptom=symptom,
        diff_name=str(diff),
        taken_ids=taken_ids,
        base_label=label,
        upstream_url=upstream_url,
        fixed_in=fixed_in,
        checked_on=checked_on,
    )
    if base_version is not None:
        result.patch.base = base_version
    return write_result(result, out, started, replacing)


def prepare_out(
    out: Path,
    patch_id: str,
    taken_ids: Sequence[str],
    upstream_url: str,
    fixed_in: str,
    named_by: str = "",
    force: bool = False,
) -> Path | None:
    """The checks of the id, the metadata and ``--out`` before any work;
    with ``force``, the data file there that holds the id, to replace."""
    check_patch_id(patch_id, taken_ids, named_by)
    check_upstream(upstream_url, fixed_in)
    return _check_out(out, out / data_file_name(patch_id), patch_id, named_by, force)


def write_result(
    result: DeriveResult, out: Path, started: float, replacing: Path | None = None
) -> DeriveResult:
    """Write the checked patch's data file into ``out``; where it replaces a
    file of another name that held its id, that one goes."""
    out.mkdir(parents=True, exist_ok=True)
    result.data_file = write_derived(result.patch, out)
    if replacing is not None and replacing.name != result.data_file.name:
        replacing.unlink(missing_ok=True)
    result.seconds = time.monotonic() - started
    return result


def _check_out(
    out: Path, target: Path, patch_id: str, named_by: str, force: bool
) -> Path | None:
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
    holder = target if target.exists() else file_holding_id(out, patch_id)
    if holder is None or force:
        return holder
    held = f"{target} already exists" if holder == target else "already held by"
    raise DeepstackError(
        f"{id_words(patch_id, named_by)}: {held}"
        + ("" if holder == target else f" {holder}"),
        "give --force to replace that file, or choose another id with --id "
        "(two patches of one id cannot join a series)",
    )

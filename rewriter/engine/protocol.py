"""The patch protocol: what a patch module declares and what the engine asks of it.

A patch recognises its target in one file's CPython ``ast`` (cheap: no LibCST
import for files that need nothing) and reports one :class:`Finding` per
target location. Only when a finding is ``needed`` does the engine hand the
file's LibCST module to :meth:`Patch.rewrite`. After every rewrite the engine
recognises the new code again and insists on ``applied``: a rewrite that does
not produce the shape its own recogniser accepts is never written.
"""

from __future__ import annotations

import ast
import enum
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # LibCST is imported only when something is rewritten.
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    import libcst


class PatchState(str, enum.Enum):
    """The state of one patch (or one of its targets) in one tree."""

    NEEDED = "needed"
    APPLIED = "applied"
    NOT_APPLICABLE = "not-applicable"
    DRIFTED = "drifted"

    def __str__(self) -> str:
        return self.value


# When several findings are combined, the most urgent state wins: a single
# drifted location blocks the patch; a single needed one makes it needed.
_URGENCY = [
    PatchState.DRIFTED,
    PatchState.NEEDED,
    PatchState.APPLIED,
    PatchState.NOT_APPLICABLE,
]


#: A ``Finding.details`` key: a part this release never had the code of,
#: although its function already reads every name the fix adds (fixed
#: another way, perhaps): the names. Such a part never lets a patch that
#: applies whole go in where the rest of its code is (engine/whole.py).
THERE_ALREADY = "there already"


def combine_states(states: Sequence[PatchState]) -> PatchState:
    """Combine the states of several locations: the most urgent one wins."""
    for state in _URGENCY:
        if state in states:
            return state
    return PatchState.NOT_APPLICABLE


@dataclass(frozen=True)
class Finding:
    """The state of one target location, as a patch recognised it.

    ``symbol`` is the qualified name of the recognised code
    (``Class.method``), ``line`` its first line, and ``span`` the range of
    lines a rewrite may touch (inclusive); the engine refuses a rewrite that
    changes anything outside the spans of the needed findings. ``rewrites``
    names the functions the fixed code consists of, so that tests can compare
    them with upstream's. ``reason`` says why a location is not needed: what
    was expected where it drifted, why the patch does not apply.

    ``details`` carries what recognition found to :meth:`Patch.rewrite`
    (statement indices, local names, which variant of the code), so that the
    rewrite does not recognise again. It is read-only. Never put line numbers
    or AST nodes in it: the engine may hand ``rewrite`` a skeleton of the file
    whose lines differ; indices inside a function's body and names do not.
    """

    state: PatchState
    symbol: str
    line: int
    span: tuple[int, int]
    reason: str = ""
    part: str = ""
    rewrites: tuple[str, ...] = ()
    # Left out of the hash (a mapping is unhashable), kept in equality.
    details: Mapping[str, Any] = field(
        default_factory=lambda: types.MappingProxyType({}), hash=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.details, types.MappingProxyType):
            # A frozen dataclass: set the read-only view of a private copy.
            read_only = types.MappingProxyType(dict(self.details))
            object.__setattr__(self, "details", read_only)


@dataclass(frozen=True)
class Example:
    """A worked example: ``before`` becomes ``after``; ``after`` stays.

    ``state`` is what the patch must recognise in ``before``. For an example
    that must not be rewritten (already fixed, drifted, not applicable), leave
    ``after`` as ``None``: the harness checks the state and that nothing is
    rewritten. ``path`` is the file the example stands for, relative to the
    tree (a recogniser may read it: which folder a relative import names).
    """

    name: str
    before: str
    after: str | None = None
    state: PatchState = PatchState.NEEDED
    path: str = "example.py"


#: How long a follow-up's ``headline`` may be: one line on an 80-column
#: terminal with its indent.
HEADLINE_MAX = 70


@dataclass(frozen=True)
class FollowUp:
    """What upstream said about a fix after it shipped, as recorded by hand.

    ``reference`` is an upstream issue or pull request (``vllm#53516``),
    ``status`` its state when it was read (``open``, ``closed``, ``merged``),
    ``recorded`` that date (ISO 8601), ``summary`` one sentence saying what
    it reports or proposes, and ``headline`` its consequence for a user of
    the fix in one line (at most ``HEADLINE_MAX`` characters: it is printed
    whole, never cut, where a person decides whether to apply the fix).
    Nothing here is fetched at run time: a user deciding whether to apply a
    patch sees what was known when the series was curated.
    """

    reference: str
    status: str
    recorded: str
    summary: str
    headline: str

    @property
    def url(self) -> str:
        """The GitHub address of ``owner#number`` references of vLLM."""
        project, _, number = self.reference.partition("#")
        if project == "vllm" and number.isdigit():
            return f"https://github.com/vllm-project/vllm/issues/{number}"
        return ""


@dataclass(frozen=True)
class RecordedTest:
    """A test file that comes with a patch, as the fix's pull request added or
    changed it (a derived patch records its diff's test files). ``path`` is
    relative to the tree root; ``content`` is the whole file after the fix.
    `verify` copies it into the tree and runs it fail-to-pass."""

    path: str
    content: str
    #: The tests of the file the pull request added or changed, as node ids
    #: below the file (``test_x``, ``TestY::test_z``); empty: the whole file.
    names: tuple[str, ...] = ()

    @property
    def nodeids(self) -> list[str]:
        """What pytest is given: each named test, else the file."""
        return [f"{self.path}::{name}" for name in self.names] or [self.path]


class Patch:
    """One upstream fix. Subclasses fill in the metadata and the two hooks.

    Metadata is class-level so that `deepstack-patch list` needs no parsing.
    """

    #: The upstream reference, e.g. ``vllm#12345``.
    id: ClassVar[str]
    title: ClassVar[str]
    #: Every built-in patch names its pull request and first fixed release
    #: (tests/test_series.py holds them to it); a patch from elsewhere may
    #: name neither, and every output then leaves them out.
    upstream_url: ClassVar[str] = ""
    #: The first upstream release that contains the fix.
    fixed_in: ClassVar[str] = ""
    #: The user-visible failure: an error message, a slowdown, an accuracy drop.
    symptom: ClassVar[str] = ""
    #: Fix safety: what the rewrite may change beyond the lines it fixes.
    also_changes: ClassVar[str] = "Nothing beyond the lines shown in the examples."
    #: What of the upstream fix it leaves out (a derived patch: what derive
    #: said; a file that is not Python, a comment at the end of a line).
    not_carried: ClassVar[tuple[str, ...]] = ()
    #: Patch ids that must be applied first when they are needed. A patch
    #: recognises its target both in their output (`apply` rewrites in
    #: series order) and on the shape before their rewrite (`status` and
    #: `apply --check` rewrite nothing, so they never import LibCST).
    requires: ClassVar[tuple[str, ...]] = ()
    #: Patch ids this one must never ship without when they are needed: later
    #: upstream repairs of what this fix breaks on its own (a companion runs
    #: after it in the series). Selecting this patch without a needed
    #: companion is refused, as a deselected requirement is.
    companions: ClassVar[tuple[str, ...]] = ()
    #: Patch ids whose fix this one replaces (metadata for `list`).
    supersedes: ClassVar[tuple[str, ...]] = ()
    #: Where to look: globs relative to the tree root.
    paths: ClassVar[tuple[str, ...]]
    #: Files containing none of these bytes are never parsed for this patch.
    markers: ClassVar[tuple[bytes, ...]]
    #: The targets of the patch, by part name, with what each target is. A
    #: part that no file holds is reported not-applicable with this text.
    parts: ClassVar[dict[str, str]]
    examples: ClassVar[tuple[Example, ...]] = ()
    #: What upstream reported or proposed about this fix after it shipped.
    follow_ups: ClassVar[tuple[FollowUp, ...]] = ()
    #: Qualified names (``Class.method``) `watch` follows besides the
    #: footprint read from the code (see :mod:`deepstack_patch.engine.footprint`):
    #: code the fix depends on that neither its rewrites nor the writers of
    #: the state they read reach, searched in the files ``paths`` match.
    also_watch: ClassVar[tuple[str, ...]] = ()
    #: Where the patch comes from, as `list` shows it: ``built-in`` for the
    #: series this tool ships; a data file or module of a ``--patches``
    #: folder, or an installed entry point, for patches from elsewhere.
    origin: str = "built-in"
    #: Tests that come with the patch (a derived patch's recorded tests).
    recorded_tests: tuple[RecordedTest, ...] = ()
    #: Whether recognition reads other files of the tree than the one it is
    #: given (through :func:`deepstack_patch.engine.tree.tree_context`): the
    #: recognition cache, which keys on the file's bytes, then skips the file.
    reads_tree: ClassVar[bool] = False
    #: Work a patch that reads the tree may start on the tree's root as a
    #: plan starts, to have it ready when recognition reads the tree (a
    #: context manager, left as the plan ends); None: nothing.
    ahead_of_plan: ClassVar[Callable[[Path], AbstractContextManager[None]] | None] = (
        None
    )
    #: The files besides ``paths`` that recognition reads (exact paths): a
    #: partial extraction holds them too, and one the release lacks is known
    #: to be missing there.
    also_reads: tuple[str, ...] = ()

    #: Files of ``paths`` the patch adds or deletes whole (a derived patch
    #: of a diff that does): where the tree lacks one the plan asks
    #: :meth:`recognise_missing`, and where one is needed it writes
    #: :meth:`whole_file` in its place instead of calling :meth:`rewrite`.
    whole_files: tuple[str, ...] = ()

    def part_file(self, part: str) -> str:
        """The one file ``part`` is in, where the patch knows it (a derived
        patch's unit); "" where a part may be in any file ``paths`` match."""
        return ""

    def recognise_missing(self, path: str) -> list[Finding]:
        """The findings for ``path``, one of :attr:`whole_files`, where the
        tree lacks it (a file the fix adds is needed there)."""
        return []

    def whole_file(self, path: str) -> bytes | None:
        """What ``path``, one of :attr:`whole_files`, holds after the fix:
        its bytes, or None where the fix deletes it."""
        raise NotImplementedError

    def part_label(self, part: str) -> str:
        """How ``part`` is shown in a table: its name, unless the patch knows
        a better one (a derived patch's unit of unnamed statements)."""
        return part

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        """Report the state of every target location in one parsed file.

        Return no finding for a file that has no target (a marker can match
        by accident). Never raise for unexpected code: report it drifted.
        """
        raise NotImplementedError

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        """Return ``module`` with the fix applied at the ``needed`` findings."""
        raise NotImplementedError

    def prove(self, tree: Path) -> None:
        """Exercise the fix in the tree's own code, with torch on the CPU.

        `deepstack-patch verify` calls this in a separate process whose
        ``sys.path`` starts with ``tree`` (so ``import vllm`` is the tree's)
        and whose vLLM platform is the CPU. Raise ``AssertionError`` saying
        what the buggy behaviour was when the fix's behaviour is absent;
        return normally when it is present. It must fail on the unpatched
        release and pass on the patched one.
        """
        raise NotImplementedError


@dataclass
class Location:
    """A finding placed in a file of a tree (what reports show)."""

    path: str
    finding: Finding

    @property
    def state(self) -> PatchState:
        return self.finding.state


@dataclass
class PatchReport:
    """The state of one patch in one tree, with every location found."""

    patch: Patch
    selected: bool
    locations: list[Location] = field(default_factory=list)
    #: Set when the engine itself decides the state (a requirement skipped).
    blocked_reason: str = ""
    #: The required patches this one waits for (needed, but not selected).
    blocked_by: list[str] = field(default_factory=list)
    #: Applied by this run (set after the write; the state is then applied).
    applied_now: bool = False
    #: The files of the tree the patch's ``paths`` match (None: not known).
    tree_files: frozenset[str] | None = None

    def part_state(self, part: str) -> tuple[PatchState, str]:
        found = [loc for loc in self.locations if loc.finding.part == part]
        if not found:
            file = self.patch.part_file(part)
            if file and self.tree_files is not None and file not in self.tree_files:
                return PatchState.NOT_APPLICABLE, (
                    f"target absent: {file} is not in this tree"
                )
            return PatchState.NOT_APPLICABLE, (
                f"target absent: no {self.patch.parts[part]} in this tree"
            )
        state = combine_states([loc.state for loc in found])
        reasons = [loc.finding.reason for loc in found if loc.state is state]
        return state, "; ".join(dict.fromkeys(r for r in reasons if r))

    @property
    def state(self) -> PatchState:
        if self.applied_now:
            return PatchState.APPLIED
        if self.blocked_reason:
            return PatchState.NEEDED
        return combine_states([self.part_state(part)[0] for part in self.patch.parts])

    @property
    def reason(self) -> str:
        if self.blocked_reason and not self.applied_now:
            return self.blocked_reason
        state = self.state
        reasons = []
        for part in self.patch.parts:
            part_state, part_reason = self.part_state(part)
            if part_state is state and part_reason:
                label = f"{part}: " if len(self.patch.parts) > 1 else ""
                reasons.append(label + part_reason)
        return "; ".join(dict.fromkeys(reasons))

    @property
    def files(self) -> list[str]:
        return sorted({loc.path for loc in self.locations})

"""Issue 41 item 4: the typed checks of a plan go through ``ty server``
(engine/derived/typecheck.py, engine/derived/tyserver.py), which keeps
what it inferred from one state of the series to the next, and states
that differ in a module only inside function bodies no other module sees
share one (engine/derived/interface.py). Either way every check gets the
diagnostics a run of ``ty check`` of its own gives it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from deepstack_patch.engine.derived import closure, typecheck, tyserver
from deepstack_patch.engine.derived.interface import same_interface

from tests.test_series_order import whole_tree

SHARED = """class Pool:
    def __init__(self, size: int) -> None:
        self.size = size

    def take(self, count: int) -> int:
        return min(count, self.size)


def helper(x):
    return x
"""
#: Only inside an annotated function's body: no other module sees it.
SHARED_BODY = SHARED.replace("return min(count, self.size)", "return max(0, count)")
#: A new method: every module that reads Pool sees it.
SHARED_NEW = SHARED + "\n\ndef spare() -> int:\n    return 1\n"
USER = """from vllm.shared import Pool


def grab(pool: Pool) -> int:
    return pool.take(1)
"""
#: Reads what only SHARED_NEW gives: ty finds it missing elsewhere.
USER_FIXED = USER.replace(
    "from vllm.shared import Pool", "from vllm.shared import Pool, spare"
)
#: A file whose own hints (unreachable code, an unused name) an editor is
#: shown and ``ty check`` never prints.
HINTED = "def f(x: int) -> int:\n    unused = 1\n    return x\n    x += 1\n"
HINTED_FIXED = HINTED.replace("return x\n", "return x + 1\n")
ADDED = "from vllm.fresh import VALUE\n\n\ndef g() -> int:\n    return VALUE.nope\n"


def served_by(monkeypatch: pytest.MonkeyPatch, fake: object) -> None:
    """Have every server that starts be ``fake`` (its ``lay`` and
    ``diagnostics`` in place of a ``ty server``'s)."""
    import contextlib

    @contextlib.contextmanager
    def served(*_: object) -> Iterator[object]:
        yield fake

    monkeypatch.setattr(tyserver, "served", served)


def toy(root: Path):
    return whole_tree(
        root,
        {
            "vllm/shared.py": SHARED,
            "vllm/user.py": USER,
            "vllm/hinted.py": HINTED,
            "vllm/adder.py": "def g() -> int:\n    return 0\n",
        },
    ).root


def checks_on(root: Path) -> list[typecheck.Check]:
    files = {
        path: (root / path).read_bytes()
        for path in (
            "vllm/shared.py",
            "vllm/user.py",
            "vllm/hinted.py",
            "vllm/adder.py",
        )
    }
    index = closure.ModuleIndex(files)

    def check(
        path: str,
        fixed: str,
        others: dict[str, bytes],
        added: dict[str, bytes] | None = None,
    ) -> typecheck.Check:
        found = index.closure(path, [files[path], fixed.encode()])
        return typecheck.Check(
            path,
            {**others, path: files[path]},
            {**others, **(added or {}), path: fixed.encode()},
            lambda relpath, appears: closure.reads_file(found, relpath, appears),
        )

    return [
        check("vllm/shared.py", SHARED_BODY, {}),
        # user.py as the series leaves it after each fix of shared.py.
        check("vllm/user.py", USER_FIXED, {"vllm/shared.py": SHARED_BODY.encode()}),
        check("vllm/user.py", USER_FIXED, {"vllm/shared.py": SHARED_NEW.encode()}),
        check("vllm/hinted.py", HINTED_FIXED, {}),
        # A fix that adds a module a server cannot be told of.
        check(
            "vllm/adder.py",
            ADDED,
            {},
            {"vllm/fresh.py": b"VALUE = 1\n"},
        ),
    ]


def test_served_checks_give_what_runs_of_ty_check_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = toy(tmp_path / "tree")
    checks = checks_on(root)
    served = typecheck.diagnostics_of(root, checks)
    monkeypatch.setattr(typecheck, "SERVED", False)
    run = typecheck.diagnostics_of(root, checks)
    alone = [typecheck.diagnostics_of(root, [one])[0] for one in checks]
    assert served == run == alone
    by_path = dict(zip((c.path for c in checks), served, strict=False))
    # The first user.py check: shared.py lacks spare there.
    assert any("spare" in d.message for d in served[1][1])  # type: ignore[index]
    assert not any("spare" in d.message for d in served[2][1])  # type: ignore[index]
    # No editor hints: the unused name and the unreachable line are not there.
    assert by_path["vllm/hinted.py"] == ([], [])
    # The added module is read (ty checks the attribute on its int).
    assert any("nope" in d.message for d in served[4][1])  # type: ignore[index]


def test_checks_asked_ahead_get_what_runs_of_ty_check_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The servers a plan hands each check to as soon as it is known answer
    every check a server can take as a run of its own; the one that adds a
    module is not taken (it goes to the batch at the pass's end)."""
    root = toy(tmp_path / "tree")
    checks = checks_on(root)
    monkeypatch.setattr(typecheck, "SERVED", False)
    alone = [typecheck.diagnostics_of(root, [one])[0] for one in checks]
    ahead = typecheck.ChecksAhead.start(root)
    assert ahead is not None
    try:
        numbers = [ahead.ask(check) for check in checks]
        assert numbers[-1] is None  # vllm/fresh.py: the tree lacks it
        taken = [number for number in numbers if number is not None]
        answered = ahead.answers(taken)
    finally:
        ahead.close()
    assert [answered[n] for n in taken] == alone[:-1]
    assert any("spare" in d.message for d in answered[1][1])


def test_a_server_ahead_that_fails_answers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that cannot start leaves its checks unanswered (the plan
    hands them to the batch), and the answers do not wait on it."""
    root = toy(tmp_path / "tree")

    def broken(*_args: object, **_kwargs: object):
        raise tyserver.ServerFailed("ty server did not start: no such file")

    monkeypatch.setattr(tyserver, "served", broken)
    ahead = typecheck.ChecksAhead.start(root)
    assert ahead is not None
    try:
        number = ahead.ask(checks_on(root)[0])
        assert ahead.answers([number]) == {}  # type: ignore[list-item]
    finally:
        ahead.close()


def test_a_server_that_fails_leaves_the_checks_to_ty_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = toy(tmp_path / "tree")
    checks = checks_on(root)
    expected = typecheck.diagnostics_of(root, checks)

    def broken(*_args: object, **_kwargs: object):
        raise tyserver.ServerFailed("ty server did not start: no such file")

    monkeypatch.setattr(tyserver, "served", broken)
    assert typecheck.diagnostics_of(root, checks) == expected


def test_states_that_differ_only_in_a_body_nobody_sees_share_a_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = toy(tmp_path / "tree")
    checks = checks_on(root)[:3]

    def states() -> list[list[tuple[int, str]]]:
        views = typecheck._views(typecheck._sides(checks), typecheck._Disk(root))
        return [sorted((s.check, s.state) for s in view.sides) for view in views]

    # user.py on the fixed shared.py (only take's body differs) shares the
    # state of shared.py as it is, and the fixed user.py that of the fixed
    # shared.py; user.py on shared.py with a new function sees it: states of
    # their own.
    assert states() == [
        [(0, "before"), (1, "before")],
        [(0, "after"), (1, "after")],
        [(2, "before")],
        [(2, "after")],
    ]
    # Where every difference counts, user.py on the fixed shared.py cannot
    # share shared.py's state as it is: five states.
    monkeypatch.setattr(typecheck, "same_interface", lambda one, other: one == other)
    assert states() == [
        [(0, "before")],
        [(0, "after"), (1, "before")],
        [(1, "after")],
        [(2, "before")],
        [(2, "after")],
    ]


@pytest.mark.parametrize(
    ("one", "other", "alike"),
    [
        (SHARED, SHARED_BODY, True),
        (SHARED, SHARED_NEW, False),
        # The pinned ty infers no return from a body: an unannotated
        # function's call is Unknown (tests/test_typecheck_outline.py).
        (SHARED, SHARED.replace("    return x\n", "    return [x]\n"), True),
        # A method that assigns to self declares the class's attributes.
        (
            SHARED,
            SHARED.replace("self.size = size", "self.size = str(size)"),
            False,
        ),
        (
            SHARED,
            SHARED.replace(
                "return min(count, self.size)", "self.spent = count\n        return 0"
            ),
            False,
        ),
        # Only what a function assigns to its first parameter is declared:
        # another object's attribute, or one of self's parts, is not.
        (
            SHARED,
            SHARED.replace(
                "return min(count, self.size)",
                "other = Pool(1)\n        other.spent = count\n"
                "        self.size.real = 1\n        return 0",
            ),
            True,
        ),
        (
            SHARED,
            SHARED.replace(
                "return min(count, self.size)",
                "[0 for self.seen in range(count)]\n        return 0",
            ),
            False,
        ),
        # A global a function binds is the module's.
        (
            "LIMIT = 1\n\n\ndef f() -> None:\n    global LIMIT\n    LIMIT = 2\n",
            "LIMIT = 1\n\n\ndef f() -> None:\n    global LIMIT\n    LIMIT = 'two'\n",
            False,
        ),
        # A signature is seen.
        (SHARED, SHARED.replace("count: int", "count: float"), False),
        # A body on the ``def`` line is the line itself: it stays.
        ("def f() -> int: return 1\n", "def f() -> int: return 2\n", False),
        ("def f(:\n", "def f(:\n ", False),
    ],
    ids=[
        "body",
        "new-function",
        "unannotated",
        "init-self",
        "method-self",
        "other-object",
        "comprehension-self",
        "global",
        "signature",
        "one-line",
        "unparsable",
    ],
)
def test_what_another_module_sees_of_a_file(one: str, other: str, alike: bool) -> None:
    assert same_interface(one.encode(), other.encode()) is alike


def test_a_file_that_is_not_utf8_is_left_to_ty_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protocol's text is UTF-8: a state with a file that is not (a
    Latin-1 comment) is never told to a server, and its check runs."""
    root = toy(tmp_path / "tree")
    raw = b"# caf\xe9\nX: int = 1\n"
    (root / "vllm" / "latin.py").write_bytes(raw)
    check = typecheck.Check(
        "vllm/latin.py",
        {"vllm/latin.py": raw},
        {"vllm/latin.py": raw.replace(b"= 1", b"= 2")},
        lambda _relpath, _appears: False,
    )
    sides = typecheck._sides([check])
    assert not any(typecheck._servable(s, typecheck._Disk(root)) for s in sides)
    (served,) = typecheck.diagnostics_of(root, [check])
    monkeypatch.setattr(typecheck, "SERVED", False)
    (run,) = typecheck.diagnostics_of(root, [check])
    # ty check cannot read it either: the check says ty could not run.
    assert isinstance(served, typecheck.CheckerFailed)
    assert str(served) == str(run)


@pytest.mark.parametrize("way", ["served", "ty check", "ahead"])
@pytest.mark.parametrize("asks", [False, True])
def test_a_file_is_checked_as_it_is_only_where_its_answer_as_fixed_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str, asks: bool
) -> None:
    """A check that needs its file's diagnostics as it is only to excuse new
    ones (``needs_before``) is asked about them once its file as fixed is
    answered, and given ``[]`` where it says no: whichever way it runs.
    Ahead, the file as fixed is first checked as its outline (the bodies of
    the functions the fix did not write left out, ``Check.written``): where
    that answer asks for the file as it is, the whole file as fixed is
    checked too, and is the answer (the verdict weighs all of it)."""
    root = toy(tmp_path / "tree")
    old = (
        USER
        + "\n\nMISSING = Pool.absent\n"  # a diagnostic of its own
        + "\n\ndef elsewhere() -> None:\n    Pool.gone\n"  # one in a body
    )
    (root / "vllm" / "user.py").write_text(old)
    fixed = old.replace("pool.take(1)", "pool.take(2)")
    written = [n for n, line in enumerate(fixed.splitlines(), 1) if "take(2)" in line]
    told: list[list[typecheck.Diagnostic]] = []

    def needs_before(after: list[typecheck.Diagnostic]) -> bool:
        told.append(after)
        return asks

    check = typecheck.Check(
        "vllm/user.py",
        {"vllm/user.py": old.encode()},
        {"vllm/user.py": fixed.encode()},
        lambda _relpath, _appears: True,
        needs_before=needs_before,
        written=frozenset(written),
    )
    monkeypatch.setattr(typecheck, "SERVED", way == "served")
    if way == "ahead":
        ahead = typecheck.ChecksAhead.start(root)
        assert ahead is not None
        try:
            number = ahead.ask(check)
            (found,) = ahead.answers([number]).values()  # type: ignore[list-item]
        finally:
            ahead.close()
    else:
        (found,) = typecheck.diagnostics_of(root, [check])
    before, after = found  # type: ignore[misc]
    (asked,) = told
    assert any("absent" in d.message for d in asked)
    outlined = way == "ahead"
    assert any("gone" in d.message for d in asked) is not outlined
    assert asked == [d for d in after if not outlined or "gone" not in d.message]
    assert any("gone" in d.message for d in after) is (asks or not outlined)
    assert before == (after if asks else [])


def test_a_state_goes_to_the_server_with_the_least_left_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each state of a file not checked yet goes to the server with the
    fewest bytes given to check and not answered yet (a big file asked last
    would be the run's end behind another), a later state of a file to the
    server that checked it (what the file imports is inferred there: the
    second state of vLLM's largest file took 0.9 s on the other server and
    0.4 s on its own), and a server's answer takes its bytes off again."""
    import threading

    release = threading.Event()

    class Waiting:
        def lay(self, files: object, read: object) -> None:
            pass

        def diagnostics(self, files: dict[str, bytes], timeout: float) -> dict:
            release.wait(30)
            return {path: [] for path in files}

    served_by(monkeypatch, Waiting())
    ahead = tyserver.Ahead("ty", tmp_path, tmp_path / "work", "", 2, lambda _: b"")
    try:
        big, small = {"vllm/big.py": b"x" * 100}, {"vllm/small.py": b"x" * 10}
        other = {"vllm/other.py": b"x" * 10}
        assert ahead.ask("a", big, "vllm/big.py") == 0
        assert ahead.ask("b", small, "vllm/small.py") == 1
        assert ahead.ask("c", other, "vllm/other.py") == 1  # 10 + 10 < 100
        assert ahead.ask("d", big, "vllm/big.py") == 0  # its own, though 100 > 20
        assert ahead.ask("e", small, "vllm/small.py", server=0) == 0  # as told
        release.set()
        assert set(ahead.answers("abcde")) == set("abcde")
        assert ahead._queued == [0, 0]
    finally:
        release.set()
        ahead.close()


def test_states_asked_while_the_server_is_busy_join_where_each_gets_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """States that wait for the busy server join one run wherever a run can
    give each what a run of its own would: shared.py's fix and user.py as
    that fix leaves shared.py share one; user.py beside a shared.py with a
    new function (which user.py sees) cannot share it. Each check's
    diagnostics are those of a run of ``ty check`` of its own."""
    import contextlib
    import dataclasses
    import threading

    root = toy(tmp_path / "tree")
    checks = [  # each file as fixed alone: none asks for it as it is
        dataclasses.replace(check, needs_before=lambda _after: False)
        for check in checks_on(root)[:4]
    ]
    monkeypatch.setattr(typecheck, "SERVED", False)
    alone = [typecheck.diagnostics_of(root, [one])[0] for one in checks]
    busy, free = threading.Event(), threading.Event()
    laid: list[list[str]] = []
    real = tyserver.served

    class Gated:
        def __init__(self, server: tyserver.Server) -> None:
            self.server = server

        def lay(self, files: dict[str, bytes], read: object) -> None:
            self.server.lay(files, read)  # type: ignore[arg-type]

        def diagnostics(self, files: dict[str, bytes], timeout: float) -> dict:
            laid.append(sorted(files))
            busy.set()
            free.wait(30)
            return self.server.diagnostics(files, timeout)

    @contextlib.contextmanager
    def served(*args: object) -> Iterator[Gated]:
        with real(*args) as server:  # type: ignore[arg-type]
            yield Gated(server)

    monkeypatch.setattr(tyserver, "served", served)
    ahead = typecheck.ChecksAhead.start(root)
    assert ahead is not None
    try:
        first = ahead.ask(checks[3])  # hinted.py: the server is busy with it
        assert busy.wait(30)
        numbers = [ahead.ask(check) for check in checks[:3]]
        free.set()
        answered = ahead.answers([first, *numbers])  # type: ignore[list-item]
    finally:
        free.set()
        ahead.close()
    assert laid == [
        ["vllm/hinted.py"],
        ["vllm/shared.py", "vllm/user.py"],
        ["vllm/user.py"],
    ]
    assert [answered[n] for n in numbers] == alone[:3]  # type: ignore[index]
    assert answered[first] == alone[3]  # type: ignore[index]


def test_a_state_never_joins_a_run_the_server_took_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state's join is worked out on the plan's thread while the server
    goes on: where the server takes the run meanwhile, the state waits in a
    run of its own (joined, it would be laid after the run was checked)."""
    import threading
    import time

    busy, free, taken = threading.Event(), threading.Event(), threading.Event()
    laid: list[list[str]] = []

    class Fake:
        def lay(self, files: dict[str, bytes], read: object) -> None:
            laid.append(sorted(files))
            (busy if len(laid) == 1 else taken).set()

        def diagnostics(self, files: dict[str, bytes], timeout: float) -> dict:
            free.wait(30)
            return {path: [] for path in files}

    def join(run: tyserver._Run, job: tyserver._Job) -> dict[str, bytes]:
        free.set()  # the server checks "a" and takes the run that waits
        assert taken.wait(30)
        return {**run.files, **job.files}

    served_by(monkeypatch, Fake())
    ahead = tyserver.Ahead(
        "ty", tmp_path, tmp_path / "work", "", 1, lambda _: b"", join
    )
    try:
        ahead.ask("a", {"vllm/a.py": b"a"}, "vllm/a.py")
        assert busy.wait(30)  # the server checks "a" until ``free``
        ahead.ask("b", {"vllm/b.py": b"b"}, "vllm/b.py")  # waits: nothing to join
        ahead.ask("c", {"vllm/c.py": b"c"}, "vllm/c.py")
        # Polled, not waited for: "c" joined to a run already checked would
        # never be answered.
        deadline = time.monotonic() + 30
        while len(ahead._answers) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(ahead._answers) == set("abc")
    finally:
        free.set()
        ahead.close()
    assert laid == [["vllm/a.py"], ["vllm/b.py"], ["vllm/c.py"]]


def test_an_interrupt_as_the_servers_start_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the servers that check ahead start (their folder made,
    the servers not yet kept by the plan): the folder goes with them."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tyserver, "Ahead", interrupted)
    with pytest.raises(KeyboardInterrupt):
        typecheck.ChecksAhead.start(toy(tmp_path / "tree"))
    assert list((tmp_path / "tmp").iterdir()) == []

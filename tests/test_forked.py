"""Work done in a forked child while the process goes on (engine/forked.py):
its answer, none where it failed, none started beside another thread, and
never a child left running."""

from __future__ import annotations

import os
import threading
import time

import pytest
from deepstack_patch.engine import forked
from deepstack_patch.engine.forked import Forked


@pytest.fixture(autouse=True)
def alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if no other thread ran: another test may leave one behind, and
    these children take no lock."""
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)


def test_a_child_answers_what_its_work_gives() -> None:
    child = Forked.start(lambda: {"pid": os.getpid(), "found": [1, "two"]})
    assert child is not None
    answer = child.answer()
    assert answer == {"pid": child.pid, "found": [1, "two"]}
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, 0)  # reaped
    assert child.answer() is None  # taken once


def test_a_child_that_fails_answers_nothing() -> None:
    child = Forked.start(lambda: 1 / 0)
    assert child is not None
    assert child.answer() is None


def test_a_child_whose_answer_is_not_taken_is_stopped() -> None:
    child = Forked.start(lambda: time.sleep(60))
    assert child is not None
    started = time.monotonic()
    child.stop()
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, 0)


def test_no_child_beside_another_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the threads as they are
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert threading.active_count() > 1
        assert Forked.start(lambda: 1) is None
    finally:
        release.set()
        other.join()

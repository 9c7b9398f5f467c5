"""Work done in a forked child while this process goes on, on a core that
would otherwise wait; its answer comes back as JSON through a pipe.

A plan's first second runs on one core of two (ty has yet to be given a
check on the other): the data files' agreement check
(:mod:`.derived.truth`) and the package's import lists
(:mod:`.derived.import_lists`) are done there side by side. A child is started
only where ``fork`` exists and this process runs one thread (a fork copies
a lock another thread holds, held); it leaves without the parent's exit
handlers and buffers, and is killed and reaped where its answer is not
taken (an interrupt, a plan that needs none).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import threading
from collections.abc import Callable


class Forked:
    """A forked child working out one answer (:meth:`start`)."""

    def __init__(self, pid: int, reading: int) -> None:
        self.pid = pid
        self._reading: int | None = reading

    @classmethod
    def start(cls, work: Callable[[], object], nice: int = 0) -> Forked | None:
        """A child that answers ``work()`` (made of JSON's types); None where
        none can be started (no ``fork``, another thread, a failed fork).
        With ``nice``, the child yields its core to this process and the
        others at their priority (it works where a core would wait)."""
        if not hasattr(os, "fork") or threading.active_count() != 1:
            return None
        reading, writing = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(reading)
            os.close(writing)
            return None
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            code = 1
            try:
                os.close(reading)
                if nice:
                    os.nice(nice)
                answer = json.dumps(work()).encode()
                with os.fdopen(writing, "wb") as pipe:
                    pipe.write(answer)
                code = 0
            finally:
                os._exit(code)  # none of the parent's exit handlers, nor buffers
        os.close(writing)
        return cls(pid, reading)

    def answer(self) -> object | None:
        """The child's answer, waited for; None where it gave none (it
        failed). Interrupted, the child is stopped."""
        reading, self._reading = self._reading, None
        if reading is None:
            return None
        try:
            with os.fdopen(reading, "rb") as pipe:
                text = pipe.read()
        except BaseException:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            raise
        finally:
            os.waitpid(self.pid, 0)
        try:
            return json.loads(text)
        except ValueError:
            return None

    def ready(self) -> bool:
        """Whether the child has begun its answer, or ended: :meth:`answer`
        would then wait no longer than it takes to read it."""
        if self._reading is None:
            return True
        readable, _, _ = select.select([self._reading], [], [], 0)
        return bool(readable)

    def stop(self) -> None:
        """The child killed where its answer was not taken, and reaped."""
        reading, self._reading = self._reading, None
        if reading is None:
            return
        os.close(reading)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)

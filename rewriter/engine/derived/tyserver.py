"""ty as a language server: one process that keeps what it inferred while
the files of a check are changed under it, for the typed checks of a plan
(:func:`.typecheck.diagnostics_of`).

A run of ``ty check`` infers every module its files reach again, about a
second on vLLM, and a first ``status`` of 40 derived fixes on 0.20.2 needs
35 states: each fix's file as it is and as fixed, each with the files
earlier fixes of the series rewrote. ``ty server`` keeps its inferences
between states and infers again only what depends on a file that changed:
on that batch the checks took 4.1 s through two servers and 6.6 s through
runs of ``ty check``, with the same diagnostics for each of the 52 checks.

The server is told a state's files by the language server protocol's
``didOpen``/``didChange`` (the text an editor holds, read in place of the
file on disk, also where another module imports it; tried on ty 0.0.108)
and asked for the checked file's diagnostics (``textDocument/diagnostic``).
It cannot be told that a file exists that the tree lacks (a module a fix
adds): such a check runs ``ty check`` as before.

A plan hands each check to servers as soon as it is known (:class:`Ahead`):
they check it on another core while the plan's Python goes on.

The workspace is a folder holding ``ty.toml`` (the same settings the runs
of ``ty check`` are given) and a link ``vllm`` to the tree's package, so the
tree's own ``[tool.ty]`` is not read and nothing is written into the tree.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ServerFailed(Exception):
    """The server did not start, answer in time, or answered an error."""


class Server:
    """A ``ty server`` on a workspace, with the files it was told hold
    other text than the disk's (:meth:`lay`)."""

    def __init__(self, process: subprocess.Popen[bytes], workspace: Path) -> None:
        self._process, self.workspace = process, workspace
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_all, daemon=True)
        self._reader.start()
        self._next_id = 0
        self._opened: dict[str, int] = {}  # relpath -> version
        self._laid: dict[str, bytes] = {}  # relpath -> text other than the disk's

    # -- the protocol ---------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            self._process.stdin.flush()
        except OSError as exc:
            raise ServerFailed(f"ty server stopped: {exc}") from None

    def _read_all(self) -> None:
        out = self._process.stdout
        assert out is not None
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("ascii", "replace").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if length is None:
                self._answers.put(None)  # the server's output ended
                return
            self._answers.put(json.loads(out.read(length)))

    def request(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        (answer,) = self.requests([(method, params)], timeout)
        return answer

    def requests(
        self, calls: list[tuple[str, dict[str, Any]]], timeout: float
    ) -> list[Any]:
        """Send every call at once (the server answers them side by side)
        and wait for each answer, in the calls' order."""
        idents = []
        for method, params in calls:
            self._next_id += 1
            idents.append(self._next_id)
            self._send({"id": self._next_id, "method": method, "params": params})
        answers: dict[int, Any] = {}
        while len(answers) < len(idents):
            try:
                message = self._answers.get(timeout=timeout)
            except queue.Empty:
                raise ServerFailed(
                    f"ty server took more than {timeout:.0f} s"
                ) from None
            if message is None:
                raise ServerFailed("ty server stopped")
            if "method" in message:  # the server's own request or notice
                if "id" in message:
                    self._send({"id": message["id"], "result": None})
                continue
            if message.get("id") not in idents:
                continue
            if "error" in message:
                raise ServerFailed(f"ty server: {message['error'].get('message', '?')}")
            answers[message["id"]] = message.get("result")
        return [answers[ident] for ident in idents]

    def kill(self) -> None:
        """Stop the process at once (its answers end: a request raises)."""
        self._process.kill()

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"method": method, "params": params})

    # -- the files ------------------------------------------------------------

    def _uri(self, relpath: str) -> str:
        return (self.workspace / relpath).as_uri()

    def _tell(self, relpath: str, text: bytes) -> None:
        decoded = text.decode("utf-8")  # UTF-8 only (typecheck._servable)
        if relpath not in self._opened:
            self._opened[relpath] = 1
            document = {"uri": self._uri(relpath), "languageId": "python"}
            self.notify(
                "textDocument/didOpen",
                {"textDocument": {**document, "version": 1, "text": decoded}},
            )
            return
        self._opened[relpath] += 1
        self.notify(
            "textDocument/didChange",
            {
                "textDocument": {
                    "uri": self._uri(relpath),
                    "version": self._opened[relpath],
                },
                "contentChanges": [{"text": decoded}],
            },
        )

    def lay(self, files: Mapping[str, bytes], disk: Callable[[str], bytes]) -> None:
        """The server's files as the tree's with ``files`` in place of
        theirs; ``disk(relpath)``: the tree's bytes."""
        for relpath in sorted(self._laid.keys() - files.keys()):
            self._tell(relpath, disk(relpath))
            del self._laid[relpath]
        for relpath, text in sorted(files.items()):
            told = self._laid.get(relpath)
            if (told is None and text == disk(relpath)) or told == text:
                continue
            self._tell(relpath, text)
            if text == disk(relpath):
                del self._laid[relpath]
            else:
                self._laid[relpath] = text

    def diagnostics(
        self, files: Mapping[str, bytes], timeout: float
    ) -> dict[str, list[tuple[int, str, str]]]:
        """ty's diagnostics on each of ``files`` (relative path -> the
        bytes it holds now), asked at once: line, rule and message, as
        ``ty check --output-format concise`` gives them (the first line of
        the message)."""
        for relpath, text in files.items():
            if relpath not in self._opened:
                self._tell(relpath, text)
        reports = self.requests(
            [
                (
                    "textDocument/diagnostic",
                    {"textDocument": {"uri": self._uri(relpath)}},
                )
                for relpath in files
            ],
            timeout,
        )
        found: dict[str, list[tuple[int, str, str]]] = {}
        for relpath, report in zip(files, reports, strict=True):
            if not isinstance(report, dict) or report.get("kind") != "full":
                raise ServerFailed(f"ty server gave no full report on {relpath}")
            found[relpath] = [
                (
                    int(item["range"]["start"]["line"]) + 1,
                    str(item.get("code", "")),
                    str(item.get("message", "")).split("\n", 1)[0],
                )
                for item in report.get("items", [])
                # An editor's hints (unused, unreachable) carry no rule, and
                # ``ty check`` does not print them.
                if item.get("code")
            ]
        return found


@contextmanager
def served(
    binary: str, root: Path, workspace: Path, settings: str, timeout: float
) -> Iterator[Server]:
    """A ``ty server`` on ``workspace`` (a new folder), which links the
    tree's ``vllm`` package and holds ``settings`` as its ``ty.toml``; shut
    down on leaving."""
    workspace.mkdir()
    (workspace / "ty.toml").write_text(settings)
    (workspace / "vllm").symlink_to(root / "vllm", target_is_directory=True)
    try:
        process = subprocess.Popen(
            [binary, "server"],
            cwd=workspace,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "error"},
        )
    except OSError as exc:
        raise ServerFailed(f"ty server did not start: {exc}") from None
    server = Server(process, workspace)
    try:
        server.request(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": workspace.as_uri(),
                "workspaceFolders": [{"uri": workspace.as_uri(), "name": "vllm"}],
                "capabilities": {"textDocument": {"diagnostic": {}}},
            },
            timeout,
        )
        server.notify("initialized", {})
        yield server
        try:
            server.request("shutdown", {}, 10)
            server.notify("exit", {})
            process.wait(timeout=10)
        except (ServerFailed, subprocess.TimeoutExpired):
            pass
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class Ahead:
    """Servers that check states while the plan that asks for them goes on.

    A first ``status`` of 40 derived fixes is seconds of Python on one core,
    and each typed check is known as soon as its patch is recognised. So each
    state (the files it lays over the tree, the file it checks) goes to a
    server at once (:meth:`ask`) and is checked on another core; the plan's
    end collects the answers (:meth:`answers`). A state is checked as a run
    of its own would check it, the tree's bytes everywhere else.

    States asked while a server is busy wait for it, and a state joins one
    that waits where a run can give both what each would alone (``join``,
    :func:`.typecheck._joined`): the server lays them once and checks their
    files at once, side by side on its threads. Each state laid costs a
    server what depends on the files that changed (ty infers it again); on
    a first ``status`` of 40 derived fixes, 54 states make 24 runs. The
    join is worked out as the state is asked, on the plan's thread, so a
    server never waits for it.
    """

    def __init__(
        self,
        binary: str,
        root: Path,
        work: Path,
        settings: str,
        count: int,
        read: Callable[[str], bytes],
        join: Callable[[_Run, _Job], dict[str, bytes] | None] | None = None,
        then: Callable[[Hashable, list[tuple[int, str, str]]], None] | None = None,
    ) -> None:
        self._read, self._work = read, work
        #: The files of ``run`` with ``job``'s state joined, or None where
        #: no run can give both; by default no state joins another.
        self._join = join or (lambda _run, _job: None)
        #: Told each job's answer before it is given (on the server's
        #: thread): it may ask for another check, which then waits there.
        self._then = then or (lambda _job, _found: None)
        #: One asks at a time: a join is worked out from a waiting run's
        #: files, and another's join to the same run would be lost.
        self._asking = threading.Lock()
        #: The runs waiting for each server, first come first checked.
        self._waiting: list[list[_Run]] = [[] for _ in range(count)]
        self._closing = False
        self._managers: list[Any] = [None] * count
        self._live: list[Server | None] = [None] * count
        self._ended = [False] * count
        self._answers: dict[Hashable, list[tuple[int, str, str]]] = {}
        self._server_of: dict[Hashable, int] = {}
        #: The bytes of the files each server was given to check and has
        #: not answered yet: what a new check waits behind there.
        self._queued = [0] * count
        #: The server each file checked went to: a later state of it goes
        #: there too, where what the file imports is inferred already.
        self._checked_on: dict[str, int] = {}
        self._done = threading.Condition()
        self._threads = []
        for number in range(count):
            start = functools.partial(
                served, binary, root, work / f"ahead{number}", settings, 120
            )
            thread = threading.Thread(  # a daemon: an interrupt never waits
                target=self._serve, args=(number, start), daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def ask(
        self,
        job: Hashable,
        files: Mapping[str, bytes],
        path: str,
        server: int | None = None,
        shown: bytes | None = None,
    ) -> int:
        """Have server number ``server`` (modulo their count; by default the
        one that checked ``path`` before, else the one with the least to
        check before it) check ``path`` with ``files`` laid over the tree
        (and ``shown`` in place of ``path``'s text there: a text another
        module sees alike, ``interface.outline``); its answer is kept as
        ``job``'s. The server's number."""
        with self._asking:
            return self._ask(job, files, path, server, shown)

    def _ask(
        self,
        job: Hashable,
        files: Mapping[str, bytes],
        path: str,
        server: int | None,
        shown: bytes | None,
    ) -> int:
        laid = shown if shown is not None else files.get(path)
        size = len(laid) if laid is not None else len(self._read(path) or b"")
        with self._done:
            if server is None:
                server = self._checked_on.get(path)
            if server is None:  # a big file checked last is the run's end
                server = min(range(len(self._waiting)), key=self._queued.__getitem__)
            number = server % len(self._waiting)
            self._checked_on.setdefault(path, number)
            self._queued[number] += size
            waiting = list(self._waiting[number])
        self._server_of[job] = number
        new = _Job(job, files, path, size, shown)
        for run in waiting:
            joined = self._join(run, new)  # the server may take the run meanwhile
            if joined is None:
                continue
            with self._done:
                if any(run is still for still in self._waiting[number]):
                    run.files, run.jobs = joined, [*run.jobs, new]
                    return number
        with self._done:
            self._waiting[number].append(_Run(dict(files), [new]))
            self._done.notify_all()
        return number

    def answers(
        self, jobs: Iterable[Hashable]
    ) -> dict[Hashable, list[tuple[int, str, str]]]:
        """The diagnostics of each of ``jobs`` (line, rule, message), once
        checked; a job whose server failed has none."""
        wanted = [job for job in jobs if job in self._server_of]
        with self._done:
            self._done.wait_for(
                lambda: all(
                    job in self._answers or self._ended[self._server_of[job]]
                    for job in wanted
                )
            )
            return {job: self._answers[job] for job in wanted if job in self._answers}

    def _serve(self, number: int, start: Callable[[], Any]) -> None:
        try:
            manager = start()
            server = manager.__enter__()
            self._managers[number], self._live[number] = manager, server
            while (run := self._next(number)) is not None:
                files = {**run.files}
                files.update((j.path, j.shown) for j in run.jobs if j.shown is not None)
                server.lay(files, self._read)
                held = {}
                for job in run.jobs:
                    laid = files.get(job.path)
                    held[job.path] = laid if laid is not None else self._read(job.path)
                found = server.diagnostics(held, 120)
                for job in run.jobs:
                    self._then(job.name, found[job.path])
                with self._done:
                    for job in run.jobs:
                        self._answers[job.name] = found[job.path]
                        self._queued[number] -= job.size
                    self._done.notify_all()
        except (ServerFailed, OSError, ValueError, KeyError):
            # A server that stops, or answers what this cannot read: its
            # jobs have no answer, and the plan checks them another way.
            pass
        finally:
            with self._done:
                self._ended[number] = True
                self._done.notify_all()

    def _next(self, number: int) -> _Run | None:
        """The first run waiting for server ``number``, once there is one;
        None once it is told to stop and none waits."""
        with self._done:
            self._done.wait_for(lambda: self._waiting[number] or self._closing)
            return self._waiting[number].pop(0) if self._waiting[number] else None

    def close(self, at_once: bool = False) -> None:
        """Stop the servers and remove their folders: each shut down once it
        has finished what it was asked, or killed where it is still busy or
        ``at_once`` (an interrupt), so nothing is left running."""
        with self._done:
            self._closing = True
            self._done.notify_all()
        for number, thread in enumerate(self._threads):
            thread.join(timeout=0 if at_once else 0.5)
            if thread.is_alive() and (server := self._live[number]) is not None:
                server.kill()  # its answer never comes: the thread ends
                thread.join(timeout=5)
            elif (manager := self._managers[number]) is not None:
                manager.__exit__(None, None, None)
        shutil.rmtree(self._work, ignore_errors=True)


@dataclass(frozen=True)
class _Job:
    name: Hashable
    files: Mapping[str, bytes]
    path: str
    size: int = 0
    #: The text the server checks in place of ``files``' own for ``path``.
    shown: bytes | None = None


@dataclass
class _Run:
    """States a server lays at once: the files, and the jobs it checks."""

    files: dict[str, bytes]
    jobs: list[_Job]

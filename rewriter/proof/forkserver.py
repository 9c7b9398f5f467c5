"""One torch import for every proof process of a verify run: a fork server.

verify runs three processes at once (the proofs on the tree, on the pristine
tree, the tree's tests), and each began by importing torch: about 2 s of CPU
apiece on a 2-core machine. This file, run by the proof environment's
interpreter as ``python forkserver.py``, imports torch once, then forks one
child per job it is sent: the child takes the job's environment, working
folder, ``sys.argv`` and ``sys.path`` (as a fresh interpreter with that
``PYTHONPATH`` would have them), sends its output to the job's files and
runs ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``__main__``. Nothing of vLLM
or of a tree is imported before the fork, and each job is its own process:
a crash or a kill ends that job alone, with its exit code (negative: the
signal), as a subprocess would.

:class:`ForkServer` is the caller's side: :meth:`ForkServer.run` stands in for
``subprocess.run`` and falls back to it for any job the server cannot run the
same way (another interpreter, another environment apart from
``PYTHONPATH``, a server that has stopped). The server is standard library
only, and torch is optional: without it the jobs import what they need.

Protocol, one JSON object per line: on stdin ``{"id", "argv", "env", "cwd",
"stdout", "stderr"}``; on stdout ``{"id", "pid"}`` once forked, then
``{"id", "code"}`` when the child has ended. End of stdin: the server waits
for its children and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: ``run_subprocess`` or :meth:`ForkServer.run`.
Spawn = Callable[..., "subprocess.CompletedProcess[str]"]

# -- the server (in the proof environment) ------------------------------------------


def _preload() -> None:
    """torch, which every job imports first (vLLM imports it before its own
    settings: ``vllm/env_override.py``); nothing else."""
    before = set(sys.modules)
    try:
        import torch  # noqa: F401
    except Exception:
        # No torch, or a broken one: keep none of it; each job finds out itself.
        for name in set(sys.modules) - before:
            del sys.modules[name]


def _child(job: dict[str, Any], base_path: list[str]) -> int:
    """Become the job's process and run it; its exit code."""
    import runpy

    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)  # the server's requests are not the job's input
    out = os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    sys.dont_write_bytecode = bool(job["env"].get("PYTHONDONTWRITEBYTECODE"))
    extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    args = job["argv"][1:]
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[:] = [os.getcwd(), *extra, *base_path]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            script = os.path.abspath(args[0])
            sys.path[:] = [os.path.dirname(script), *extra, *base_path]
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def serve() -> None:
    _preload()
    base_path = sys.path[1:]  # without this file's folder
    running: dict[int, str] = {}
    pending = b""
    open_input = True

    def report(message: dict[str, Any]) -> None:
        os.write(1, (json.dumps(message) + "\n").encode())

    while open_input or running:
        if not open_input:  # nothing more to start: wait for the children
            pid, status = os.waitpid(-1, 0)
            report({"id": running.pop(pid), "code": os.waitstatus_to_exitcode(status)})
            continue
        if select.select([0], [], [], 0.05 if running else None)[0]:
            chunk = os.read(0, 1 << 16)
            open_input = bool(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in filter(None, lines):
                job = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    os._exit(_child(job, base_path))
                running[pid] = job["id"]
                report({"id": job["id"], "pid": pid})
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            report({"id": running.pop(pid), "code": os.waitstatus_to_exitcode(status)})


# -- the caller's side ---------------------------------------------------------------


class ForkServer:
    """A running fork server; :meth:`run` is ``subprocess.run`` for its jobs."""

    def __init__(self, python: Path, env: dict[str, str]) -> None:
        self.python = str(python)
        self.env = env
        self._scratch = tempfile.TemporaryDirectory(prefix="deepstack-forks-")
        self._lock = threading.Lock()
        self._started: dict[str, threading.Event] = {}
        self._ended: dict[str, threading.Event] = {}
        self._pids: dict[str, int] = {}
        self._codes: dict[str, int] = {}
        self._count = 0
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._process = subprocess.Popen(
                [self.python, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=_without_pythonpath(env),
                cwd=self._scratch.name,
            )
        except OSError:
            return  # every job falls back to a subprocess
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            job = message["id"]
            if "pid" in message:
                self._pids[job] = message["pid"]
                self._started[job].set()
            else:
                self._codes[job] = message["code"]
                self._ended[job].set()
        # The server has ended (killed?): nothing more will start or report,
        # and a child still running would outlive it unreported.
        for job, pid in list(self._pids.items()):
            if not self._ended[job].is_set():
                _kill(pid)
        for event in [*self._started.values(), *self._ended.values()]:
            event.set()

    def serves(self, command: Sequence[str], env: dict[str, str]) -> bool:
        """Whether this job runs here exactly as it would in a new interpreter."""
        match list(command):
            case [python, "-m", _, *_] | [python, _, *_] if python == self.python:
                runnable = command[1] == "-m" or not command[1].startswith("-")
            case _:
                runnable = False
        alive = self._process is not None and self._process.poll() is None
        same_env = _without_pythonpath(env) == _without_pythonpath(self.env)
        return runnable and alive and same_env

    def run(
        self,
        command: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str | Path,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        """Like ``subprocess.run(capture_output=True, text=True)``."""
        if not self.serves(command, env):
            return run_subprocess(command, env=env, cwd=cwd, timeout=timeout)
        with self._lock:
            self._count += 1
            job = str(self._count)
            self._started[job] = threading.Event()
            self._ended[job] = threading.Event()
            out = Path(self._scratch.name) / f"{job}.out"
            err = Path(self._scratch.name) / f"{job}.err"
            request = {"id": job, "argv": list(command), "env": env, "cwd": str(cwd)}
            request.update(stdout=str(out), stderr=str(err))
            try:
                assert self._process is not None and self._process.stdin is not None
                self._process.stdin.write((json.dumps(request) + "\n").encode())
                self._process.stdin.flush()
            except (OSError, ValueError):
                return run_subprocess(command, env=env, cwd=cwd, timeout=timeout)
        self._started[job].wait(timeout)
        if job not in self._pids:  # the server ended (or hung) before forking it
            return run_subprocess(command, env=env, cwd=cwd, timeout=timeout)
        if not self._ended[job].wait(timeout):
            _kill(self._pids[job])
            self._ended[job].wait()
            raise subprocess.TimeoutExpired(
                list(command), timeout, _text(out), _text(err)
            )
        code = self._codes.get(job, -1)
        return subprocess.CompletedProcess(list(command), code, _text(out), _text(err))

    @property
    def forked(self) -> int:
        """How many jobs ran as forks (the rest fell back to a subprocess)."""
        return len(self._pids)

    def close(self) -> None:
        if self._process is not None:
            if self._process.stdin is not None:
                self._process.stdin.close()
            self._process.wait()
        self._scratch.cleanup()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _without_pythonpath(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def _kill(pid: int) -> None:
    import signal

    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def run_subprocess(
    command: Sequence[str], *, env: dict[str, str], cwd: str | Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """A new interpreter for the job: what :meth:`ForkServer.run` stands in for."""
    return subprocess.run(
        list(command),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


if __name__ == "__main__":
    serve()

"""One import of torch and vLLM's dependencies for every proof process: a fork server.

verify runs three processes at once (the proofs on the tree, on the pristine
tree, the tree's tests), and each began by importing torch: about 2 s of CPU
apiece on a 2-core machine. This file, run by the proof environment's
interpreter as ``python forkserver.py [LEARNED [STOP]]``, imports torch once,
then forks one child per job it is sent: the child takes the job's
environment, working folder, ``sys.argv`` and ``sys.path`` (as a fresh
interpreter with that ``PYTHONPATH`` would have them), sends its output to
the job's files and runs ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as
``__main__``. Nothing of vLLM or of a tree is imported before the fork, and
each job is its own process: a crash or a kill ends that job alone, with its
exit code (negative: the signal), as a subprocess would.

:class:`ForkServer` is the caller's side: :meth:`ForkServer.run` stands in for
``subprocess.run`` and falls back to it for any job the server cannot run the
same way (another interpreter, another environment apart from
``PYTHONPATH``, a server that has stopped). The server is standard library
only, and torch is optional: without it the jobs import what they need.

Beyond torch, importing vLLM's third-party dependencies (transformers,
torch's compiler stack, sympy, openai, ...) was most of a job's seconds, and
every job of a verify run imports the same ones. So each child reports, as
it ends, the modules it imported from the proof environment itself (never
one of a tree, of deepstack-patch or of the job's folders), the packages it
imported from its folders (``vllm``, ``tests``: *foreign*) and the
environment variables it set. The caller keeps what *every* job of the run
imported and set (``LEARNED``, a JSON file in the user cache), and the next
server imports those modules, in the order they were imported, before it
forks:

- torch under the jobs' environment, as before; the rest after setting the
  variables the jobs set (vLLM sets some before importing torch's compiler,
  which reads them at import), as in a new interpreter;
- what those imports write in ``os.environ`` is written again in each child
  (the job's own import of the module is a no-op there);
- a foreign package cannot be imported while preloading, even if the
  environment has one installed; a module that looks for one (its state
  could depend on the tree) makes the server start again in a new
  interpreter, stopping before it (``STOP``; kept in ``LEARNED`` for next
  time);
- no garbage collection while preloading, and the preloaded objects frozen
  before forking (the gc module's advice for a fork without exec); each
  child collects as a new interpreter does;
- the preload stops at a module that starts a thread (a fork keeps only the
  calling one).

Protocol, one JSON object per line: on stdin ``{"id", "argv", "env", "cwd",
"stdout", "stderr", "report"}``; on stdout ``{"id", "pid"}`` once forked,
then ``{"id", "code"}`` when the child has ended (``{"stop": MODULE}`` before
the server starts again). End of stdin: the server waits for its children
and exits.
"""

from __future__ import annotations

import contextlib
import gc
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


class _Restart(Exception):
    """A preloaded module looked for a tree's package: preload again, stopping
    before it (its state might depend on the tree a job has)."""

    def __init__(self, module: str) -> None:
        self.module = module


class _TreeGuard:
    """While preloading, the trees' packages (``vllm``, ``tests``: what jobs
    imported from their own folders) do not exist, even if the environment
    has one installed; who looks for one is noted."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.tried = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in self.names:
            self.tried = True
            raise ModuleNotFoundError(f"{name} is a tree's, not preloaded", name=name)
        return None


def _preload(learned: dict[str, Any], stop: str | None) -> dict[str, str | None]:
    """torch, which every job imports first (vLLM imports it before its own
    settings: ``vllm/env_override.py``), then the modules every job of the
    last run imported (``learned``) up to ``stop`` or one in
    ``learned["stop"]``; the variables those imports wrote in ``os.environ``
    (None: deleted)."""
    import importlib.util
    import threading

    written: dict[str, str | None] = {}
    environ = type(os.environ)
    set_item, del_item = environ.__setitem__, environ.__delitem__

    def recording_set(self: Any, key: str, value: str) -> None:
        set_item(self, key, value)
        written[key] = value

    def recording_del(self: Any, key: str) -> None:
        del_item(self, key)
        written[key] = None

    guard = _TreeGuard(set(learned.get("foreign", [])))
    stops = {*learned.get("stop", []), stop}
    environ.__setitem__, environ.__delitem__ = recording_set, recording_del  # type: ignore[method-assign]
    sys.meta_path.insert(0, guard)
    try:
        before = set(sys.modules)
        try:
            if importlib.util.find_spec("torch") is not None:
                import torch  # noqa: F401
        except Exception:
            # A broken torch: keep none of it, nor anything that would import
            # it; each job finds out itself.
            for name in set(sys.modules) - before:
                del sys.modules[name]
            return {}
        # Set as the jobs set them, but not written by an import: the jobs
        # start without them, as in a new interpreter.
        for key, value in learned.get("environ", {}).items():
            set_item(os.environ, key, value)
        for name in learned.get("modules", []):
            if name in stops:
                break
            if name in sys.modules:
                continue
            # A failure is the job's to meet (or avoid) as well.
            with contextlib.suppress(Exception):
                importlib.import_module(name)
            if guard.tried:
                raise _Restart(name)
            if threading.active_count() > 1:
                break  # a fork would lose that thread: import no more
    finally:
        sys.meta_path.remove(guard)
        environ.__setitem__, environ.__delitem__ = set_item, del_item  # type: ignore[method-assign]
    return written


MAIN_NAMES = ("__main__", "__mp_main__")


def _job_report(job: dict[str, Any]) -> dict[str, Any]:
    """The environment's modules this job holds, and the variables it set.

    A module is the environment's if it is built in or its files are under
    the interpreter's prefixes and under none of the job's folders (the tree,
    the script's folder, the working folder); one under those folders is
    the tree's (or the job's), and its package is never preloaded (``foreign``).
    Files elsewhere (code torch generates in a temporary folder) are neither.
    Only the module's own
    ``__dict__`` is read: a lazy module's ``__getattr__`` (transformers') would
    import or warn.
    """
    import types

    def folder(path: str) -> str:
        return os.path.join(os.path.realpath(path), "")

    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots = tuple(folder(p) for p in prefixes)
    away = job["env"].get("PYTHONPATH", "").split(os.pathsep) + [job["cwd"]]
    away.append(os.path.dirname(os.path.abspath(job["argv"][1])))
    aways = tuple(folder(p) for p in away if p)
    real: dict[str, str] = {}  # a folder: its real path, once

    def where(place: str) -> str:
        if place not in real:
            real[place] = folder(place)
        return real[place]

    modules, foreign = [], {"deepstack_patch"}
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or name in MAIN_NAMES:
            continue
        own = vars(module)
        file, path = own.get("__file__"), own.get("__path__")
        places = [os.path.dirname(file)] if isinstance(file, str) else []
        try:
            places += list(path or [])
        except TypeError:
            continue
        if not all(isinstance(p, str) for p in places):
            continue
        if any(where(p).startswith(aways) for p in places):
            foreign.add(name.partition(".")[0])  # the tree's, or the job's own
        elif all(where(p).startswith(roots) for p in places) and (
            not name.startswith("deepstack_patch")
        ):
            modules.append(name)
    environ = {k: v for k, v in os.environ.items() if job["env"].get(k) != v}
    return {"modules": modules, "environ": environ, "foreign": sorted(foreign)}


def _child(
    job: dict[str, Any], base_path: list[str], preloaded: dict[str, str | None]
) -> int:
    """Become the job's process and run it; its exit code."""
    import runpy

    gc.enable()  # as in a new interpreter
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)  # the server's requests are not the job's input
    out = os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    for key, value in preloaded.items():  # what the preload's imports wrote
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
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
    if job.get("report"):
        with contextlib.suppress(Exception):
            Path(job["report"]).write_text(json.dumps(_job_report(job)))
    return code


def serve(learned_file: str | None = None, stop: str | None = None) -> None:
    learned = {}
    if learned_file:
        with contextlib.suppress(OSError, ValueError):
            learned = json.loads(Path(learned_file).read_text())

    def report(message: dict[str, Any]) -> None:
        os.write(1, (json.dumps(message) + "\n").encode())

    # As the gc module's documentation advises for a fork without exec: no
    # collection while importing (a quarter of the preload's time), then the
    # preloaded objects frozen, so that a child's collections skip them.
    gc.disable()
    try:
        preloaded = _preload(learned if isinstance(learned, dict) else {}, stop)
    except _Restart as restart:
        # Nothing is forked yet and no request read: a new interpreter takes
        # over this process, its pipes and its place, and stops before that
        # module (the caller keeps it in ``learned["stop"]`` for next time).
        report({"stop": restart.module})
        os.execv(
            sys.executable,
            [sys.executable, __file__, learned_file or "", restart.module],
        )
    gc.freeze()
    base_path = sys.path[1:]  # without this file's folder
    running: dict[int, str] = {}
    pending = b""
    open_input = True

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
                    os._exit(_child(job, base_path, preloaded))
                running[pid] = job["id"]
                report({"id": job["id"], "pid": pid})
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            report({"id": running.pop(pid), "code": os.waitstatus_to_exitcode(status)})
    # Tearing down thousands of preloaded modules takes seconds, and verify
    # waits for this process: everything is reported, so end at once.
    os._exit(0)


# -- the caller's side ---------------------------------------------------------------


class ForkServer:
    """A running fork server; :meth:`run` is ``subprocess.run`` for its jobs.

    With ``learned``, the server preloads what that file lists, and on
    :meth:`close` the file is rewritten with what every job of this run
    imported from the environment and set in it.
    """

    def __init__(
        self, python: Path, env: dict[str, str], learned: Path | None = None
    ) -> None:
        self.python = str(python)
        self.env = env
        self.learned = learned
        self._reports: list[dict[str, Any]] = []
        self._stops: list[str] = []
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
                [self.python, __file__, *([str(learned)] if learned else [])],
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
            if "stop" in message:  # the preload started again before it
                self._stops.append(message["stop"])
                continue
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
            report = Path(self._scratch.name) / f"{job}.report"
            request = {"id": job, "argv": list(command), "env": env, "cwd": str(cwd)}
            request.update(stdout=str(out), stderr=str(err), report=str(report))
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
        with contextlib.suppress(OSError, ValueError):
            self._reports.append(json.loads(report.read_text()))
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
        if self.learned is not None and self._reports:
            learned = common_ground(self._reports)
            with contextlib.suppress(OSError, ValueError, TypeError):
                self._stops += json.loads(self.learned.read_text()).get("stop", [])
            learned["stop"] = sorted(set(self._stops))
            _write_atomically(self.learned, json.dumps(learned))
        self._scratch.cleanup()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def common_ground(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What every job imported (in the first job's order) and set alike, and
    the packages any job imported from its own folders."""
    first, *rest = reports
    others = [set(other["modules"]) for other in rest]
    modules = [name for name in first["modules"] if all(name in o for o in others)]
    environ = {
        key: value
        for key, value in first["environ"].items()
        if all(other["environ"].get(key) == value for other in rest)
    }
    foreign = sorted({name for report in reports for name in report.get("foreign", [])})
    return {"modules": modules, "environ": environ, "foreign": foreign}


def _write_atomically(path: Path, text: str) -> None:
    """A torn file would only cost a preload; still, never leave one."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)


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
    serve(*(arg or None for arg in sys.argv[1:3]))

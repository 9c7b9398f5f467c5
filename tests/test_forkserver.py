"""verify's fork server: a job forked from it sees what a new interpreter sees.

These run with this test's own interpreter (no torch needed: the server then
preloads nothing) and compare each forked job with the same command run by
``subprocess``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deepstack_patch.proof import envs, proofs
from deepstack_patch.proof.forkserver import ForkServer, common_ground, run_subprocess

SHOW = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(),
    "main": __name__, "env": dict(os.environ),
    "bytecode": sys.dont_write_bytecode,
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "tree"), **extra)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _both(server: ForkServer, command: list[str], env: dict, cwd: Path) -> tuple:
    forked = server.run(command, env=env, cwd=cwd, timeout=60)
    fresh = run_subprocess(command, env=env, cwd=cwd, timeout=60)
    return forked, fresh


def test_a_forked_script_sees_a_new_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    env = _env(tmp_path, EXIT="3")
    with ForkServer(Path(sys.executable), env) as server:
        assert server.serves([sys.executable, str(script)], env)
        forked, fresh = _both(server, [sys.executable, str(script), "a"], env, tmp_path)
        assert server.forked == 1
    assert (forked.returncode, fresh.returncode) == (3, 3)
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)
    assert forked.stderr == fresh.stderr == "to stderr\n"


def test_a_forked_module_sees_a_new_interpreter(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "show_me.py").write_text(SHOW)
    env = _env(tmp_path)
    command = [sys.executable, "-m", "show_me", "--flag", "x"]
    with ForkServer(Path(sys.executable), env) as server:
        forked, fresh = _both(server, command, env, tmp_path)
        assert server.forked == 1
    assert forked.returncode == fresh.returncode == 0
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)
    assert json.loads(forked.stdout)["main"] == "__main__"


def test_a_crash_ends_its_own_job_alone(tmp_path: Path) -> None:
    crash = tmp_path / "crash.py"
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(1)\nprint('done')\n")
    env = _env(tmp_path)
    with ForkServer(Path(sys.executable), env) as server:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            late = pool.submit(
                server.run,
                [sys.executable, str(slow)],
                env=env,
                cwd=tmp_path,
                timeout=60,
            )
            crashed = server.run(
                [sys.executable, str(crash)], env=env, cwd=tmp_path, timeout=60
            )
            assert crashed.returncode == -signal.SIGSEGV
            assert late.result().returncode == 0 and late.result().stdout == "done\n"
        assert server.forked == 2


def test_a_job_past_its_timeout_is_killed(tmp_path: Path) -> None:
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    env = _env(tmp_path)
    with ForkServer(Path(sys.executable), env) as server:
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            server.run([sys.executable, str(sleeper)], env=env, cwd=tmp_path, timeout=1)
        assert time.monotonic() - started < 30
        assert raised.value.output == "started\n"


def test_other_jobs_fall_back_to_a_new_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    env = _env(tmp_path)
    other = dict(env, SOMETHING_ELSE="1")
    with ForkServer(Path(sys.executable), env) as server:
        assert not server.serves([sys.executable, str(script)], other)
        assert not server.serves(["/other/python", str(script)], env)
        assert not server.serves([sys.executable, "-c", "pass"], env)
        done = server.run(
            [sys.executable, str(script)], env=other, cwd=tmp_path, timeout=60
        )
        assert json.loads(done.stdout)["env"]["SOMETHING_ELSE"] == "1"
        assert server.forked == 0
    # A server that could not start: every job still runs.
    broken = ForkServer(tmp_path / "no-python", env)
    done = broken.run([sys.executable, str(script)], env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0
    broken.close()


def test_proofs_through_the_server_report_a_crash_per_proof(tmp_path: Path) -> None:
    (tmp_path / "t" / "vllm").mkdir(parents=True)
    tree = tmp_path / "t"
    env = envs.ProofEnv(Path(sys.executable))
    with ForkServer(env.python, envs.subprocess_env(tree)) as server:
        found = proofs.run_proofs(env, tree, ["nope#0", "nope#1"], spawn=server.run)
        assert server.forked == 1
    for patch_id in ("nope#0", "nope#1"):
        assert found[patch_id].status == "error"
        assert (
            "ended (exit code 1) before this proof reported" in found[patch_id].message
        )
        assert "KeyError" in found[patch_id].message


def test_a_killed_server_reports_its_jobs_and_leaves_no_child(tmp_path: Path) -> None:
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    env = _env(tmp_path)
    from concurrent.futures import ThreadPoolExecutor

    with ForkServer(Path(sys.executable), env) as server, ThreadPoolExecutor(1) as pool:
        job = pool.submit(
            server.run,
            [sys.executable, str(sleeper)],
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
        while not server.forked:
            time.sleep(0.05)
        (pid,) = server._pids.values()
        started = time.monotonic()
        assert server._process is not None
        server._process.kill()
        done = job.result(timeout=30)
        assert done.returncode == -1 and time.monotonic() - started < 30
    for _ in range(100):  # the orphan was killed; init reaps it
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"child {pid} still running")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except OSError:
        return "gone"


IMPORTS = """
import json, os, sys
import colorsys  # the environment's: learned
import {extra}  # learned only if every job imports it
import tree_module  # the tree's: never learned
os.environ["SET_BY_JOB"] = "{value}"
print(json.dumps(sorted(sys.modules)))
"""


def _job(tmp_path: Path, name: str, extra: str, value: str) -> Path:
    script = tmp_path / name
    script.write_text(IMPORTS.format(extra=extra, value=value))
    return script


def test_the_server_learns_what_every_job_imported_and_set(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "tree_module.py").write_text("")
    env = _env(tmp_path)
    learned = tmp_path / "cache" / "learned.json"
    one = _job(tmp_path, "one.py", "wave", "same")
    two = _job(tmp_path, "two.py", "sndhdr", "same")
    three = _job(tmp_path, "three.py", "wave", "other")
    with ForkServer(Path(sys.executable), env, learned) as server:
        for script in (one, two):
            done = server.run(
                [sys.executable, str(script)], env=env, cwd=tmp_path, timeout=60
            )
            assert done.returncode == 0, done.stderr
    first = json.loads(learned.read_text())
    assert "colorsys" in first["modules"] and "json" in first["modules"]
    assert "wave" not in first["modules"] and "sndhdr" not in first["modules"]
    assert not any(m.startswith(("tree_module", "__main__")) for m in first["modules"])
    assert first["environ"] == {"SET_BY_JOB": "same"}
    assert "tree_module" in first["foreign"]

    # The next server imports them before forking; a job sees what it set
    # only once it sets it, as in a new interpreter.
    with ForkServer(Path(sys.executable), env, learned) as server:
        script = tmp_path / "check.py"
        script.write_text(
            "import json, os, sys\n"
            "print(json.dumps(['colorsys' in sys.modules, "
            "'tree_module' in sys.modules, os.environ.get('SET_BY_JOB')]))\n"
        )
        done = server.run(
            [sys.executable, str(script)], env=env, cwd=tmp_path, timeout=60
        )
        assert json.loads(done.stdout) == [True, False, None]
        done = server.run(
            [sys.executable, str(three)], env=env, cwd=tmp_path, timeout=60
        )
        assert done.returncode == 0, done.stderr
    # Jobs that disagree on a variable: it is not set before the imports.
    assert json.loads(learned.read_text())["environ"] == {}


def test_what_the_preloads_imports_write_in_the_environment_is_kept(
    tmp_path: Path,
) -> None:
    # A module of the environment that writes os.environ at import: a
    # stand-in for torch's compiler, which sets TORCHINDUCTOR_CACHE_DIR.
    import venv

    venv.create(tmp_path / "venv", system_site_packages=True)
    python = tmp_path / "venv" / "bin" / "python"
    (site,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    (site / "writes_env.py").write_text("import os\nos.environ['WRITTEN'] = 'yes'\n")
    learned = tmp_path / "learned.json"
    learned.write_text(json.dumps({"modules": ["writes_env"], "environ": {}}))
    script = tmp_path / "show.py"
    script.write_text("import writes_env\n" + SHOW)
    env = _env(tmp_path)
    with ForkServer(python, env, learned) as server:
        forked, fresh = _both(server, [str(python), str(script)], env, tmp_path)
        assert server.forked == 1
    # The job's import found it imported: only the preload wrote WRITTEN.
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)
    assert json.loads(forked.stdout)["env"]["WRITTEN"] == "yes"


def test_common_ground_keeps_order_agreement_and_every_trees_package() -> None:
    reports = [
        {"modules": ["a", "b", "c"], "environ": {"X": "1", "Y": "1"}, "foreign": []},
        {"modules": ["c", "a"], "environ": {"X": "1", "Y": "2"}, "foreign": ["v"]},
    ]
    assert common_ground(reports) == {
        "modules": ["a", "c"],
        "environ": {"X": "1"},
        "foreign": ["v"],
    }


def test_a_forked_job_collects_garbage_as_a_new_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "gc_state.py"
    script.write_text(
        "import gc, json\nprint(json.dumps([gc.isenabled(), gc.get_threshold()]))\n"
    )
    env = _env(tmp_path)
    with ForkServer(Path(sys.executable), env) as server:
        forked, fresh = _both(server, [sys.executable, str(script)], env, tmp_path)
        assert server.forked == 1
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)
    assert json.loads(forked.stdout)[0] is True


def test_a_module_that_looks_for_a_trees_package_is_not_preloaded(
    tmp_path: Path,
) -> None:
    import venv

    venv.create(tmp_path / "venv", system_site_packages=True)
    python = tmp_path / "venv" / "bin" / "python"
    (site,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    # The environment has its own copy of the tree's package, and a module
    # whose state depends on it.
    (site / "tree_pkg.py").write_text("WHERE = 'environment'\n")
    (site / "probes_tree.py").write_text(
        "try:\n    import tree_pkg\nexcept ImportError:\n    tree_pkg = None\n"
    )
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "tree_pkg.py").write_text("WHERE = 'tree'\n")
    learned = tmp_path / "learned.json"
    modules = ["colorsys", "probes_tree", "wave"]
    learned.write_text(json.dumps({"modules": modules, "foreign": ["tree_pkg"]}))
    script = tmp_path / "check.py"
    script.write_text(
        "import json, sys\n"
        "loaded = [m in sys.modules for m in ('colorsys', 'probes_tree', 'wave')]\n"
        "import probes_tree\n"
        "print(json.dumps([loaded, probes_tree.tree_pkg.WHERE]))\n"
    )
    env = _env(tmp_path)
    with ForkServer(python, env, learned) as server:
        forked, fresh = _both(server, [str(python), str(script)], env, tmp_path)
        assert server.forked == 1
    assert json.loads(forked.stdout) == [[True, False, False], "tree"]
    assert json.loads(fresh.stdout)[1] == "tree"
    assert json.loads(learned.read_text())["stop"] == ["probes_tree"]

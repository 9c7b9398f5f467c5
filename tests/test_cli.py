"""The command line's contract: exit codes, JSON, --dry-run, errors.

These run on a small synthetic vLLM tree built from a patch's own examples,
so they need no network; tests/test_releases.py covers real releases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import COMMANDS, main
from deepstack_patch.patches import SERIES
from deepstack_patch.patches import granite4_vision_deepstack_slice as granite

from tests import support

MODEL = "vllm/model_executor/models/granite4_vision.py"


def make_tree(root: Path, model_source: str) -> Path:
    (root / "vllm" / "model_executor" / "models").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (root / MODEL).write_text(model_source)
    return root


@pytest.fixture
def needing_tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree", granite.BEFORE)


@pytest.fixture
def drifted_tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "drifted", granite.SLICED_OTHERWISE)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_status_text_names_version_state_and_location(needing_tree: Path) -> None:
    code, output = run("status", "--vllm-src", str(needing_tree))
    assert code == 0
    assert "vLLM 0.20.2" in output and "PKG-INFO" in output
    assert "vllm#40917" in output and "needed" in output
    assert f"{MODEL}:3" in output


def test_status_json_schema(needing_tree: Path) -> None:
    code, output = run("status", "--vllm-src", str(needing_tree), "--format", "json")
    assert code == 0
    document = json.loads(output)
    assert document["schema"] == 1
    assert document["tree"] == {
        "path": str(needing_tree.resolve()),
        "version": "0.20.2",
        "version_source": "PKG-INFO",
    }
    (patch,) = [p for p in document["patches"] if p["id"] == "vllm#40917"]
    assert patch["state"] == "needed"
    assert patch["files"] == [MODEL]
    assert patch["locations"][0] == {
        "path": MODEL,
        "line": 3,
        "symbol": "Granite4VisionForConditionalGeneration.forward",
        "part": "",
        "state": "needed",
        "reason": "",
    }


@pytest.mark.parametrize(
    "command",
    [
        ("status",),
        ("apply", "--check"),
        ("apply", "--dry-run"),
        ("apply",),
        ("apply", "--commit"),
    ],
    ids=" ".join,
)
def test_a_long_plan_says_how_far_it_has_come_on_stderr(
    needing_tree: Path, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    """status and apply (each of its modes) name the files their plan reads
    on stderr, piped: every few seconds (here every time), never on stdout,
    and not at all with --format json."""
    import subprocess

    from deepstack_patch.output import progress as progress_module

    if "--commit" in command:
        for name in ("AUTHOR", "COMMITTER"):
            monkeypatch.setenv(f"GIT_{name}_NAME", "t")
            monkeypatch.setenv(f"GIT_{name}_EMAIL", "t@t")
        for git in (["init", "-q"], ["add", "."], ["commit", "-qm", "vLLM"]):
            subprocess.run(["git", *git], cwd=needing_tree, check=True)
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL", 0.0)
    monkeypatch.setattr(progress_module, "is_terminal", lambda stream: False)
    monkeypatch.setattr(progress_module, "quiet", False)
    tree = str(needing_tree)
    result = CliRunner().invoke(main, [*command, "--vllm-src", tree])
    assert result.exit_code in (0, 1), result.output
    said = f"recognising the patches: files read ... 1 ({MODEL})"
    assert said in result.stderr.splitlines()
    assert "recognising" not in result.stdout
    result = CliRunner().invoke(
        main, [*command, "--vllm-src", tree, "--format", "json"]
    )
    assert "recognising" not in result.output


def test_check_exit_codes(needing_tree: Path, drifted_tree: Path) -> None:
    assert run("apply", "--check", "--vllm-src", str(needing_tree))[0] == 1
    assert run("apply", "--check", "--vllm-src", str(drifted_tree))[0] == 2
    assert run("apply", "--vllm-src", str(needing_tree))[0] == 0
    assert run("apply", "--check", "--vllm-src", str(needing_tree))[0] == 0


def test_dry_run_prints_diff_and_writes_nothing(needing_tree: Path) -> None:
    before = (needing_tree / MODEL).read_bytes()
    code, output = run("apply", "--dry-run", "--vllm-src", str(needing_tree))
    assert code == 0
    assert f"--- a/{MODEL}" in output
    assert "+            n = inputs_embeds.size(0)" in output
    assert (needing_tree / MODEL).read_bytes() == before


def test_apply_writes_then_second_apply_is_a_no_op(needing_tree: Path) -> None:
    code, output = run("apply", "--vllm-src", str(needing_tree))
    assert code == 0 and "wrote 1 file" in output
    assert (needing_tree / MODEL).read_text() == granite.AFTER
    code, output = run("apply", "--vllm-src", str(needing_tree), "--format", "json")
    assert code == 0
    assert json.loads(output)["written"] == []


def test_drifted_apply_refuses_and_writes_nothing(drifted_tree: Path) -> None:
    before = (drifted_tree / MODEL).read_bytes()
    code, output = run("apply", "--vllm-src", str(drifted_tree))
    assert code == 2
    assert "drifted" in output and "nothing was written" in output
    # The line of what was found (the slice by another bound), not the def.
    assert f"{MODEL}:5" in output and "expected" in output
    assert (drifted_tree / MODEL).read_bytes() == before


def test_skip_leaves_a_patch_out(needing_tree: Path) -> None:
    code, output = run("apply", "--vllm-src", str(needing_tree), "--skip", "vllm#40917")
    assert code == 0 and "skipped" in output
    assert (needing_tree / MODEL).read_text() == granite.BEFORE


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "--vllm-src", "/nonexistent/tree"], "no such file or directory"),
        (["status"], "give exactly one of --vllm-src"),
        (["apply", "--only", "vllm#1", "--vllm-src", "."], "unknown patch id"),
    ],
)
def test_errors_exit_2_with_a_hint(
    args: list[str], message: str, tmp_path: Path
) -> None:
    if "." in args:
        make_tree(tmp_path / "t", granite.BEFORE)
        args = [a if a != "." else str(tmp_path / "t") for a in args]
    code, output = run(*args)
    assert code == 2
    assert message in output and "hint:" in output


def test_not_a_vllm_tree_says_what_was_looked_for(tmp_path: Path) -> None:
    code, output = run("status", "--vllm-src", str(tmp_path))
    assert code == 2
    assert "not a vLLM source tree" in output
    assert "vllm/__init__.py" in output.replace("\n", "")


def test_file_instead_of_tree(tmp_path: Path) -> None:
    path = tmp_path / "setup.py"
    path.write_text("")
    code, output = run("status", "--vllm-src", str(path))
    assert code == 2 and "is a file" in output


def test_list_shows_every_patch_with_metadata() -> None:
    code, output = run("list", "--format", "json")
    assert code == 0
    document = json.loads(output)
    assert document["schema"] == 1
    listed = [
        (p["id"], p["title"], p["upstream_url"], p["fixed_in"])
        for p in document["patches"]
    ]
    expected = [(p.id, p.title, p.upstream_url, p.fixed_in) for p in SERIES]
    assert len(expected) >= 5 and listed == expected
    code, text = run("list")
    assert code == 0
    flat = " ".join(text.split())
    for patch in SERIES:  # in series order, each with its metadata
        assert f"{patch.id} {' '.join(patch.title.split())}" in flat
        assert (
            f"upstream: {patch.upstream_url} (first in vLLM {patch.fixed_in})" in flat
        )
    positions = [flat.index(f"{patch.id} ") for patch in SERIES]
    assert positions == sorted(positions)


def test_every_command_has_help() -> None:
    for command in COMMANDS:
        code, output = run(command, "--help")
        assert code == 0 and "Usage:" in output


def test_list_says_every_change_granite_s_rewrite_makes() -> None:
    """vllm#40917 adds ``n = ...`` and slices the buffers: `list` says both."""
    code, output = run("list")
    assert code == 0
    flat = " ".join(output.split())
    changes = flat.split("vllm#40917", 1)[1].split(" changes: ", 1)[1]
    changes = changes.split(" where: ", 1)[0]
    assert "n = inputs_embeds.size(0)" in changes
    assert "self._ds_buffers[lvl][:n]" in changes
    # and the rewrite of its example does make exactly those two changes
    assert "[:n]" in granite.AFTER and "[:n]" not in granite.BEFORE


# -- issue 25: bad input is refused, with a hint, and writes nothing ----------


def refused_here(args: list[str], *fragments: str) -> str:
    """Exit 2 with ``error:`` and ``hint:``; every fragment said."""
    code, output = run(*args)
    assert code == 2, output
    assert "error:" in output and "hint:" in output, output
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in:\n{output}"
    return output


@pytest.mark.parametrize(
    ("command", "option", "values"),
    [
        ("apply", "--vllm-src", ("{a}", "{b}")),
        ("status", "--vllm-src", ("{a}", "{b}")),
        ("status", "--release", ("0.20.2", "0.21.0")),
        ("apply", "--release", ("0.20.2", "0.21.0")),
        ("apply", "--format", ("text", "json")),
        ("export", "--series", ("{a}/s1", "{a}/s2")),
        ("apply", "--out", ("{a}/o1", "{a}/o2")),
        ("doctor", "--python", ("python3", "python3")),
        ("watch", "--reviewed", ("{a}/r1.toml", "{a}/r2.toml")),
    ],
)
def test_a_repeated_single_valued_option_is_refused(
    command: str, option: str, values: tuple[str, str], tmp_path: Path
) -> None:
    a = make_tree(tmp_path / "a", granite.BEFORE)
    b = make_tree(tmp_path / "b", granite.BEFORE)
    before = [support.snapshot(a), support.snapshot(b)]
    first, second = (v.format(a=a, b=b) for v in values)
    args = [command, option, first, "--only=vllm#40917", f"{option}={second}"]
    if command == "watch":
        args = [command, "--since", "0.20.2", option, first, option, second]
    elif command == "doctor":
        args = [command, option, first, option, second]
    output = refused_here(args, f"{option} given 2 times ({first}, {second})")
    assert f"hint: give {option} once" in output
    assert [support.snapshot(a), support.snapshot(b)] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_dry_run_with_check_prints_the_diff_and_the_verdict(
    needing_tree: Path,
) -> None:
    before = support.snapshot(needing_tree)
    result = CliRunner().invoke(
        main, ["apply", "--dry-run", "--check", "--vllm-src", str(needing_tree)]
    )
    assert result.exit_code == 1, result.output
    assert f"--- a/{MODEL}" in result.stdout
    assert "+            n = inputs_embeds.size(0)" in result.stdout
    assert "needed: vllm#40917" in result.stderr  # the diff stays a diff
    code, output = run(
        "apply",
        "--dry-run",
        "--check",
        "--vllm-src",
        str(needing_tree),
        "--format=json",
    )
    assert code == 1 and f"--- a/{MODEL}" in json.loads(output)["diff"]
    assert support.snapshot(needing_tree) == before


def test_dry_run_on_a_patched_tree_says_nothing_to_do(needing_tree: Path) -> None:
    assert run("apply", "--vllm-src", str(needing_tree))[0] == 0
    result = CliRunner().invoke(
        main, ["apply", "--dry-run", "--vllm-src", str(needing_tree)]
    )
    assert result.exit_code == 0 and result.stdout == ""
    assert "nothing to do" in result.stderr
    result = CliRunner().invoke(
        main, ["apply", "--dry-run", "--check", "--vllm-src", str(needing_tree)]
    )
    assert result.exit_code == 0 and result.stdout == ""
    assert "nothing needed" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["apply"],
        ["apply", "--dry-run"],
        ["apply", "--commit"],
        ["export", "--series", "{tmp}/series"],
    ],
)
def test_drift_is_an_error_like_every_other_refusal(
    args: list[str], drifted_tree: Path, tmp_path: Path
) -> None:
    """``error:``/``hint:`` on stderr, exit 2; the JSON keeps the plan and
    gains the ``error`` object every error document has."""
    import subprocess

    if "--commit" in args:
        for git in (["init", "-q"], ["add", "."], ["commit", "-qm", "vLLM"]):
            subprocess.run(
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", *git],
                cwd=drifted_tree,
                check=True,
            )
    before = support.snapshot(drifted_tree)
    args = [a.format(tmp=tmp_path) for a in args] + ["--vllm-src", str(drifted_tree)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "refused:" not in result.output
    # The plan: on stdout, but under --dry-run, whose stdout is a diff (here
    # an empty one), on stderr before the error.
    if "--dry-run" in args:
        assert result.stdout == "", result.stdout
        plan, _, error = result.stderr.partition("\nerror: ")
    else:
        assert result.stderr.startswith("error: "), result.stderr
        plan, error = result.stdout, result.stderr.removeprefix("error: ")
    assert error.startswith(f"{MODEL}:5: vllm#40917 drifted"), result.stderr
    assert "hint: " in error and "--skip vllm#40917" in error
    assert "vllm#40917" in plan and "drifted" in plan  # the plan
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["command"] == args[0]
    (patch,) = [p for p in document["patches"] if p["id"] == "vllm#40917"]
    assert patch["state"] == "drifted" and document["written"] == []
    error = document["error"]
    assert set(error) == {"message", "path", "line", "hint"}
    assert (error["path"], error["line"]) == (MODEL, 5)
    assert "drifted" in error["message"] and "--skip vllm#40917" in error["hint"]
    assert support.snapshot(drifted_tree) == before
    assert not (tmp_path / "series").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["apply", "--dry-run"],
        ["apply", "--dry-run", "--check"],
        ["apply", "--check"],
    ],
)
def test_a_refused_dry_run_gives_no_half_diff(
    args: list[str], drifted_tree: Path
) -> None:
    """One patch drifted, another needed: the run refuses (exit 2, nothing
    would be written), so no part of its rewrite may reach a pipeline that
    applies the diff, in the text diff or in the JSON document's ``diff``."""
    import subprocess
    import sys

    from deepstack_patch.patches import qwen3_vl_deepstack_resize as resize

    qwen = "vllm/model_executor/models/qwen3_vl.py"
    (drifted_tree / qwen).write_text(resize.BEFORE)
    before = support.snapshot(drifted_tree)
    command = [sys.executable, "-m", "deepstack_patch", *args]
    command += ["--vllm-src", str(drifted_tree)]
    # Without the drifted patch the run goes on: the other one has a rewrite.
    skipped = subprocess.run(
        [*command, "--skip", "vllm#40917", "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert skipped.returncode == (1 if "--check" in args else 0), skipped.stderr
    if "--dry-run" in args:
        assert f"+++ b/{qwen}" in json.loads(skipped.stdout)["diff"]
    text = subprocess.run(command, capture_output=True, text=True)
    assert text.returncode == 2, text.stderr
    assert "vllm#40917 drifted" in text.stderr
    if "--dry-run" in args:
        assert text.stdout == ""
    document = subprocess.run(
        [*command, "--format", "json"], capture_output=True, text=True
    )
    assert document.returncode == 2, document.stderr
    refused = json.loads(document.stdout)
    assert refused["written"] == [] and "drifted" in refused["error"]["message"]
    assert refused.get("diff", "") == ""
    assert ("diff" in refused) == ("--dry-run" in args)
    assert support.snapshot(drifted_tree) == before


@pytest.mark.parametrize("json_format", [False, True])
def test_a_dry_run_refuses_a_blocked_patch_as_a_write_does(
    json_format: bool, needing_tree: Path
) -> None:
    """vllm#43617 waits for vllm#40932, left out: a write refuses (exit 2),
    so a dry run gives no diff either, not the other patches' rewrites."""
    import subprocess
    import sys

    from deepstack_patch.patches import qwen3_vl_deepstack_bounds_check as bounds

    qwen = "vllm/model_executor/models/qwen3_vl.py"
    (needing_tree / qwen).write_text(bounds.BEFORE)
    before = support.snapshot(needing_tree)
    command = [sys.executable, "-m", "deepstack_patch", "apply"]
    command += ["--vllm-src", str(needing_tree), "--skip", "vllm#40932"]
    command += ["--format", "json"] if json_format else []
    blocked = "vllm#43617 requires vllm#40932, which is not selected"
    write = subprocess.run(command, capture_output=True, text=True)
    assert write.returncode == 2 and blocked in write.stderr, write.stderr
    dry = subprocess.run([*command, "--dry-run"], capture_output=True, text=True)
    assert dry.returncode == 2 and blocked in dry.stderr, dry.stderr
    assert dry.stdout == write.stdout  # the same refusal, no diff
    assert "+++ b/" not in dry.stdout
    assert support.snapshot(needing_tree) == before


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["apply"],
        ["apply", "--check"],
        ["apply", "--dry-run"],
        ["export", "--series", "{tmp}/series"],
    ],
)
def test_a_folder_that_is_not_a_vllm_tree_is_an_error(
    args: list[str], tmp_path: Path
) -> None:
    stray = tmp_path / "stray"
    (stray / "vllm").mkdir(parents=True)
    (stray / "vllm" / "__init__.py").write_text("")
    before = support.snapshot(tmp_path)
    args = [a.format(tmp=tmp_path) for a in args] + ["--vllm-src", str(stray)]
    refused_here(args, f"{stray}: not a vLLM tree: no version", "hint: pass the root")
    assert support.snapshot(tmp_path) == before


def test_a_release_too_old_for_every_patch_is_nothing_to_do(tmp_path: Path) -> None:
    old = make_tree(tmp_path / "old", "")
    (old / MODEL).unlink()
    (old / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.4.0\n")
    code, output = run("apply", "--check", "--vllm-src", str(old))
    assert code == 0 and "nothing needed" in output


def test_whether_a_tree_is_vllm_is_decided_by_the_series_given(tmp_path: Path) -> None:
    """No version: a tree holding one of the series' files is a tree; one
    holding none of them (for this series) is not."""
    from deepstack_patch.engine.errors import DeepstackError
    from deepstack_patch.engine.plan import plan_tree
    from deepstack_patch.engine.tree import VllmTree

    root = make_tree(tmp_path / "granite-only", granite.BEFORE)
    (root / "PKG-INFO").unlink()
    tree = VllmTree.open(root)
    assert tree.version_source == "unknown"
    (patch,) = [p for p in SERIES if p.id == "vllm#40917"]
    others = [p for p in SERIES if not set(tree.glob(p.paths))]
    assert others  # a patch whose files this tree lacks
    assert plan_tree(tree, [patch]).needed
    with pytest.raises(DeepstackError, match="not a vLLM tree"):
        plan_tree(tree, others)


def test_a_plan_leaves_what_it_made_counted_old_and_nothing_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan runs without the cycle collector. After it, what it made and
    still holds is counted old at once (else the first collection after it
    walks it all: a third of a second after a first status of 40 derived
    fixes), and nothing stays frozen: a full collection still finds any
    cycle among it."""
    import gc

    from deepstack_patch.engine.plan import plan_tree
    from deepstack_patch.engine.tree import VllmTree

    tree = VllmTree.open(make_tree(tmp_path / "tree", granite.BEFORE))
    held: list[object] = []
    (patch,) = [p for p in SERIES if p.id == "vllm#40917"]
    recognise = patch.recognise

    def holding(*args: object) -> object:  # trees and caches a plan keeps
        held.extend([n] for n in range(10_000))
        return recognise(*args)

    monkeypatch.setattr(patch, "recognise", holding)
    monkeypatch.setenv("DEEPSTACK_PATCH_NO_CACHE", "1")
    assert gc.isenabled()
    gc.collect()
    assert plan_tree(tree, [patch]).needed
    old = {id(o) for o in gc.get_objects(generation=2)}
    assert held and all(id(o) in old for o in held)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_command_line_leaves_the_last_collection_out(tmp_path: Path) -> None:
    """Python's exit walks every object still held to collect it (a second
    after a first status of 40 derived fixes): the command line freezes
    them first, and ``atexit`` handlers still run after it."""
    import subprocess
    import sys

    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['deepstack-patch', '--version']\n"
        "from deepstack_patch.entry import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "frozen True"


def test_status_installed_names_the_install_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.test_permissions import fake_vllm

    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    (site,) = venv.glob("lib/python3*/site-packages")
    fake_vllm(site)
    python = venv / "bin" / "python"
    result = CliRunner().invoke(
        main, ["status", "--installed", "--python", str(python)]
    )
    assert result.exit_code == 0, result.output
    headers = [line for line in result.output.splitlines() if str(site) in line]
    assert headers == [
        f"vLLM 0.1.0 installed in {site} (python {python}; version from "
        "vllm-0.1.0.dist-info/METADATA)"
    ]


@pytest.fixture(scope="module")
def venv_with_vllm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess
    import sys

    from tests.test_permissions import fake_vllm

    venv = tmp_path_factory.mktemp("relative") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    (site,) = venv.glob("lib/python3*/site-packages")
    fake_vllm(site)
    # A relative link beside it: no `py` on PATH to stand in for it.
    (venv / "bin" / "py").symlink_to("python")
    return venv.resolve()


@pytest.mark.parametrize(
    "args",
    [
        ["doctor"],
        ["verify", "--vllm-src", "{tree}"],
        ["verify", "--installed"],
        ["status", "--installed"],
        ["apply", "--installed", "--check"],
        ["revert", "--installed"],
    ],
)
@pytest.mark.parametrize("python", ["./python", "./py"])
def test_a_relative_python_is_the_one_in_the_current_folder(
    args: list[str], python: str, venv_with_vllm: Path, needing_tree: Path
) -> None:
    """``--python ./python`` typed in a venv's bin/ runs that venv's python,
    not one found on PATH nor one in a folder a proof runs in."""
    import subprocess
    import sys

    bin_folder = venv_with_vllm / "bin"
    args = [a.format(tree=needing_tree) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *args, "--python", python],
        capture_output=True,
        text=True,
        cwd=bin_folder,
    )
    output = result.stdout + result.stderr
    assert "No such file" not in output and "python has no vllm" not in output
    # The venv's own python (it has neither torch nor pytest) or its vLLM,
    # by full name.
    assert f"{venv_with_vllm}/" in output, output
    if args[0] == "verify":
        assert result.returncode == 2
        named = bin_folder / python
        assert f"--python {named}: cannot import torch, pytest" in result.stderr
    else:
        assert result.returncode in (0, 1), output


def test_status_ends_with_the_count_of_each_state(needing_tree: Path) -> None:
    """A long table ends with what it amounts to; JSON has the same counts
    (issue 41, item 2)."""
    code, output = run("status", "--vllm-src", str(needing_tree))
    assert code == 0
    total = len(SERIES)
    assert output.rstrip().splitlines()[-1] == (
        f"{total} patches: 1 needed, 0 drifted, 0 applied, {total - 1} not-applicable"
    ), output
    code, output = run(
        "status", "--vllm-src", str(needing_tree), "--skip", "vllm#38933"
    )
    assert output.rstrip().splitlines()[-1] == (
        f"{total - 1} of {total} patches selected: 1 needed, 0 drifted, "
        f"0 applied, {total - 2} not-applicable"
    ), output
    code, output = run("status", "--vllm-src", str(needing_tree), "--format", "json")
    document = json.loads(output)
    assert document["counts"] == {
        "needed": 1,
        "drifted": 0,
        "applied": 0,
        "not-applicable": total - 1,
    }
    states = [p["state"] for p in document["patches"] if p["selected"]]
    assert sum(document["counts"].values()) == len(states) == total

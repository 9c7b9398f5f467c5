"""Issue 41 item 4: a status plan of a series that reads the tree is kept
whole between runs and given again only while every file it could read is
as it was (engine/plan_memo.py): never a stale state."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from deepstack_patch.engine import manifest, plan_memo
from deepstack_patch.engine import plan as plan_module
from deepstack_patch.engine.derived import typecheck
from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.recognition_cache import RecognitionCache
from deepstack_patch.patches import SERIES

from tests.support.toys import derived_patch, toy_tree

LIMITS = "def cap(n):\n    return n\n"
LIMITS_FIXED = "def cap(n):\n    return min(n, 64)\n"
SIZES = "def size(x):\n    return x * 2\n"
SIZES_FIXED = "def size(x):\n    return x * 3\n"

FIX_LIMITS = derived_patch("local#limits", ("vllm/limits.py", LIMITS, LIMITS_FIXED))
FIX_SIZES = derived_patch("local#sizes", ("vllm/sizes.py", SIZES, SIZES_FIXED))
DERIVED = [FIX_LIMITS, FIX_SIZES]


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DEEPSTACK_PATCH_NO_CACHE", raising=False)


@pytest.fixture
def plans_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the series was planned (not given from a kept plan)."""
    made: list[int] = []
    real = plan_module._plan

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, "_plan", counted)
    return made


def tree_of(root: Path) -> object:
    tree = toy_tree(
        root,
        {
            "vllm/limits.py": LIMITS,
            "vllm/sizes.py": SIZES,
            "vllm/other.py": "VALUE = 1\n",
        },
    )
    backdate(root)
    return tree


def backdate(root: Path) -> None:
    """Files written well before the run, as a user's tree is (a file
    written in the last seconds is compared by content: see the module)."""
    old = time.time_ns() - 60 * 10**9
    for path in root.rglob("*"):
        os.utime(path, ns=(old, old), follow_symlinks=False)
    # ctime cannot be set back: a file outside vllm/ whose ctime is in the
    # plan's own time may have been written while it was read (not kept).
    time.sleep(2 * plan_memo._CTIME_TICK)


def status(tree: object, series: list = DERIVED) -> Plan:  # type: ignore[type-arg]
    cache = RecognitionCache.for_series(series)
    assert cache is not None
    return plan_tree(tree, series, rewrite=False, cache=cache)  # type: ignore[arg-type]


def states(plan: Plan) -> dict[str, str]:
    return {r.patch.id: f"{r.state.value}: {r.reason}" for r in plan.reports}


def assert_planned_again_and_drifted(
    tree: object, patch: object, plans_made: list, word: str
) -> None:
    """A status after an edit plans again, and ``patch`` drifts over ``word``."""
    made = len(plans_made)
    (again,) = states(status(tree, [patch])).values()
    assert len(plans_made) > made
    assert again.startswith("drifted") and word in again, again


def reads_needed_in(root: Path, files: dict[str, str]) -> object:
    """A tree of ``files`` beside ``FIX_READS``'s own, written well before,
    on which a first status finds that fix needed."""
    tree = toy_tree(root, {"vllm/limits.py": READS, **files})
    backdate(root)
    assert states(status(tree, [FIX_READS]))["local#reads"] == "needed: "
    return tree


def test_a_second_status_is_the_kept_plan(tmp_path: Path, plans_made: list) -> None:
    tree = tree_of(tmp_path / "tree")
    first = status(tree)
    made = len(plans_made)
    second = status(tree)
    assert len(plans_made) == made  # given whole, not planned again
    assert second.reports == first.reports
    assert states(second) == {
        "local#limits": "needed: ",
        "local#sizes": "needed: ",
    }


def test_an_edit_the_plan_read_plans_again(tmp_path: Path, plans_made: list) -> None:
    root = tmp_path / "tree"
    tree = tree_of(root)
    status(tree)
    # A patch's own file, fixed by hand: the state follows.
    (root / "vllm" / "limits.py").write_text(LIMITS_FIXED)
    assert states(status(tree))["local#limits"].startswith("applied")
    # A file that appears, and one that goes.
    (root / "vllm" / "new.py").write_text("")
    made = len(plans_made)
    status(tree)
    assert len(plans_made) > made
    (root / "vllm" / "new.py").unlink()
    made = len(plans_made)
    status(tree)
    assert len(plans_made) > made


#: A fix that reads ``obj.ceiling``, which the release defines nowhere: a
#: search of the whole package for the word decides its state.
READS = "def cap(n, obj):\n    return n\n"
READS_FIXED = "def cap(n, obj):\n    return min(n, obj.ceiling)\n"
FIX_READS = derived_patch("local#reads", ("vllm/limits.py", READS, READS_FIXED))


def test_an_edit_to_a_file_no_check_read_keeps_the_plan_unless_it_holds_a_word(
    tmp_path: Path, plans_made: list
) -> None:
    root = tmp_path / "tree"
    tree = toy_tree(root, {"vllm/limits.py": READS, "vllm/other.py": "VALUE = 1\n"})
    backdate(root)
    first = states(status(tree, [FIX_READS]))["local#reads"]
    assert first.startswith("drifted") and "`ceiling`" in first, first
    # A file no check read, with none of the words a search looked for:
    # every answer stands, and so does the plan (kept again as it is now).
    (root / "vllm" / "other.py").write_text("VALUE = 2\n")
    made = len(plans_made)
    assert states(status(tree, [FIX_READS]))["local#reads"] == first
    assert len(plans_made) == made
    # The same file, now defining the word: the search answers otherwise.
    (root / "vllm" / "other.py").write_text("class Holder:\n    ceiling = 3\n")
    assert states(status(tree, [FIX_READS]))["local#reads"] == "needed: "
    assert len(plans_made) > made
    # And back: the file held the word when the plan was kept.
    (root / "vllm" / "other.py").write_text("VALUE = 3\n")
    made = len(plans_made)
    assert states(status(tree, [FIX_READS]))["local#reads"] == first
    assert len(plans_made) > made


def test_an_edit_that_keeps_size_and_mtime_is_seen(
    tmp_path: Path, plans_made: list
) -> None:
    root = tmp_path / "tree"
    tree = tree_of(root)
    status(tree)
    target = root / "vllm" / "sizes.py"
    before = target.stat()
    fixed = SIZES.replace("x * 2", "x * 9")  # the same size; not the fix
    assert len(fixed) == len(SIZES)
    target.write_text(fixed)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    made = len(plans_made)
    assert states(status(tree))["local#sizes"].startswith("drifted")
    assert len(plans_made) > made


def test_a_file_written_around_the_manifest_is_compared_by_content(
    tmp_path: Path,
) -> None:
    """An ``lstat`` vouches for a file only where its times are well before
    the manifest was taken: ctime's ticks can be coarse, and a write in the
    same tick as the hash would look unchanged."""
    path = tmp_path / "f.py"
    path.write_text("a = 1\n")
    signature = manifest.signature_of(path.lstat())
    wrong = manifest.Entry(signature, "0" * 64)  # kept from other bytes
    just_now = manifest.Manifest(time.time(), {"f.py": wrong})
    assert not manifest.entry_of(path, just_now, wrong).same_as(wrong)
    long_ago = manifest.Manifest(time.time() + 60, {"f.py": wrong})
    long_ago.taken_at = signature[1] / 1e9 + 60  # taken a minute after the write
    assert manifest.entry_of(path, long_ago, wrong) is wrong  # lstat vouches


def test_the_package_a_walk_hashed_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first plan's manifest hashes every file of the package, and the
    kept plan's searches need those bytes again: they are the bytes the
    walk hashed (what the digests say), not a second read. A walk that an
    ``lstat`` vouched for read nothing: those files are read then."""
    root = tmp_path / "tree"
    tree_of(root)
    first = manifest.walk(root, previous=None)
    first.taken_at += 60  # as if taken a minute later: no file is racy
    later = manifest.walk(root, previous=first)
    assert later.read == {}  # long written: every lstat vouches
    on_disk = {
        f"vllm/{path.name}": path.read_bytes() for path in (root / "vllm").glob("*.py")
    }

    def unread(path: Path) -> bytes:
        raise AssertionError(f"read again: {path}")

    monkeypatch.setattr(Path, "read_bytes", unread)
    assert plan_memo._package_bytes(first) == on_disk
    monkeypatch.undo()
    assert plan_memo._package_bytes(later) == on_disk


def test_a_plan_ty_could_not_check_is_not_kept(
    tmp_path: Path, plans_made: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tree_of(tmp_path / "tree")
    real, start = typecheck.diagnostics_of, typecheck.ChecksAhead.start

    def cannot_run(root, checks):  # type: ignore[no-untyped-def]
        return [typecheck.CheckerFailed("ty crashed") for _ in checks]

    monkeypatch.setattr(typecheck, "diagnostics_of", cannot_run)
    monkeypatch.setattr(typecheck.ChecksAhead, "start", lambda root: None)  # no server
    first = status(tree)
    assert "could not check" in states(first)["local#limits"]
    monkeypatch.setattr(typecheck, "diagnostics_of", real)
    monkeypatch.setattr(typecheck.ChecksAhead, "start", start)
    made = len(plans_made)
    again = status(tree)
    assert len(plans_made) > made  # asked again, not kept
    assert states(again)["local#limits"] == "needed: "


def test_a_glob_outside_the_package_is_matched_again(
    tmp_path: Path, plans_made: list
) -> None:
    script = "def run():\n    return 1\n"
    fix = derived_patch(
        "local#tool", ("tools/run.py", script, script.replace("1", "2"))
    )
    root = tmp_path / "tree"
    tree = toy_tree(root, {"vllm/other.py": "", "tools/run.py": script})
    backdate(root)
    assert states(status(tree, [fix]))["local#tool"] == "needed: "
    assert (tmp_path / "cache" / "plans").is_dir()  # kept
    (root / "tools" / "run.py").write_text(script.replace("1", "2"))
    assert states(status(tree, [fix]))["local#tool"].startswith("applied")
    (root / "tools" / "run.py").unlink()
    assert states(status(tree, [fix]))["local#tool"].startswith("not-applicable")


def test_nothing_is_kept_for_the_built_in_series_or_without_the_cache(
    tmp_path: Path, plans_made: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tree_of(tmp_path / "tree")
    status(tree, list(SERIES))
    plan_tree(tree, DERIVED, rewrite=True, cache=RecognitionCache.for_series(DERIVED))  # type: ignore[arg-type]
    assert not (tmp_path / "cache" / "plans").exists()
    monkeypatch.setenv("DEEPSTACK_PATCH_NO_CACHE", "1")
    assert RecognitionCache.for_series(DERIVED) is None
    plan_tree(tree, DERIVED, rewrite=False, cache=None)  # type: ignore[arg-type]
    assert not (tmp_path / "cache" / "plans").exists()


#: A fix that imports a helper from another module: the names check reads
#: that module by path, and ty reads it too.
USES = "def cap(n):\n    return n\n"
USES_FIXED = "from vllm.helpers import clamp\n\n\ndef cap(n):\n    return clamp(n)\n"
FIX_USES = derived_patch("local#uses", ("vllm/limits.py", USES, USES_FIXED))


def test_an_edit_to_a_module_a_check_read_by_path_plans_again(
    tmp_path: Path, plans_made: list
) -> None:
    root = tmp_path / "tree"
    helpers = "def clamp(n):\n    return min(n, 8)\n"
    tree = toy_tree(root, {"vllm/limits.py": USES, "vllm/helpers.py": helpers})
    backdate(root)
    assert states(status(tree, [FIX_USES]))["local#uses"] == "needed: "
    (root / "vllm" / "helpers.py").write_text(helpers.replace("clamp", "bound"))
    assert_planned_again_and_drifted(tree, FIX_USES, plans_made, "clamp")


def test_a_name_found_defined_stands_while_a_file_that_defines_it_stands(
    tmp_path: Path, plans_made: list
) -> None:
    """A common name (``get``, ``device``) is defined in hundreds of files:
    an edit to one of them, if another still defines it, changes no answer."""
    root = tmp_path / "tree"
    tree = reads_needed_in(
        root,
        {
            "vllm/holder.py": "class Holder:\n    ceiling = 3\n",
            "vllm/other.py": "def top(x):\n    return x.ceiling\n",
        },
    )
    (root / "vllm" / "other.py").write_text("def top(x):\n    return 0\n")
    made = len(plans_made)
    assert states(status(tree, [FIX_READS]))["local#reads"] == "needed: "
    assert len(plans_made) == made  # holder.py still defines it
    (root / "vllm" / "holder.py").write_text("class Holder:\n    pass\n")
    assert_planned_again_and_drifted(tree, FIX_READS, plans_made, "`ceiling`")


def test_a_witness_edited_away_is_replaced_by_a_file_that_defines_the_name_now(
    tmp_path: Path, plans_made: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name the plan found defined is vouched for by the file its own
    lookup found it in (no search of the package more); where that file
    no longer defines it and another does, the kept plan stands, and the
    other file vouches from then on."""
    root = tmp_path / "tree"
    files = {
        "vllm/limits.py": READS,
        "vllm/holder.py": "class Holder:\n    ceiling = 3\n",
        "vllm/spare.py": "class Spare:\n    ceiling = 4\n",
    }
    tree = toy_tree(root, files)
    backdate(root)
    searched: list[bool] = []
    real = plan_memo._Scans._witness

    def counted(self, evidence_in, firsts):  # type: ignore[no-untyped-def]
        found = real(self, evidence_in, firsts)
        searched.append(self._in_order is not None)
        return found

    monkeypatch.setattr(plan_memo._Scans, "_witness", counted)
    assert states(status(tree, [FIX_READS]))["local#reads"] == "needed: "
    assert searched and not any(searched)  # the lookup's own first file
    (kept,) = (tmp_path / "cache" / "plans").glob("*.json")
    assert json.loads(kept.read_text())["witnesses"]["ceiling"] == ["vllm/holder.py"]
    (root / "vllm" / "holder.py").write_text("class Holder:\n    pass\n")
    made = len(plans_made)
    assert states(status(tree, [FIX_READS]))["local#reads"] == "needed: "
    assert len(plans_made) == made  # spare.py defines it
    assert json.loads(kept.read_text())["witnesses"]["ceiling"] == ["vllm/spare.py"]
    (root / "vllm" / "spare.py").write_text("class Spare:\n    pass\n")
    assert_planned_again_and_drifted(tree, FIX_READS, plans_made, "`ceiling`")


def test_the_plan_reads_the_package_bytes_the_manifest_hashed(tmp_path: Path) -> None:
    """What the plan reads of the package is what its manifest hashed as it
    began (one read of the package, and the kept plan's digests say what
    its searches saw); a file the manifest did not read is read then."""
    from deepstack_patch.engine.context import recognising_in
    from deepstack_patch.engine.derived import runtime

    root = tmp_path / "tree"
    toy_tree(root, {"vllm/limits.py": LIMITS, "vllm/sizes.py": SIZES})
    with recognising_in(root) as context:
        context.hashed = {"vllm/limits.py": b"as hashed\n"}
        package = runtime.package_of(context).by_path
    assert package["vllm/limits.py"] == b"as hashed\n"
    assert package["vllm/sizes.py"] == SIZES.encode()


def test_a_file_the_names_search_does_not_read_vouches_for_nothing(
    tmp_path: Path, plans_made: list
) -> None:
    """Only the package's Python files are searched for a name's definition:
    a data file that holds the name (a JSON key, ``"ceiling"``) is no
    witness, and an edit that takes the only definition away plans again."""
    root = tmp_path / "tree"
    tree = reads_needed_in(
        root,
        {
            "vllm/holder.py": "class Holder:\n    ceiling = 3\n",
            "vllm/configs/limits.json": '{"ceiling": 3}\n',  # sorted before holder.py
        },
    )
    (root / "vllm" / "holder.py").write_text("class Holder:\n    pass\n")
    assert_planned_again_and_drifted(tree, FIX_READS, plans_made, "`ceiling`")


def test_a_file_of_the_package_that_is_a_link_is_compared_by_what_it_holds(
    tmp_path: Path, plans_made: list
) -> None:
    """A module of the package may be a link to a file elsewhere (a
    developer's tree): the plan read the file it points to, so an edit
    there, which moves nothing of the link's own, plans again."""
    root = tmp_path / "tree"
    tree = toy_tree(root, {"vllm/limits.py": READS})
    elsewhere = tmp_path / "elsewhere" / "holder.py"
    elsewhere.parent.mkdir()
    elsewhere.write_text("class Holder:\n    ceiling = 3\n")
    (root / "vllm" / "holder.py").symlink_to(elsewhere)
    backdate(root)
    backdate(elsewhere.parent)
    assert states(status(tree, [FIX_READS]))["local#reads"] == "needed: "
    elsewhere.write_text("class Holder:\n    pass\n")
    assert_planned_again_and_drifted(tree, FIX_READS, plans_made, "`ceiling`")


def test_a_plan_of_a_package_with_a_link_to_a_folder_is_not_kept(
    tmp_path: Path, plans_made: list
) -> None:
    """ty reads the modules of a folder the package links to, which no
    manifest entry hashes: such a plan is made again each time."""
    root = tmp_path / "tree"
    tree = tree_of(root)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "helpers.py").write_text("WIDTH = 2\n")
    (root / "vllm" / "shared").symlink_to(tmp_path / "shared")
    status(tree)
    made = len(plans_made)
    status(tree)
    assert len(plans_made) > made


def test_words_asked_after_the_package_was_read_are_looked_for_too() -> None:
    """The package is read, and the words asked so far looked for, while ty
    finishes the checks a pass put off (``PlanMemo.prepare``); a check
    concluded after that may ask for more. What is kept is what one look
    at the end finds: every word's witnesses and the files holding it."""
    from types import SimpleNamespace

    package = {
        "vllm/a.py": b"ceiling = 1\nwidth = 2\n",
        "vllm/b.py": b"x.ceiling\n",
        "vllm/c.py": b"depth = 3\n",
        "vllm/fixed.py": b"depth = 4\nwidth = 5\n",  # a patch's own file
    }

    def defines(word: bytes):  # type: ignore[no-untyped-def]
        return lambda raw: word + b" =" in raw

    context = SimpleNamespace(
        mentioned={b"ceiling": defines(b"ceiling")},
        first_mentioned={},  # looked up in other code than the package's
        scanned_for={b"x."},
    )
    scans = plan_memo._Scans(package, {"vllm/fixed.py"})
    scans.look_for(context, context.scanned_for)  # type: ignore[arg-type]
    # Asked at the pass's end: a name defined nowhere but in the patch's file.
    context.mentioned[b"width"] = defines(b"width")
    context.mentioned[b"absent"] = defines(b"absent")
    context.scanned_for.add(b"depth")
    later = plan_memo._Searched.of(scans, context)  # type: ignore[arg-type]
    at_once = plan_memo._Searched.of(
        plan_memo._Scans(package, {"vllm/fixed.py"}),
        context,  # type: ignore[arg-type]
    )
    assert later == at_once
    assert later.witnesses == {b"ceiling": ["vllm/a.py"], b"width": ["vllm/a.py"]}
    assert later.words == {b"x.", b"depth", b"absent"}
    assert scans.holding[b"depth"] == {"vllm/c.py", "vllm/fixed.py"}

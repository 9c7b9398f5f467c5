"""watch and the footprint: on small synthetic trees (fast) and real releases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from deepstack_patch.cli import main
from deepstack_patch.distribution.watch import (
    CARRIED,
    KNOWN,
    NEW,
    Reviewed,
    load_reviewed,
    releases_between,
    watch,
)
from deepstack_patch.engine.footprint import normalized_code, series_footprints
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.patches import qwen3_vl_deepstack_resize as resize

MODELS = "vllm/model_executor/models"
REPO = Path(__file__).resolve().parents[1]

INIT = """
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.deepstack_input_embeds = [torch.zeros(8, self.hidden_size)]
"""

# Same code: a docstring, a comment and other line breaks.
INIT_REFORMATTED = '''
    def __init__(self, config):
        """Build the buffers."""
        super().__init__()
        self.hidden_size = config.hidden_size  # the text model's width
        self.deepstack_input_embeds = [
            torch.zeros(8, self.hidden_size)
        ]
'''

INIT_CHANGED = """
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.deepstack_input_embeds = [torch.zeros(16, self.hidden_size)]
"""

SUBCLASS = """
from .tiny import TinyDeepstackModel


class TinyMoe(TinyDeepstackModel):
    def __init__(self, config):
        super().__init__(config)
        self.deepstack_input_embeds = [torch.zeros(4, 8)]

    def unrelated(self):
        self.other = 1


class Sibling(nn.Module):
    def __init__(self):
        self.deepstack_input_embeds = None
"""


def with_init(methods: str, init: str) -> str:
    head, _, body = methods.partition("class TinyDeepstackModel(nn.Module):\n")
    return f"{head}class TinyDeepstackModel(nn.Module):{init}\n{body}"


def make_tree(root: Path, version: str, model: str) -> Path:
    (root / MODELS).mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\n"
    )
    (root / MODELS / "tiny.py").write_text(model)
    (root / MODELS / "tiny_moe.py").write_text(SUBCLASS)
    return root


def watched(tmp_path: Path, models: dict[str, str], reviewed=()):  # noqa: ANN001, ANN201
    trees = {v: make_tree(tmp_path / v, v, m) for v, m in models.items()}
    return watch(SERIES, list(models), lambda v: VllmTree.open(trees[v]), reviewed)


def test_footprint_follows_the_state_the_rewritten_methods_read(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", "0.22.0", with_init(resize.BEFORE, INIT))
    found = {
        f.patch_id: f.functions for f in series_footprints(VllmTree.open(root), SERIES)
    }
    symbols = {(f.path.rpartition("/")[2], f.symbol) for f in found["vllm#43617"]}
    assert symbols == {
        ("tiny.py", "TinyDeepstackModel._get_deepstack_input_embeds"),
        ("tiny.py", "TinyDeepstackModel._set_deepstack_input_embeds"),
        # Builds self.deepstack_input_embeds and self.hidden_size, read by them.
        ("tiny.py", "TinyDeepstackModel.__init__"),
        # A subclass in another file that builds the buffers its own way.
        ("tiny_moe.py", "TinyMoe.__init__"),
    }  # not TinyMoe.unrelated (other state), not Sibling (not in the family)
    init = next(f for f in found["vllm#43617"] if f.symbol == "TinyMoe.__init__")
    assert init.why == "writes self.deepstack_input_embeds"
    assert init.line == 6


def test_comments_formatting_and_docstrings_are_not_code() -> None:
    import ast

    def code(source: str) -> str:
        return normalized_code(
            ast.parse(source.strip().replace("\n    ", "\n")).body[0]
        )

    assert code(INIT) == code(INIT_REFORMATTED)
    assert code(INIT) != code(INIT_CHANGED)


def test_a_code_change_is_new_and_a_reformatting_is_nothing(tmp_path: Path) -> None:
    result = watched(
        tmp_path,
        {
            "0.22.0": with_init(resize.BEFORE, INIT),
            "0.22.1": with_init(resize.BEFORE, INIT_REFORMATTED),
            "0.23.0": with_init(resize.BEFORE, INIT_CHANGED),
        },
    )
    reported = {
        (c.patch_id, c.release, c.symbol, c.classification) for c in result.changes
    }
    assert reported == {
        (patch_id, "0.23.0", "TinyDeepstackModel.__init__", NEW)
        # vllm#49397 rewrites the __init__ that builds the buffers.
        for patch_id in ("vllm#40932", "vllm#43617", "vllm#49397")
    }
    change = result.changes[0]
    assert change.previous == "0.22.1" and change.kind == "changed"
    assert "-        self.deepstack_input_embeds = [torch.zeros(8" not in change.diff
    assert (
        "+        self.deepstack_input_embeds = [torch.zeros(16, self.hidden_size)]"
        in change.diff
    )
    assert result.sizes["vllm#43617"] == {"0.22.0": 4, "0.22.1": 4, "0.23.0": 4}


def test_a_reviewed_change_is_known(tmp_path: Path) -> None:
    reviewed = [
        Reviewed(
            "vllm#43617",
            "0.23.0",
            "TinyDeepstackModel.__init__",
            "more rows",
            "2025-01-01",
        )
    ]
    result = watched(
        tmp_path,
        {
            "0.22.0": with_init(resize.BEFORE, INIT),
            "0.23.0": with_init(resize.BEFORE, INIT_CHANGED),
        },
        reviewed,
    )
    classes = {c.patch_id: (c.classification, c.reason) for c in result.changes}
    assert classes == {
        "vllm#43617": (KNOWN, "more rows"),
        "vllm#40932": (NEW, ""),
        "vllm#49397": (NEW, ""),
    }


def test_what_the_series_writes_is_carried(tmp_path: Path) -> None:
    result = watched(
        tmp_path,
        {
            "0.22.0": with_init(resize.BEFORE, INIT),
            "0.23.0": with_init(resize.AFTER, INIT),
        },
    )
    mine = [c for c in result.changes if c.patch_id == "vllm#43617"]
    assert {(c.symbol, c.kind) for c in mine} == {
        ("TinyDeepstackModel._get_deepstack_input_embeds", "changed"),
        ("TinyDeepstackModel._resize_deepstack_input_embeds", "added"),
        ("TinyDeepstackModel._set_deepstack_input_embeds", "changed"),
    }
    assert result.changes, "the fix's release changed nothing"
    for change in result.changes:
        assert change.classification == CARRIED, change
        assert change.carried_by == ["vllm#43617"]


def test_the_fix_plus_more_is_new(tmp_path: Path) -> None:
    after = resize.AFTER.replace(
        "b[:num_tokens].copy_(level)", "b[:num_tokens].copy_(level * 2)"
    )
    assert after != resize.AFTER
    result = watched(
        tmp_path,
        {"0.22.0": with_init(resize.BEFORE, INIT), "0.23.0": with_init(after, INIT)},
    )
    setter = [
        c for c in result.changes if c.symbol.endswith("_set_deepstack_input_embeds")
    ]
    # vllm#40932 watches _set_ only for its writes of the state its _get_
    # reads: they moved into _resize_ exactly as vllm#43617 writes it (carried);
    # vllm#43617 rewrites the whole of _set_, and the extra `* 2` is new.
    assert [(c.patch_id, c.classification, c.series_rewrites) for c in setter] == [
        ("vllm#40932", CARRIED, False),
        ("vllm#43617", NEW, True),
    ]


# A write of the buffers moved into a block, and an unrelated line added.
INIT_WRITE_MOVED = """
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        with self._mark_tower_model(config, {"image"}):
            self.deepstack_input_embeds = [torch.zeros(8, self.hidden_size)]
"""

INIT_UNRELATED_LINE = """
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.other = config.other
        self.deepstack_input_embeds = [torch.zeros(8, self.hidden_size)]
"""


def test_a_writer_counts_only_for_its_watched_writes(tmp_path: Path) -> None:
    """``__init__`` is in vllm#43617's footprint for writing the state the
    rewritten methods read: a write moved into a block is reported, a line
    that writes other state is not."""
    result = watched(
        tmp_path,
        {
            "0.22.0": with_init(resize.BEFORE, INIT),
            "0.22.1": with_init(resize.BEFORE, INIT_UNRELATED_LINE),
            "0.23.0": with_init(resize.BEFORE, INIT_WRITE_MOVED),
        },
    )
    inits = [
        (c.patch_id, c.release)
        for c in result.changes
        if c.symbol == "TinyDeepstackModel.__init__" and c.patch_id == "vllm#43617"
    ]
    assert inits == [("vllm#43617", "0.23.0")]


def test_releases_between() -> None:
    available = ["0.22.0", "0.23.0", "0.24.0", "0.25.0"]
    assert releases_between("0.23.0", "0.25.0", available) == [
        "0.23.0",
        "0.24.0",
        "0.25.0",
    ]
    assert releases_between("0.24.0", None, available) == ["0.24.0", "0.25.0"]
    for since, until in (("0.25.0", "0.23.0"), ("0.21.0", None), ("0.25.0", None)):
        with pytest.raises(Exception) as error:
            releases_between(since, until, available)
        assert error.type.__name__ == "DeepstackError"


def test_watch_toml_is_shipped_and_valid() -> None:
    assert (REPO / "rewriter" / "watch.toml").read_bytes() == (
        REPO / "watch.toml"
    ).read_bytes()
    entries = load_reviewed(REPO / "watch.toml")
    ids = {patch.id for patch in SERIES}
    for entry in entries:
        assert entry.patch in ids, entry


def test_the_list_of_releases_is_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second run asks no index: the list is cached, the sdists too."""
    from deepstack_patch.fetch import releases

    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "2")
    with pytest.raises(Exception, match="cannot read the package index"):
        releases.release_versions("0.23.0")
    listed = tmp_path / "cache" / releases.VERSIONS_FILE
    listed.parent.mkdir(parents=True)
    listed.write_text(json.dumps({"versions": ["0.22.0", "0.23.0"]}))
    assert releases.release_versions("0.23.0") == ["0.22.0", "0.23.0"]
    # A release the cached list lacks may be new: the index is asked, and
    # when it cannot be reached the cached list serves, with a warning.
    notes: list[str] = []
    assert releases.release_versions("0.24.0", notes.append) == ["0.22.0", "0.23.0"]
    assert len(notes) == 1 and "cannot read the package index" in notes[0]


def test_git_names_the_commits_that_changed_the_function(tmp_path: Path) -> None:
    git = pytest.importorskip("git")
    from deepstack_patch.distribution.watch import WatchChange, upstream_commits

    repo = git.Repo.init(tmp_path / "vllm")
    path = f"{MODELS}/tiny.py"
    file = tmp_path / "vllm" / path
    file.parent.mkdir(parents=True)

    def commit(source: str, subject: str) -> None:
        file.write_text(source)
        repo.index.add([path])
        repo.index.commit(subject)

    commit(with_init(resize.BEFORE, INIT), "Tiny model (#100)")
    repo.create_tag("v0.22.0")
    commit(with_init(resize.BEFORE, INIT_REFORMATTED), "Docs only (#101)")
    commit(with_init(resize.BEFORE, INIT_CHANGED), "Bigger buffers (#123)")
    commit(with_init(resize.AFTER, INIT_CHANGED), "Resize on demand (#124)")
    repo.create_tag("v0.23.0")
    change = WatchChange(
        "vllm#43617",
        "0.22.0",
        "0.23.0",
        path,
        "TinyDeepstackModel.__init__",
        1,
        "changed",
        "",
        "",
    )
    found = upstream_commits(repo, change)
    assert [(c.pull_request, c.subject) for c in found] == [
        ("123", "Bigger buffers (#123)")
    ]


def test_cli_watch_exit_codes_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deepstack_patch.distribution.watch as plumbing

    trees = {
        "0.22.0": make_tree(tmp_path / "a", "0.22.0", with_init(resize.BEFORE, INIT)),
        "0.23.0": make_tree(
            tmp_path / "b", "0.23.0", with_init(resize.BEFORE, INIT_CHANGED)
        ),
    }

    def fake_run(series, since, until, reviewed_path=None, vllm_git=None):  # noqa: ANN001, ANN202
        reviewed = plumbing.load_reviewed(reviewed_path) if reviewed_path else []
        return watch(
            series, [since, until], lambda v: VllmTree.open(trees[v]), reviewed
        )

    monkeypatch.setattr(plumbing, "run_watch", fake_run)
    runner = CliRunner()
    args = ["watch", "--since", "0.22.0", "--until", "0.23.0"]
    result = runner.invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["schema"] == 1 and document["command"] == "watch"
    assert document["counts"] == {"carried": 0, "known": 0, "new": 3}
    reviewed = tmp_path / "watch.toml"
    reviewed.write_text(
        "".join(
            f'[[reviewed]]\npatch = "{p}"\nrelease = "0.23.0"\n'
            'symbol = "TinyDeepstackModel.__init__"\nreason = "r"\n'
            'reviewed = "2025-01-01"\n'
            for p in ("vllm#40932", "vllm#43617", "vllm#49397")
        )
    )
    result = runner.invoke(main, [*args, "--reviewed", str(reviewed)])
    assert result.exit_code == 0, result.output
    assert "3 changes: 0 carried, 3 known, 0 new" in result.output
    reviewed.write_text("[[reviewed]]\npatch = 'vllm#43617'\n")
    result = runner.invoke(
        main, [*args, "--reviewed", str(reviewed), "--format", "json"]
    )
    assert result.exit_code == 2
    assert (
        "lacks release, symbol, reason, reviewed"
        in json.loads(result.stdout)["error"]["message"]
    )


@pytest.mark.release
def test_real_releases_the_buffer_construction_of_0_28_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepstack_patch.distribution.watch import run_watch

    first = run_watch(SERIES, "0.27.1", "0.28.0")
    inits = {
        c.symbol: (c.classification, c.carried_by)
        for c in first.changes
        if c.patch_id == "vllm#43617" and c.symbol.endswith(".__init__")
    }
    # The buffers are built after the vision tower block: vllm#49397's rewrite.
    for owner in ("Qwen3VL", "Qwen3VLMoe", "Qwen3OmniMoeThinker"):
        symbol = f"{owner}ForConditionalGeneration.__init__"
        assert inits.get(symbol) == (CARRIED, ["vllm#49397"]), symbol
    assert first.changes
    for change in first.changes:  # every change is real code
        assert change.diff.count("\n-") + change.diff.count("\n+") > 0
    # The second run reads only the cache: no index can be reached.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    second = run_watch(SERIES, "0.27.1", "0.28.0")
    assert [c.json() for c in second.changes] == [c.json() for c in first.changes]


def test_new_changes_are_recorded_in_a_file_of_ones_own(tmp_path: Path) -> None:
    """Without --reviewed the last line suggests --reviewed FILE, not the
    watch.toml shipped with the tool (issue 41, item 6)."""
    from deepstack_patch.output.watch import print_watch
    from rich.console import Console

    result = watched(
        tmp_path,
        {
            "0.22.0": with_init(resize.BEFORE, INIT),
            "0.23.0": with_init(resize.BEFORE, INIT_CHANGED),
        },
    )
    assert result.new

    def last_line(shipped: bool, reviewed_file: str) -> str:
        result.reviewed_shipped, result.reviewed_file = shipped, reviewed_file
        console = Console(record=True, width=400)
        print_watch(console, result)
        return console.export_text().rstrip().splitlines()[-1]

    shipped = last_line(True, "/site-packages/deepstack_patch/watch.toml")
    assert "--reviewed FILE" in shipped and "watch.toml" not in shipped, shipped
    own = last_line(False, "/home/me/reviewed.toml")
    assert own.endswith("record harmless ones in /home/me/reviewed.toml)"), own

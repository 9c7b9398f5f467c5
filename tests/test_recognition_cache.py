"""The recognition cache never serves an answer for other bytes or other code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.recognition_cache import RecognitionCache
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES
from deepstack_patch.patches import qwen3_vl_deepstack_resize as resize

MODEL = "vllm/model_executor/models/qwen3_vl.py"


def make_tree(root: Path, model_source: bytes) -> VllmTree:
    (root / "vllm" / "model_executor" / "models").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: vllm\nVersion: 0.20.2\n"
    )
    (root / MODEL).write_bytes(model_source)
    return VllmTree.open(root)


def findings(tree: VllmTree, cache: RecognitionCache | None) -> object:
    """Every location the plan reports, or the error it raises."""
    try:
        plan = plan_tree(tree, SERIES, rewrite=False, cache=cache)
    except DeepstackError as exc:
        return f"error: {exc.message}"
    return [(r.patch.id, [loc.finding for loc in r.locations]) for r in plan.reports]


@pytest.fixture
def cache(tmp_path: Path) -> RecognitionCache:
    # Any fixed fingerprint serves these tests of storing and finding: they
    # must not depend on whether the series' code could be fingerprinted in
    # this worker (a whole run left for_series returning None here, issue 41).
    return RecognitionCache(tmp_path / "cache", b"tests: one series")


def test_a_changed_byte_is_never_served_a_stale_answer(
    tmp_path: Path, cache: RecognitionCache
) -> None:
    original = resize.BEFORE.encode()
    tree = make_tree(tmp_path / "tree", original)
    path = tree.root / MODEL
    first = findings(tree, cache)
    assert findings(tree, cache) == first
    entries = list(cache.directory.rglob("*.json"))
    assert len(entries) == 1, "the first plan stored its findings"

    changed_answers = 0
    for position in range(0, len(original), 9):
        mutated = bytearray(original)
        mutated[position] = ord("x") if mutated[position] != ord("x") else ord("y")
        path.write_bytes(bytes(mutated))
        cached = findings(tree, cache)  # stores the mutated file's answer
        assert cached == findings(tree, None), f"byte {position}"
        assert findings(tree, cache) == cached, f"byte {position}, read back"
        changed_answers += cached != first
    # The loop compared answers that differ from the original's: a cache
    # keyed on anything less than every byte would have served `first`.
    assert changed_answers > 10
    path.write_bytes(original)
    assert findings(tree, cache) == first


def test_an_entry_is_found_only_for_the_same_code(
    tmp_path: Path, cache: RecognitionCache
) -> None:
    tree = make_tree(tmp_path / "tree", resize.BEFORE.encode())
    findings(tree, cache)
    raw = (tree.root / MODEL).read_bytes()
    touching = [p for p in SERIES if any(m in raw for m in p.markers)]
    assert touching
    assert cache.load(MODEL, raw, touching) is not None
    other_code = RecognitionCache(cache.directory, cache.fingerprint + b"edit")
    assert other_code.load(MODEL, raw, touching) is None
    assert cache.load("vllm/model_executor/models/other.py", raw, touching) is None
    assert cache.load(MODEL, raw, touching[:-1]) is None


def test_a_hit_skips_parsing(
    tmp_path: Path, cache: RecognitionCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = make_tree(tmp_path / "tree", resize.BEFORE.encode())
    first = findings(tree, cache)

    def no_parse(*args: object) -> object:
        raise AssertionError("parsed a file the cache holds")

    for patch in SERIES:
        monkeypatch.setattr(patch, "recognise", no_parse)
    assert findings(tree, cache) == first


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_NO_CACHE", "1")
    assert RecognitionCache.for_series(SERIES) is None


@pytest.mark.parametrize(
    ("patch", "example"),
    [
        pytest.param(patch, example, id=f"{patch.id}-{example.name}")
        for patch in SERIES
        for example in patch.examples
    ],
)
def test_every_examples_findings_are_stored_and_come_back_equal(
    cache: RecognitionCache, patch: object, example: object
) -> None:
    """No finding is left out of the cache (a file left out is parsed on every
    run), and what comes back is what recognition said, details included."""
    raw = example.before.encode()  # type: ignore[attr-defined]
    found = [patch.recognise(ast.parse(raw), "example.py")]  # type: ignore[attr-defined]
    cache.store("example.py", raw, [patch], found)  # type: ignore[list-item]
    assert cache.load("example.py", raw, [patch]) == found  # type: ignore[list-item]

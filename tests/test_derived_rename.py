"""A derived patch matched up to a renaming of its function's locals
(``engine.derived.rename``): a vendor's consistent rename is followed, in
what is recognised and in what is written; anything else drifts.

Small synthetic modules written here (no release needed).
"""

from __future__ import annotations

import ast

from deepstack_patch.engine.derived import DerivedPatch
from deepstack_patch.engine.derived.units import units_of_change
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import PatchState

PATH = "vllm/stats.py"

LIMIT_LINE = "LIMIT = 4\n\n\n"

BEFORE = (
    LIMIT_LINE
    + """def scale(values, factor):
    total = 0
    for value in values:
        total += value * factor
    result = total / len(values)
    return result
"""
)

AFTER = (
    LIMIT_LINE
    + """def scale(values, factor):
    total = 0
    for value in values:
        total += value * factor
    n = len(values)
    result = total / n if n else 0.0
    return result
"""
)


def patch() -> DerivedPatch:
    return DerivedPatch(
        id="local#7",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units_of_change(PATH, BEFORE, AFTER),
    )


def state_of(source: str) -> tuple[PatchState, str]:
    findings = patch().recognise(ast.parse(source), PATH)
    assert len(findings) == 1, findings
    return findings[0].state, findings[0].reason


def test_a_renamed_local_is_needed_and_the_fix_uses_the_targets_name() -> None:
    target = BEFORE.replace("total", "acc")
    assert state_of(target) == (PatchState.NEEDED, "")
    fixed = rewrite_text(patch(), target, PATH)
    assert fixed == AFTER.replace("total", "acc")
    assert state_of(fixed) == (PatchState.APPLIED, "")
    assert rewrite_text(patch(), fixed, PATH) == fixed  # idempotent


def test_without_a_rename_nothing_changes() -> None:
    assert state_of(BEFORE) == (PatchState.NEEDED, "")
    assert rewrite_text(patch(), BEFORE, PATH) == AFTER
    assert state_of(AFTER) == (PatchState.APPLIED, "")


def test_an_inconsistent_renaming_drifts_and_names_the_conflict() -> None:
    before = BEFORE.replace(
        "    result = total / len(values)\n",
        "    mean = total / len(values)\n    result = total, mean\n",
    )
    after = before.replace(
        "    mean = total / len(values)\n",
        "    mean = total / len(values) if values else 0.0\n",
    ).replace("    result = total, mean\n", "    result = round(total, 2), mean\n")
    unit_patch = DerivedPatch(
        id="local#8",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units_of_change(PATH, before, after),
    )
    # total is `acc` in one statement the fix replaces and `tot` in the next.
    target = (
        before.replace("    total = 0\n", "    acc = 0\n    tot = 0\n")
        .replace("        total += value * factor\n", "        acc += value\n")
        .replace("    mean = total /", "    mean = acc /")
        .replace("    result = total, mean", "    result = tot, mean")
    )
    findings = unit_patch.recognise(ast.parse(target), PATH)
    assert [f.state for f in findings] == [PatchState.DRIFTED]
    assert "renaming conflict" in findings[0].reason
    assert "`total`" in findings[0].reason
    assert rewrite_text(unit_patch, target, PATH) == target


def test_renaming_onto_a_parameter_or_a_global_drifts() -> None:
    for name in ("factor", "LIMIT"):
        target = BEFORE.replace("result = total /", f"result = {name} /")
        state, reason = state_of(target)
        assert state is PatchState.DRIFTED, name
        assert "`result = total / len(values)` not found" in reason
        assert rewrite_text(patch(), target, PATH) == target


def test_a_local_a_nested_scope_reads_is_renamed_there_too() -> None:
    target = BEFORE.replace("total", "acc").replace(
        "    return result\n", "    return result, (lambda: acc)\n"
    )
    assert state_of(target) == (PatchState.NEEDED, "")
    fixed = rewrite_text(patch(), target, PATH)
    assert "    result = acc / n if n else 0.0\n" in fixed
    assert state_of(fixed) == (PatchState.APPLIED, "")


def test_a_name_a_nested_scope_binds_again_is_not_renamed() -> None:
    target = BEFORE.replace("total", "acc").replace(
        "    return result\n", "    return result, (lambda acc: acc)\n"
    )
    assert state_of(target)[0] is PatchState.DRIFTED  # a parameter in it
    assert rewrite_text(patch(), target, PATH) == target
    # Only ever a comprehension's variable: renamed, in it alone.
    before = BEFORE.replace(
        "    return result\n", "    return result, [v * 2 for v in values]\n"
    )
    after = AFTER.replace(
        "    return result\n", "    return result, [v * 3 for v in values]\n"
    )
    unit_patch = DerivedPatch(
        id="local#10",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units_of_change(PATH, before, after),
    )
    target = before.replace("[v * 2 for v in", "[w * 2 for w in")
    (finding,) = unit_patch.recognise(ast.parse(target), PATH)
    assert finding.state is PatchState.NEEDED
    fixed = rewrite_text(unit_patch, target, PATH)
    assert "[w * 3 for w in values]" in fixed
    assert rewrite_text(unit_patch, fixed, PATH) == fixed


def test_a_name_the_fix_introduces_that_the_target_has_drifts() -> None:
    # The fix brings `n`; the renamed target already has its own `n`.
    target = (
        BEFORE.replace("total", "acc")
        .replace("    acc = 0\n", "    acc = 0\n    n = 0\n")
        .replace(
            "        acc += value * factor\n",
            "        acc += value * factor\n        n += 1\n",
        )
    )
    state, reason = state_of(target)
    assert state is PatchState.DRIFTED
    assert "introduces `n`" in reason
    assert rewrite_text(patch(), target, PATH) == target


def test_a_local_the_fix_reads_that_the_target_renamed_unseen_drifts() -> None:
    # `count` is in no statement the fix must find: its new name is unknown.
    before = BEFORE.replace("    total = 0\n", "    total = 0\n    count = 0\n")
    after = before.replace("result = total / len(values)", "result = total / count")
    unit_patch = DerivedPatch(
        id="local#9",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units_of_change(PATH, before, after),
    )
    target = before.replace("total", "acc").replace("count", "cnt")
    findings = unit_patch.recognise(ast.parse(target), PATH)
    assert [f.state for f in findings] == [PatchState.DRIFTED]
    assert "uses the local `count`" in findings[0].reason
    assert rewrite_text(unit_patch, target, PATH) == target


def test_a_renamed_local_in_a_block_header_on_the_way_is_followed() -> None:
    before = BEFORE.replace(
        "    result = total / len(values)\n",
        "    result = 0.0\n"
        "    if total > LIMIT:\n"
        "        result = total / len(values)\n",
    )
    after = before.replace(
        "        result = total / len(values)\n",
        "        result = total / max(len(values), 1)\n",
    )
    unit_patch = DerivedPatch(
        id="local#11",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units_of_change(PATH, before, after),
    )
    target = before.replace("total", "acc")
    (finding,) = unit_patch.recognise(ast.parse(target), PATH)
    assert (finding.state, finding.reason) == (PatchState.NEEDED, "")
    fixed = rewrite_text(unit_patch, target, PATH)
    assert fixed == after.replace("total", "acc")
    assert rewrite_text(unit_patch, fixed, PATH) == fixed


def test_an_if_header_the_fix_changes_is_written_under_the_renaming() -> None:
    before = (
        "def f(xs):\n    total = sum(xs)\n    log(total)\n    mark()\n"
        "    if total > 0:\n        emit(total)\n    return total\n"
    )
    after = before.replace("if total > 0:", "if total >= 0:")
    derived = DerivedPatch(
        id="local#8",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units_of_change(PATH, before, after),
    )
    assert [e.kind for e in derived.units[0].edits] == ["header"]
    vendor = before.replace("total", "acc")
    [finding] = derived.recognise(ast.parse(vendor), PATH)
    assert finding.state is PatchState.NEEDED
    assert finding.details["renaming"] == {"total": "acc"}
    fixed = rewrite_text(derived, vendor, PATH)
    assert fixed == vendor.replace("if acc > 0:", "if acc >= 0:")
    # A local the fixed header reads that the target does not have: drifted.
    reads_n = DerivedPatch(
        id="local#9",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=[PATH],
        units=units_of_change(
            PATH,
            before.replace("    mark()\n", "    n = 1\n"),
            before.replace("    mark()\n", "    n = 1\n").replace(
                "if total > 0:", "if total > n:"
            ),
        ),
    )
    vendor_n = vendor.replace("    mark()\n", "    m = 1\n")
    [finding] = reads_n.recognise(ast.parse(vendor_n), PATH)
    assert finding.state is PatchState.DRIFTED
    assert "the fix uses the local `n`" in finding.reason


def test_the_rewrite_on_text_writes_the_modules_bytes() -> None:
    """plan.py rewrites a derived patch's skeleton as text (rewrite_text):
    the same bytes as the rewrite of the parsed module, newlines and a
    renaming included; None where the file declares another encoding."""
    import libcst

    for target in (
        BEFORE,
        BEFORE.replace("total", "acc"),
        BEFORE.replace("\n", "\r\n"),
        "# -*- coding: utf-8 -*-\n" + BEFORE,
    ):
        findings = [
            f
            for f in patch().recognise(ast.parse(target), PATH)
            if f.state is PatchState.NEEDED
        ]
        as_text = patch().rewrite_text(target.encode(), findings)
        as_module = patch().rewrite(libcst.parse_module(target.encode()), findings)
        assert as_text == as_module.bytes
    latin = "# -*- coding: latin-1 -*-\n" + BEFORE
    findings = patch().recognise(ast.parse(latin), PATH)
    assert patch().rewrite_text(latin.encode(), findings) is None

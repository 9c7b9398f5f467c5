"""An entry of a large literal, or a keyword of a long call, is an edit of its
own (issue 40 item 6, engine/derived/entries.py): it is carried where that
entry is as the fix expects, whatever the other entries hold, and written
as ``patch`` writes it. Small synthetic modules only (no vLLM code)."""

from __future__ import annotations

import ast
import json

import pytest
from deepstack_patch.engine.derived import entries, load_derived, write_derived
from deepstack_patch.engine.derived.units import units_of_change
from deepstack_patch.engine.footprint import named_unit
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import PatchState

from tests.test_derive import (
    PATH,
    _tree,
    derive_args,
    derived,
    git_diff,
    run,
    states,
)
from tests.test_derived_text import written
from tests.test_json_schemas import errors


def registry(*entries_: tuple[str, str], name: str = "environment_variables") -> str:
    """A module with a dict of one entry per variable, each under its
    comment, as vllm/envs.py writes them."""
    body = "".join(
        f"    # {key} says how many\n"
        f'    "{key}": lambda: int(os.getenv("{key}", "{value}")),\n'
        for key, value in entries_
    )
    return (
        "import os\n\n"
        f"{name}: dict[str, object] = {{\n{body}}}\n\n\n"
        "def read(name):\n    return environment_variables[name]()\n"
    )


BASE = [("A", "1"), ("B", "2"), ("C", "3"), ("D", "4"), ("E", "5"), ("F", "6")]
#: A release whose other entries differ: one added, one changed, one gone.
RELEASE = [("A", "1"), ("X", "0"), ("B", "2"), ("C", "3"), ("D", "4"), ("E", "7")]


def changed(pairs, key: str, value: str):
    return [(k, value if k == key else v) for k, v in pairs]


def test_one_changed_entry_is_a_unit_of_its_own_named_by_its_key() -> None:
    units = units_of_change(PATH, registry(*BASE), registry(*changed(BASE, "D", "9")))
    assert [(u.kind, u.name) for u in units] == [
        ("entry", 'environment_variables["D"]')
    ]
    (edit,) = units[0].edits
    assert edit.kind == "entry"
    # Recorded inside its statement, so that it reads and parses as code.
    assert edit.removed == (
        "environment_variables: dict[str, object] = {\n"
        "    # D says how many\n"
        '    "D": lambda: int(os.getenv("D", "4")),\n'
        "    # E says how many\n"
        "}\n"
    )
    assert (edit.before_anchor.code, edit.after_anchor.code) == ('"C": ...', '"E": ...')


def test_an_entry_as_the_fix_expects_is_carried_whatever_the_others_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    patch = derived(registry(*BASE), registry(*changed(BASE, "D", "9")))
    # As `patch` writes it: only the entry's line changes.
    assert written(
        registry(*BASE),
        registry(*changed(BASE, "D", "9")),
        registry(*RELEASE),
        monkeypatch,
    ) == registry(*changed(RELEASE, "D", "9"))
    assert states(patch, registry(*changed(RELEASE, "D", "9"))) == {
        'environment_variables["D"]': (PatchState.APPLIED, "")
    }


def test_an_entry_with_another_value_or_no_key_drifts_and_says_which() -> None:
    patch = derived(registry(*BASE), registry(*changed(BASE, "D", "9")))
    other = registry(*changed(RELEASE, "D", "8"))
    assert states(patch, other) == {
        'environment_variables["D"]': (
            PatchState.DRIFTED,
            'entry `"D"` of `environment_variables` is neither the one the fix '
            "expects nor the fixed one",
        )
    }
    gone = registry(*[p for p in RELEASE if p[0] != "D"])
    assert states(patch, gone) == {
        'environment_variables["D"]': (
            PatchState.DRIFTED,
            'entry `"D"` not found in `environment_variables`',
        )
    }


def test_the_whole_literal_absent_is_not_applicable_not_a_missing_entry() -> None:
    patch = derived(registry(*BASE), registry(*changed(BASE, "D", "9")))
    # No statement binds the name: the unit is not in this tree.
    assert states(patch, registry(*RELEASE, name="other_variables")) == {}
    # Bound, but the statement around the entries is another.
    retyped = registry(*RELEASE).replace("dict[str, object]", "dict[str, Any]")
    ((state, reason),) = states(patch, retyped).values()
    assert state is PatchState.DRIFTED
    assert reason.startswith(
        "`environment_variables` in the module is not the statement the fix "
        "expects, its entries aside"
    )


def test_a_new_entry_goes_after_its_neighbour_else_before_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed = [*BASE[:3], ("NEW", "5"), *BASE[3:]]
    before, after = registry(*BASE), registry(*fixed)
    (unit,) = units_of_change(PATH, before, after)
    assert unit.name == 'environment_variables["NEW"]'
    # After "C", where the release has it, whatever comes before it.
    assert written(before, after, registry(*RELEASE), monkeypatch) == registry(
        *RELEASE[:4], ("NEW", "5"), *RELEASE[4:]
    )
    # Without "C": right before "D", the entry it precedes in the fix.
    without_c = [p for p in RELEASE if p[0] != "C"]
    assert written(before, after, registry(*without_c), monkeypatch) == registry(
        *without_c[:3], ("NEW", "5"), *without_c[3:]
    )
    # Neither there: refused, naming both.
    patch = derived(before, after)
    neither = registry(*[p for p in RELEASE if p[0] not in ("C", "D")])
    assert states(patch, neither) == {
        'environment_variables["NEW"]': (
            PatchState.DRIFTED,
            "the entries around the fix's new ones in `environment_variables`: "
            '`"C": ...` not found, `"D": ...` not found',
        )
    }
    # The key there already, with another value: never written twice.
    there = registry(*RELEASE[:4], ("NEW", "1"), *RELEASE[4:])
    assert states(patch, there) == {
        'environment_variables["NEW"]': (
            PatchState.DRIFTED,
            'entry `"NEW"` the fix adds is in `environment_variables` already, '
            "with another value",
        )
    }


def test_a_new_last_entry_after_one_without_a_comma_gets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before, after = registry(*BASE), registry(*BASE, ("NEW", "5"))
    target = registry(*RELEASE, ("F", "6"))
    unended = target.replace('"6")),\n}', '"6"))\n}')
    assert unended != target
    assert written(before, after, unended, monkeypatch) == registry(
        *RELEASE, ("F", "6"), ("NEW", "5")
    )


SCHEDULE = """class Scheduler:
    def schedule(self, reqs):
        done = self.finished
        output = Output(
            new_reqs=reqs,
            cached_reqs=self.cached,
            num_tokens=len(reqs),
            preempted_ids={req.id for req in self.preempted},
            finished_ids=done,
            free_blocks=self.free,
        )
        return output
"""


def test_a_keyword_of_a_long_call_in_a_method_is_carried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed = SCHEDULE.replace(
        "{req.id for req in self.preempted}", "self.reset_preempted_ids"
    )
    (unit,) = units_of_change(PATH, SCHEDULE, fixed)
    assert (unit.kind, unit.name) == ("method", "Scheduler.schedule")
    assert [e.kind for e in unit.edits] == ["entry"]
    # A release with another keyword since, and one in another order.
    release = SCHEDULE.replace(
        "            free_blocks=self.free,\n",
        "            spec_tokens=self.spec,\n            free_blocks=self.free,\n",
    ).replace("num_tokens=len(reqs)", "num_tokens=sum(map(len, reqs))")
    assert written(SCHEDULE, fixed, release, monkeypatch) == release.replace(
        "{req.id for req in self.preempted}", "self.reset_preempted_ids"
    )


def test_a_set_gets_new_elements_where_its_neighbours_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = [f'        "V{n}",\n' for n in range(8)]
    code = "def ignored():\n    found: set[str] = {\n%s    }\n    return found\n"
    before = code % "".join(names)
    after = code % "".join(
        [*names[:3], "        # paths\n", '        "P",\n', *names[3:]]
    )
    release = code % "".join([*names[:3], '        "W",\n', *names[4:]])
    assert written(before, after, release, monkeypatch) == code % "".join(
        [
            *names[:3],
            "        # paths\n",
            '        "P",\n',
            '        "W",\n',
            *names[4:],
        ]
    )


def test_a_small_literal_stays_one_statement() -> None:
    before = registry(*BASE[: entries.LARGE - 1])
    after = registry(*changed(BASE[: entries.LARGE - 1], "D", "9"))
    assert [(u.kind, u.name) for u in units_of_change(PATH, before, after)] == [
        ("module-statement", "environment_variables")
    ]


def test_derive_checks_it_on_its_base_and_the_data_file_loads(tmp_path) -> None:
    before, after = registry(*BASE), registry(*changed(BASE, "D", "9"))
    base = _tree(tmp_path / "base", {PATH: before}).root
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, before, after))
    out = tmp_path / "out"
    code, output = run(*derive_args(diff, base, out), "--format", "json")
    assert code == 0, output
    document = json.loads(output)
    assert document["round_trip"] == "text"
    assert [(u["kind"], u["name"]) for u in document["units"]] == [
        ("entry", 'environment_variables["D"]')
    ]
    assert errors("derive", document) == []
    loaded = load_derived(out / "local-F1.toml")
    assert states(loaded, registry(*RELEASE)) == {
        'environment_variables["D"]': (PatchState.NEEDED, "")
    }


def test_a_data_file_derived_before_entries_were_units_still_loads(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method whose long call's keyword changed was recorded as the whole
    statement: the loader's one-truth check accepts it still."""
    fixed = SCHEDULE.replace("num_tokens=len(reqs)", "num_tokens=len(reqs) + 1")
    monkeypatch.setattr(entries, "LARGE", 1000)
    patch = derived(SCHEDULE, fixed)
    assert [e.kind for u in patch.units for e in u.edits] == ["body"]
    monkeypatch.undo()
    loaded = load_derived(write_derived(patch, tmp_path))
    assert states(loaded, SCHEDULE) == {"Scheduler.schedule": (PatchState.NEEDED, "")}


def test_an_entry_units_footprint_is_its_statement() -> None:
    """``list --footprint`` and ``watch`` find every unit of a derived patch
    again by its name: an entry's is its literal's statement."""
    module = ast.parse(
        registry(*BASE).replace("\n\n\ndef read", "\nLIMIT = 1\n\n\ndef read")
    )
    found = named_unit(module, 'environment_variables["D.E"]')
    assert (
        isinstance(found, ast.AnnAssign) and found.target.id == "environment_variables"
    )
    assert named_unit(module, "environment_variables(name=)") is found
    assert isinstance(named_unit(module, "LIMIT (1)"), ast.Assign)
    assert named_unit(module, 'other["D"]') is None


def test_entries_that_do_not_check_out_are_derived_as_their_statement(
    tmp_path,
) -> None:
    """A literal bound twice (a module redefines it) cannot be told apart
    by its skeleton: derive's self-check on the base refuses the entry, and
    the statement is carried whole, as before entries were units."""
    twice = registry(*BASE) + "\n" + registry(*BASE).split("\n\n", 1)[1]
    before, after = twice, twice.replace('"D", "4"', '"D", "9"', 1)
    base = _tree(tmp_path / "base", {PATH: before}).root
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, before, after))
    out = tmp_path / "out"
    code, output = run(*derive_args(diff, base, out), "--format", "json")
    assert code == 0, output
    assert [(u["kind"], u["name"]) for u in json.loads(output)["units"]] == [
        ("module-statement", "environment_variables")
    ]
    assert [u.kind for u in units_of_change(PATH, before, after)] == ["entry"]


MLA = """def is_mla(config):
    if not config:
        return False
    elif config.model_type in (
%s    ):
        return True
    return False
"""
MODELS = [f'        "m{n}",\n' for n in range(8)]


def test_an_element_of_a_tuple_in_an_elif_test_is_carried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = MLA % "".join(MODELS)
    after = before.replace('"m0"', '"M0"')
    (unit,) = units_of_change(PATH, before, after)
    assert [e.kind for e in unit.edits] == ["entry"]
    release = MLA % "".join([*MODELS[:5], '        "other",\n', *MODELS[5:]])
    assert written(before, after, release, monkeypatch) == release.replace(
        '"m0"', '"M0"'
    )


def test_a_header_and_its_block_both_changed_are_never_cut_to_the_entries() -> None:
    """Were the header's entries an edit alone, the block's change would be
    lost: the statement stays one edit, and the rewrite gives the fix."""
    before = MLA % "".join(MODELS)
    after = before.replace('"m0"', '"M0"').replace("return True", "return None")
    patch = derived(before, after)
    assert [e.kind for u in patch.units for e in u.edits] != ["entry"]
    assert ast.dump(ast.parse(rewrite_text(patch, before, PATH))) == ast.dump(
        ast.parse(after)
    )


def test_an_entry_of_a_class_attribute_is_named_by_its_class() -> None:
    rows = "".join(f'        "k{n}": {n},\n' for n in range(7))
    before = f"class Table:\n    WIDTHS = {{\n{rows}    }}\n"
    after = before.replace('"k3": 3', '"k3": 30')
    (unit,) = units_of_change(PATH, before, after)
    assert (unit.kind, unit.name) == ("entry", 'Table.WIDTHS["k3"]')
    patch = derived(before, after)
    assert states(patch, before.replace('"k5": 5', '"k5": 50')) == {
        'Table.WIDTHS["k3"]': (PatchState.NEEDED, "")
    }
    # No class: the unit is not in this tree.
    assert states(patch, before.replace("class Table", "class Other")) == {}


def test_a_spread_neighbour_is_recorded_with_its_stars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = "".join(f'    "k{n}": {n},\n' for n in range(6))
    before = f"TABLE = {{\n    **BASE,\n{rows}}}\n"
    after = before.replace("    **BASE,\n", '    **BASE,\n    "new": 9,\n')
    (unit,) = units_of_change(PATH, before, after)
    (edit,) = unit.edits
    assert edit.before_anchor.code == "**BASE"
    release = before.replace('"k4": 4', '"k4": 40')
    assert written(before, after, release, monkeypatch) == release.replace(
        "    **BASE,\n", '    **BASE,\n    "new": 9,\n'
    )


KERNELS = """from enum import Enum


class Platform(Enum):
    GPU = 1
    ACCEL = 2
    CPU = 3


KERNELS: dict[Platform, list[str]] = {
    Platform.GPU: [
        "fast",
        "portable",
    ],
    Platform.ACCEL: [
%s    ],
    Platform.CPU: [
        "dynamic",
        "reference",
    ],
}
"""
ACCEL = '        "tiled",\n        "portable",\n'


def test_a_dict_of_a_few_lists_on_many_lines_has_its_entries_as_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registry small by its keys and large by its lines (vllm#41813's
    ``_POSSIBLE_KERNELS``): the platform whose list the fix changes is the
    unit, and a release whose other platform's list differs has it as the
    fix expects."""
    before = KERNELS % ACCEL
    after = before.replace('"dynamic",\n', '"dynamic",\n        "vendor",\n')
    (unit,) = units_of_change(PATH, before, after)
    assert (unit.kind, unit.name) == ("entry", "KERNELS[Platform.CPU]")
    release = KERNELS % '        "tiled",\n        "experimental",\n'
    assert written(before, after, release, monkeypatch) == release.replace(
        '"dynamic",\n', '"dynamic",\n        "vendor",\n'
    )
    # The platform's own list otherwise: refused, naming it.
    patch = derived(before, after)
    other = release.replace('"reference"', '"generic"')
    assert states(patch, other) == {
        "KERNELS[Platform.CPU]": (
            PatchState.DRIFTED,
            "entry `Platform.CPU` of `KERNELS` is neither the one the fix "
            "expects nor the fixed one",
        )
    }


def test_a_dict_of_a_few_short_values_stays_one_statement() -> None:
    """Two keys on a few lines, or values that are not literals: a diff's
    context holds the statement, which stays the unit."""
    short = 'KERNELS = {\n    "gpu": ["fast"],\n    "cpu": ["dynamic"],\n}\n'
    calls = KERNELS.replace("[\n", "make(\n").replace("    ],\n", "    ),\n") % ACCEL
    for before in (short, calls):
        after = before.replace('"dynamic"', '"vendor", "dynamic"')
        assert [u.kind for u in units_of_change(PATH, before, after)] == [
            "module-statement"
        ], before

"""Issue 34 items 1-2: a derived patch writes only code whose runtime names
are there (typed attributes, a module ``__getattr__``'s declared names,
attribute names the release defines or reads somewhere), and ``verify``
never calls a fix proven on a test that stubs what it reads.

The fast tier runs on small whole trees (with their ``pyproject.toml``);
the release tier cuts one fix of each kind from 0.20.2's own files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.apply import apply_tree
from deepstack_patch.engine.derived import DerivedPatch, write_derived
from deepstack_patch.engine.derived.units import units_of_change
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.series import assemble_series, patches_from_folder
from deepstack_patch.engine.tree import ASKED_FOR, VllmTree, link_copy
from deepstack_patch.patches import SERIES

from tests.support import TARGETS
from tests.support.toys import derived_patch
from tests.support.ty_runs import checks_handed_to_ty
from tests.test_json_schemas import errors as schema_errors
from tests.test_verify_imports import git_diff


def patch_of(patch_id: str, path: str, before: str, after: str) -> DerivedPatch:
    return derived_patch(patch_id, (path, before, after))


def whole_tree(root: Path, files: dict[str, str], version: str = "0.0.1") -> Path:
    """A whole vLLM tree (its pyproject.toml: every file of the release)."""
    for path, text in {
        "pyproject.toml": "[project]\nname = 'vllm'\n",
        "PKG-INFO": f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\n",
        "vllm/__init__.py": "",
        **files,
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def report_of(root: Path, patch: DerivedPatch):
    return plan_tree(VllmTree.open(root), [patch], rewrite=False).report(patch.id)


# -- a module __getattr__ that declares its names --------------------------------

ENVS = """from typing import TYPE_CHECKING

if TYPE_CHECKING:
    VLLM_TOY_TYPED: int = 0

environment_variables = {"VLLM_TOY_LIMIT": lambda: 4}


def __getattr__(name: str):
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(name)
"""

READER = "import vllm.envs as envs\n\n\ndef limit():\n    return 1\n"


@pytest.mark.parametrize(
    ("name", "state"),
    [
        ("VLLM_TOY_LIMIT", PatchState.NEEDED),  # a key of the dict it answers
        ("VLLM_TOY_TYPED", PatchState.NEEDED),  # declared for type checkers
        ("VLLM_TOY_OTHER", PatchState.DRIFTED),  # neither
    ],
)
def test_a_setting_the_module_does_not_declare_drifts(
    tmp_path: Path, name: str, state: PatchState
) -> None:
    after = READER.replace("return 1", f"return envs.{name}")
    root = whole_tree(tmp_path, {"vllm/envs.py": ENVS, "vllm/reader.py": READER})
    report = report_of(root, patch_of("local#e", "vllm/reader.py", READER, after))
    assert report.state is state, report.reason
    if state is PatchState.DRIFTED:
        assert report.reason == (
            f"the fix needs `{name}` from `vllm.envs`, which this release lacks"
        )


# -- typed objects, and the cache ----------------------------------------------

CONFIG = "class ToyConfig:\n    def __init__(self):\n        self.limit = 4\n"
#: An attribute of that name exists elsewhere in the release: only the type
#: checker can tell that ToyConfig lacks it.
ELSEWHERE = "class Scheduler:\n    strict: bool = False\n"
TOY = """from vllm.config import ToyConfig


def check(config: ToyConfig):
    return config.limit
"""
FIXED = TOY.replace(
    "    return config.limit",
    "    if config.strict:\n        return 0\n    return config.limit",
)
TEST = """from types import SimpleNamespace

from vllm.toy import check


def test_a_strict_config_checks_nothing():
    assert check(SimpleNamespace(strict=True, limit=4)) == 0
"""


def test_a_typed_attribute_the_release_lacks_drifts_in_ty_s_words_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ty runs once per release, file and patch: the second plan reads its
    verdict from the cache; a changed file of the package is a new key."""
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    runs = checks_handed_to_ty(monkeypatch)
    files = {
        "vllm/config.py": CONFIG,
        "vllm/sched.py": ELSEWHERE,
        "vllm/toy.py": TOY,
    }
    root = whole_tree(tmp_path / "tree", files)
    patch = patch_of("local#t", "vllm/toy.py", TOY, FIXED)
    for _ in range(2):
        report = report_of(root, patch)
        assert report.state is PatchState.DRIFTED
        assert report.reason == (
            "the fix reads `ToyConfig.strict`, which this release lacks (ty: "
            "Object of type `ToyConfig` has no attribute `strict` [missing-attribute])"
        )
    assert len(runs) == 1
    assert not apply_tree(VllmTree.open(root), [patch], {patch.id}).written
    assert (root / "vllm/toy.py").read_text() == TOY
    # The release that has the field: a new key, and the fix is needed.
    (root / "vllm/config.py").write_text(CONFIG + "        self.strict = False\n")
    assert report_of(root, patch).state is PatchState.NEEDED
    assert len(runs) == 2


def test_apply_says_the_fix_cannot_run_here_not_that_the_shape_is_unknown(
    tmp_path: Path,
) -> None:
    """The shape is recognised; what the fix reads is missing. ``apply``
    names the place, what is missing and what to do, in text and JSON."""
    root = whole_tree(
        tmp_path / "tree",
        {"vllm/config.py": CONFIG, "vllm/sched.py": ELSEWHERE, "vllm/toy.py": TOY},
    )
    folder = tmp_path / "patches"
    folder.mkdir()
    write_derived(patch_of("local#t", "vllm/toy.py", TOY, FIXED), folder)
    command = [sys.executable, "-m", "deepstack_patch", "apply", "--vllm-src"]
    command += [str(root), "--patches", str(folder), "--only", "local#t"]
    text = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert text.returncode == 2, text.stderr
    assert (
        "error: vllm/toy.py:4: local#t drifted: the fix's code cannot run on this "
        "release: the fix reads `ToyConfig.strict`, which this release lacks"
    ) in text.stderr
    # No upstream change is known to add it: the hint names none.
    assert "adapt the fix to this release by hand" in text.stderr
    assert "upstream change" not in text.stderr
    assert "--skip local#t" in text.stderr
    assert (root / "vllm/toy.py").read_text() == TOY
    json_run = subprocess.run(
        [*command, "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert json_run.returncode == 2
    error = json.loads(json_run.stdout)["error"]
    assert error["message"].startswith("local#t drifted: the fix's code cannot run")
    assert (error["path"], error["line"]) == ("vllm/toy.py", 4)


HEAD = """class Head:
    def __init__(self):
        self.limit = 4

    def combine(self, hidden):
        return hidden
"""


def test_an_attribute_of_self_is_named_by_its_class(tmp_path: Path) -> None:
    """ty types ``self`` in ``combine`` as ``Self@combine``: the reason names
    the class the unit is a method of, ``Head``, beside ty's own words."""
    fixed = HEAD.replace("return hidden", "return hidden if self.strict else 0")
    root = whole_tree(tmp_path, {"vllm/head.py": HEAD, "vllm/sched.py": ELSEWHERE})
    report = report_of(root, patch_of("local#s", "vllm/head.py", HEAD, fixed))
    assert report.state is PatchState.DRIFTED
    assert report.reason == (
        "the fix reads `Head.strict`, which this release lacks (ty: Object of "
        "type `Self@combine` has no attribute `strict` [missing-attribute])"
    )


NORM = "class Norm:\n    def __init__(self, size):\n        self.size = size\n"
USER = "from vllm.norm import Norm\n\n\ndef build():\n    return Norm(4)\n"


def test_an_argument_the_patch_gives_its_callee_in_another_file_is_there(
    tmp_path: Path,
) -> None:
    """ty sees the callee as the tree has it; the parameter the patch adds
    there (vllm#38191 on 0.20.2) is no unknown argument, and one it does
    not add is."""
    fixed_norm = NORM.replace("size):", "size, shards=1):")
    fixed_user = USER.replace("Norm(4)", "Norm(4, shards=2)")
    root = whole_tree(tmp_path / "tree", {"vllm/norm.py": NORM, "vllm/user.py": USER})
    both = [
        *units_of_change("vllm/norm.py", NORM, fixed_norm),
        *units_of_change("vllm/user.py", USER, fixed_user),
    ]
    patch = DerivedPatch(
        id="local#n",
        title="t",
        symptom="s",
        base="0.0.1",
        paths=["vllm/norm.py", "vllm/user.py"],
        units=both,
    )
    assert report_of(root, patch).state is PatchState.NEEDED
    alone = patch_of("local#u", "vllm/user.py", USER, fixed_user)
    assert "[unknown-argument]" in report_of(root, alone).reason


SCHED = """from vllm.config import ToyConfig


class Scheduler:
    def __init__(self, config: ToyConfig):
        self.limit = config.limit
"""


def test_an_attribute_the_patch_assigns_from_one_the_release_lacks_drifts(
    tmp_path: Path,
) -> None:
    """The fix assigns ``self.strict`` from ``config.strict`` in the same
    file (vllm#50275's ``self.is_encoder_only = vllm_config.is_encoder_only``
    on 0.18.0-0.25.0): the name it defines is no excuse for the config's
    field it reads, which the release lacks."""
    fixed = SCHED + "        self.strict = config.strict\n"
    root = whole_tree(
        tmp_path, {"vllm/config.py": CONFIG, "vllm/sched.py": SCHED, "vllm/x.py": ""}
    )
    report = report_of(root, patch_of("local#a", "vllm/sched.py", SCHED, fixed))
    assert report.state is PatchState.DRIFTED
    assert report.reason == (
        "the fix reads `ToyConfig.strict`, which this release lacks (ty: "
        "Object of type `ToyConfig` has no attribute `strict` [missing-attribute])"
    )


PARSER = """class Parser:
    engine: bool = True


def flush(parser: Parser | None, engine_based: bool):
    if engine_based:
        return parser.finish()  # type: ignore[union-attr, attr-defined]
    return None
"""


@pytest.mark.parametrize(
    ("read", "state"),
    [("finish", PatchState.NEEDED), ("close", PatchState.DRIFTED)],
)
def test_a_read_the_release_makes_only_narrowed_from_none_is_no_new_diagnostic(
    tmp_path: Path, read: str, state: PatchState
) -> None:
    """The release reads ``finish`` off ``Parser | None`` under mypy's
    ignore; the fix reads it under ``is not None`` (vllm#47606 on 0.25.0),
    so ty's ``Parser | None`` becomes ``Parser``: the same read, no new
    diagnostic. A name the release does not read there still drifts."""
    fixed = PARSER.replace(
        "    if engine_based:\n        return parser.finish()",
        "    if parser is not None and parser.engine:\n"
        f"        flushed = parser.{read}()",
    ).replace("    return None", "        return flushed\n    return None")
    root = whole_tree(tmp_path, {"vllm/parse.py": PARSER})
    report = report_of(root, patch_of("local#p", "vllm/parse.py", PARSER, fixed))
    assert report.state is state, report.reason
    if state is PatchState.DRIFTED:
        assert report.reason.startswith("the fix reads `Parser.close`")


# -- names there at run time from outside vLLM (issue 40, item 4) ---------------

PARSER_SUBCLASS = """import argparse


class FlexParser(argparse.ArgumentParser):
    def load(self, args):
        return args
"""
PROCESSOR = """from transformers.processing_utils import ProcessorMixin


class ToyProcessor(ProcessorMixin):
    def vocab(self):
        return self.tokenizer.get_vocab()

    def special(self):
        return []
"""
#: A vLLM class between the fix's class and the outside one, in another file.
BASE_PARSER = (
    "from argparse import ArgumentParser\n\n\nclass Base(ArgumentParser):\n    pass\n"
)
CHILD_PARSER = """from vllm.base import Base


class Child(Base):
    def load(self, args):
        return args
"""
TORCH_MODEL = """from torch import nn


class Head(nn.Module):
    def combine(self, hidden):
        return hidden
"""
OWN_PROCESSOR = PROCESSOR.replace(
    "    def special(self):",
    "    def __init__(self):\n        self.tok = None\n\n    def special(self):",
)


@pytest.mark.parametrize(
    ("file", "old", "new", "state"),
    [
        # argparse's ArgumentParser has it (vllm#51573 on 0.20.2).
        pytest.param(
            PARSER_SUBCLASS,
            "return args",
            "return self._option_string_actions",
            PatchState.NEEDED,
            id="standard-library",
        ),
        # argparse has no such name (ty reads the standard library too).
        pytest.param(
            PARSER_SUBCLASS,
            "return args",
            "return self._option_strings_map",
            PatchState.DRIFTED,
            id="standard-library-lacks-it",
        ),
        pytest.param(
            CHILD_PARSER,
            "return args",
            "return self._option_string_actions",
            PatchState.NEEDED,
            id="through-a-vllm-base-of-another-file",
        ),
        # What a transformers processor holds (vllm#47298's tokenizer).
        pytest.param(
            PROCESSOR,
            "return []",
            "return self.tokenizer.add_tokens([])",
            PatchState.NEEDED,
            id="dependency",
        ),
        # The dependency's own attribute, read off self: a vLLM subclass's
        # field a later change added looks the same; not taken.
        pytest.param(
            PROCESSOR,
            "return []",
            "return self.special_tokens_map_v2",
            PatchState.DRIFTED,
            id="a-dependency-s-attribute-of-self",
        ),
        pytest.param(
            OWN_PROCESSOR,
            "return []",
            "return self.tok.add_tokens([])",
            PatchState.DRIFTED,
            id="an-attribute-vllm-sets",
        ),
        # A torch module answers what vLLM registers: never inherited.
        pytest.param(
            TORCH_MODEL,
            "return hidden",
            "return self.fc_norm_after(hidden)",
            PatchState.DRIFTED,
            id="torch-module",
        ),
    ],
)
def test_an_attribute_inherited_from_a_class_outside_vllm_is_there(
    tmp_path: Path, file: str, old: str, new: str, state: PatchState
) -> None:
    """No vLLM file defines or reads the name; the class inherits it from
    the standard library or a dependency (read where this Python has the
    source), so it is there at run time. What a vLLM class would have to
    define, or a torch module, still drifts."""
    path = "vllm/child.py" if file is CHILD_PARSER else "vllm/toy.py"
    root = whole_tree(tmp_path, {path: file, "vllm/base.py": BASE_PARSER})
    report = report_of(root, patch_of("local#o", path, file, file.replace(old, new)))
    assert report.state is state, report.reason
    if state is PatchState.DRIFTED:
        missing = new.removeprefix("return self.").split("(")[0]
        assert missing.rpartition(".")[2] in report.reason
        assert "this release lacks" in report.reason or (
            "which nothing in this release defines or reads" in report.reason
        )


LOADER = """import argparse
from typing import TYPE_CHECKING

from torch import nn
from transformers import AutoModel

from vllm.base import Base

if TYPE_CHECKING:
    from transformers import PreTrainedModel
else:
    PreTrainedModel = object


class Loader:
    def decoder_of(self, config):
        return None
"""


@pytest.mark.parametrize(
    ("code", "state"),
    [
        # vllm#30518 on 0.19.0: a transformers model's method, the class
        # imported for the type checker alone.
        pytest.param(
            "model: PreTrainedModel = AutoModel.from_config(config)\n"
            "        return type(model.get_decoder())",
            PatchState.NEEDED,
            id="dependency",
        ),
        pytest.param(
            "model = AutoModel.from_config(config)\n"
            "        return type(model.get_decoder())",
            PatchState.DRIFTED,
            id="not-annotated",
        ),
        pytest.param(
            "parser: argparse.ArgumentParser = config\n"
            "        return parser._option_string_actions",
            PatchState.NEEDED,
            id="standard-library",
        ),
        pytest.param(
            "parser: argparse.ArgumentParser = config\n"
            "        return parser._option_strings_map",
            PatchState.DRIFTED,
            id="standard-library-lacks-it",
        ),
        pytest.param(
            "model: Base = config\n        return model.get_decoder()",
            PatchState.DRIFTED,
            id="a-vllm-class",
        ),
        pytest.param(
            "model: nn.Module = config\n        return model.get_decoder()",
            PatchState.DRIFTED,
            id="torch-module",
        ),
        pytest.param(
            "model: Base = config\n"
            "        model: PreTrainedModel = model\n"
            "        return model.get_decoder()",
            PatchState.DRIFTED,
            id="annotated-twice",
        ),
    ],
)
def test_a_local_the_fix_annotates_with_a_class_outside_vllm(
    tmp_path: Path, code: str, state: PatchState
) -> None:
    """What an object of a dependency's class holds is there at run time
    where the fix's own code annotates the local with that class (issue 40
    item 4); an unannotated local, a vLLM class, a torch module, a name the
    standard library's class lacks, or a local annotated two ways, drift."""
    fixed = LOADER.replace("return None", code)
    root = whole_tree(tmp_path, {"vllm/loader.py": LOADER, "vllm/base.py": BASE_PARSER})
    report = report_of(root, patch_of("local#a", "vllm/loader.py", LOADER, fixed))
    assert report.state is state, report.reason
    if state is PatchState.DRIFTED:
        assert "_option_strings_map" in report.reason or (
            "get_decoder" in report.reason
        )


def test_a_local_annotated_with_a_class_the_fix_itself_imports(tmp_path: Path) -> None:
    """vllm#30518 on 0.19.0 adds ``PreTrainedModel`` to the file's import
    under ``if TYPE_CHECKING:`` and annotates a local with it: the class
    the fix imports counts as the file's (issue 40 item 4). Without the
    fix's import the same local names nothing the file imports, and drifts."""
    release = LOADER.replace(
        "if TYPE_CHECKING:\n    from transformers import PreTrainedModel\n"
        "else:\n    PreTrainedModel = object\n",
        "if TYPE_CHECKING:\n    from transformers import AutoConfig\n",
    )
    code = (
        "model: PreTrainedModel = AutoModel.from_config(config)\n"
        "        return type(model.get_decoder())"
    )
    imported = release.replace(
        "from transformers import AutoConfig",
        "from transformers import AutoConfig, PreTrainedModel",
    ).replace("return None", code)
    not_imported = release.replace("return None", code)
    files = {"vllm/loader.py": release, "vllm/base.py": BASE_PARSER}
    root = whole_tree(tmp_path / "imported", files)
    report = report_of(root, patch_of("local#m", "vllm/loader.py", release, imported))
    assert report.state is PatchState.NEEDED, report.reason
    root = whole_tree(tmp_path / "not-imported", files)
    report = report_of(
        root, patch_of("local#n", "vllm/loader.py", release, not_imported)
    )
    assert report.state is PatchState.DRIFTED, report.reason
    assert "`PreTrainedModel`" in report.reason


MIXIN = """class MultiModalMixin:
    def compile_encoder(self):
        return None
"""
VERSIONED = """class Base:
    @staticmethod
    def check_version(minimum: str) -> bool:
        return True
"""
MIXED = """from vllm.base import Base
from vllm.mixin import MultiModalMixin


class Model(MultiModalMixin, Base):
    pass
"""
#: A class mixing it in that lacks the name.
ALONE = """from vllm.mixin import MultiModalMixin


class Bare(MultiModalMixin):
    pass
"""


@pytest.mark.parametrize(
    ("models", "state"),
    [
        pytest.param(
            {"vllm/model.py": MIXED}, PatchState.NEEDED, id="every-class-has-it"
        ),
        pytest.param(
            {
                "vllm/models/__init__.py": "from vllm.models.model import Model\n",
                "vllm/models/model.py": MIXED,
            },
            PatchState.NEEDED,
            id="in-a-package",
        ),
        pytest.param(
            {"vllm/model.py": MIXED, "vllm/bare.py": ALONE},
            PatchState.DRIFTED,
            id="one-class-lacks-it",
        ),
        pytest.param({}, PatchState.DRIFTED, id="no-class-mixes-it-in"),
    ],
)
def test_an_attribute_of_a_mixin_is_there_where_every_class_mixing_it_in_has_it(
    tmp_path: Path, models: dict[str, str], state: PatchState
) -> None:
    """ty reads a mixin alone: ``self.check_version`` in a method of
    ``MultiModalMixin`` is missing to it (vllm#30518 on 0.19.0). At run
    time ``self`` is an object of a class that mixes it in: where every vLLM
    class that does has the name (through ``Base``), it is there; one that
    lacks it, or none at all, and the fix drifts (issue 40 item 4)."""
    fixed = MIXIN.replace("return None", 'return self.check_version("5.0") or None')
    root = whole_tree(
        tmp_path, {"vllm/mixin.py": MIXIN, "vllm/base.py": VERSIONED, **models}
    )
    report = report_of(root, patch_of("local#x", "vllm/mixin.py", MIXIN, fixed))
    assert report.state is state, report.reason
    if state is PatchState.DRIFTED:
        assert "check_version" in report.reason


TOKENIZER = """from typing import Protocol


class TokenizerLike(Protocol):
    def decode(self, ids: list[int]) -> str: ...
"""
ABSTRACT = """from abc import ABC, abstractmethod


class TokenizerLike(ABC):
    @abstractmethod
    def decode(self, ids: list[int]) -> str: ...
"""
IMPLEMENTED = (
    ABSTRACT
    + """

class Own(TokenizerLike):
    def decode(self, ids: list[int]) -> str:
        return ""
"""
)
INFO = """from vllm.tokenizers import TokenizerLike


def pad_id(tokenizer: TokenizerLike):
    return 0
"""


@pytest.mark.parametrize(
    ("interface", "state"),
    [
        pytest.param(TOKENIZER, PatchState.NEEDED, id="protocol"),  # vllm#39344
        pytest.param(ABSTRACT, PatchState.NEEDED, id="abstract-not-implemented"),
        pytest.param(IMPLEMENTED, PatchState.DRIFTED, id="abstract-implemented"),
        pytest.param(
            CONFIG.replace("ToyConfig", "TokenizerLike"),
            PatchState.DRIFTED,
            id="concrete",
        ),
    ],
)
def test_an_attribute_ty_misses_on_an_open_interface_is_there(
    tmp_path: Path, interface: str, state: PatchState
) -> None:
    """ty says ``TokenizerLike`` has no ``unk_token_id``; where it is a
    Protocol (or an abstract class no vLLM class derives from), the object
    at run time comes from outside vLLM, a Hugging Face tokenizer, which
    has it; a class vLLM implements does not, nor does a concrete one."""
    fixed = INFO.replace("return 0", "return tokenizer.unk_token_id or 0")
    root = whole_tree(tmp_path, {"vllm/tokenizers.py": interface, "vllm/info.py": INFO})
    report = report_of(root, patch_of("local#i", "vllm/info.py", INFO, fixed))
    assert report.state is state, report.reason
    if state is PatchState.DRIFTED:
        assert report.reason.startswith("the fix reads `TokenizerLike.unk_token_id`")


# -- where the checks run: a tree that holds the whole package ---------------------

#: ``self.model`` is untyped (a torch module in vLLM): only the release's
#: names can tell that nothing defines ``fc_norm`` (vllm#43482's kind).
MODEL = """class Head:
    def __init__(self, model):
        self.model = model

    def combine(self, hidden):
        return hidden
"""
NORMED = MODEL.replace("return hidden", "return self.model.fc_norm(hidden)")


@pytest.mark.parametrize(
    "layout",
    [
        "checkout",  # pyproject.toml: a checkout, an sdist
        "installed",  # vllm-*.dist-info: site-packages
        "bare",  # vllm/ and PKG-INFO alone: a vendor's repository (issue 40, 7)
    ],
)
def test_the_checks_run_on_every_tree_that_holds_the_whole_package(
    tmp_path: Path, layout: str
) -> None:
    """An installed vLLM (its dist-info's RECORD) is whole, as a checkout is,
    and so is a folder this tool did not extract partially, without
    ``pyproject.toml`` (a copy of 0.20.2's ``vllm/`` and ``PKG-INFO`` took
    vllm#45468 as needed, unchecked): an attribute its package defines
    nowhere drifts there (docs/derive.md)."""
    # Its files import what it holds: its package is there whole.
    root = whole_tree(
        tmp_path,
        {"vllm/head.py": MODEL, "vllm/user.py": "from vllm.head import Head\n"},
    )
    if layout != "checkout":
        (root / "pyproject.toml").unlink()
    if layout == "installed":
        info = root / "vllm-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.4\nName: vllm\n")
        (info / "RECORD").write_text("vllm/__init__.py,,\nvllm/head.py,,\n")
    report = report_of(root, patch_of("local#h", "vllm/head.py", MODEL, NORMED))
    assert report.state is PatchState.DRIFTED, report.reason
    assert "`self.model.fc_norm`, which nothing in this release defines" in (
        report.reason
    )


def test_a_vendor_s_few_files_cannot_tell_and_say_the_names_went_unchecked(
    tmp_path: Path,
) -> None:
    """A tree without ``pyproject.toml`` whose files import ``vllm`` modules
    it does not hold (a vendor's fork of a few files) cannot tell what the
    release lacks: no module is judged missing, and the derived patch is
    needed, saying its runtime names were not checked."""
    user = "from vllm.config import ModelConfig\nfrom vllm.layers import Norm\n"
    root = whole_tree(tmp_path, {"vllm/head.py": MODEL, "vllm/user.py": user})
    (root / "pyproject.toml").unlink()
    report = report_of(root, patch_of("local#h", "vllm/head.py", MODEL, NORMED))
    assert report.state is PatchState.NEEDED
    assert report.reason.startswith("runtime names not checked")


def test_a_partial_extraction_without_the_package_says_the_names_went_unchecked(
    tmp_path: Path,
) -> None:
    """This tool's partial extraction not asked for the whole package cannot
    tell what the fix reads: the patch is needed and says that its runtime
    names were not checked; ``apply`` writes it only with
    ``--unchecked-names`` (issue 40, item 7)."""
    root = whole_tree(tmp_path / "tree", {"vllm/head.py": MODEL})
    (root / "pyproject.toml").unlink()
    (root / ASKED_FOR).write_text("PKG-INFO\nvllm/__init__.py\nvllm/head.py\n")
    patch = patch_of("local#h", "vllm/head.py", MODEL, NORMED)
    report = report_of(root, patch)
    assert report.state is PatchState.NEEDED
    assert report.reason == (
        "runtime names not checked: this partial tree does not hold the "
        "release's whole vllm package"
    )
    with pytest.raises(DeepstackError) as refused:
        apply_tree(VllmTree.open(root), [patch], {patch.id})
    assert refused.value.message.startswith(
        "local#h is needed, but what its code reads at run time was not checked"
    )
    assert "--unchecked-names" in refused.value.hint
    assert (root / "vllm/head.py").read_text() == MODEL
    folder = tmp_path / "patches"
    folder.mkdir()
    write_derived(patch, folder)
    command = [sys.executable, "-m", "deepstack_patch", "apply", "--vllm-src"]
    command += [str(root), "--patches", str(folder), "--only", "local#h"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "error: vllm/head.py:" in run.stderr and "not checked" in run.stderr
    assert (root / "vllm/head.py").read_text() == MODEL
    forced = subprocess.run(
        [*command, "--unchecked-names"], capture_output=True, text=True, timeout=120
    )
    assert forced.returncode == 0, forced.stderr
    assert (root / "vllm/head.py").read_text() == NORMED


def test_verify_s_runtime_stage_is_not_run_where_the_names_went_unchecked(
    tmp_path: Path,
) -> None:
    """The stage judged on a partial tree without the package looked
    nothing up: ``not-run``, saying why, never ``passed``."""
    from deepstack_patch.proof.runtime_stage import runtime_stages

    root = whole_tree(tmp_path, {"vllm/head.py": MODEL})
    (root / "pyproject.toml").unlink()
    (root / ASKED_FOR).write_text("vllm/head.py\n")
    patch = patch_of("local#h", "vllm/head.py", MODEL, NORMED)
    stage = runtime_stages(VllmTree.open(root), [patch], [patch])["local#h"]
    assert stage.status == "not-run"
    assert stage.message.startswith("runtime names not checked")


# -- verify: a test that stubs what the fix reads proves nothing ----------------


def test_verify_never_proves_a_fix_whose_runtime_names_fail(tmp_path: Path) -> None:
    """The fix's own test passes a stub config that has ``strict``; the
    release's ToyConfig has not. Its runtime-names stage fails on the
    pristine release: not proven, not ok, whatever the test says."""
    from deepstack_patch.output.documents import verify_json
    from deepstack_patch.proof import envs, verify

    files = {"vllm/config.py": CONFIG, "vllm/toy.py": TOY}
    # Upstream's parent had the field; the release carried here has not.
    parent = whole_tree(
        tmp_path / "parent",
        {**files, "vllm/config.py": CONFIG + "        self.strict = False\n"},
    )
    pristine = whole_tree(tmp_path / "pristine", files, "0.20.2")
    fixed = whole_tree(tmp_path / "fixed", {**files, "vllm/toy.py": FIXED}, "0.20.2")
    diff = git_diff("vllm/toy.py", TOY, FIXED) + git_diff("tests/test_toy.py", "", TEST)
    result = derive_patch_from_text(diff, VllmTree.open(parent), "acme#7")
    folder = tmp_path / "patches"
    folder.mkdir()
    write_derived(result.patch, folder)
    series = assemble_series(SERIES, patches_from_folder(folder))
    report = verify.verify_tree(
        VllmTree.open(fixed),
        series,
        {"acme#7"},
        envs.ProofEnv(Path(sys.executable)),
        TARGETS,
        pristine=VllmTree.open(pristine),
    )
    (verdict,) = report.verdicts
    assert verdict.proof is not None and verdict.proof.status == "passed"  # the stub
    assert verdict.runtime is not None and verdict.runtime.status == "failed"
    assert verdict.fail_to_pass == "not-proven"
    assert not report.ok and report.exit_code == 1
    assert verdict.problems[0].startswith(
        "runtime names: the fix reads `ToyConfig.strict`, which this release lacks"
    )
    # The table quotes ty's words whole, its [rule] too (not taken as markup).
    from deepstack_patch.output.tables import print_verify_report
    from rich.console import Console

    console = Console(record=True, width=400, color_system=None)
    print_verify_report(console, report)
    assert "[missing-attribute]" in console.export_text()
    document = json.loads(json.dumps(verify_json(report)))
    assert schema_errors("verify", document) == []
    (patch,) = document["patches"]
    assert patch["runtime_names"]["status"] == "failed"
    assert patch["ok"] is False and patch["fail_to_pass"] == "not-proven"


# -- the release tier: one fix of each kind on 0.20.2 -------------------------

SAMPLING = "vllm/sampling_params.py"
CONNECTIONS = "vllm/connections.py"
EAGLE3 = "vllm/model_executor/models/deepseek_eagle3.py"
FIRST_CHECK = "        self._validate_logprobs(model_config)\n"


def _guarded(field: str) -> str:
    return (
        f"        if model_config.{field} is None:\n"
        '            raise ValueError("unset")\n' + FIRST_CHECK
    )


#: id -> (file, the text the fix replaces, its replacement, the reason).
CASES = {
    "local#typed": (
        SAMPLING,
        FIRST_CHECK,
        _guarded("max_num_seqs"),  # a field of SchedulerConfig, not ModelConfig
        "the fix reads `ModelConfig.max_num_seqs`, which this release lacks (ty: "
        "Object of type `ModelConfig` has no attribute `max_num_seqs` "
        "[missing-attribute])",
    ),
    "local#envs": (
        CONNECTIONS,
        "envs.VLLM_MEDIA_FETCH_MAX_RETRIES, 1)",
        "envs.VLLM_MEDIA_FETCH_RETRY_LIMIT, 1)",
        "the fix needs `VLLM_MEDIA_FETCH_RETRY_LIMIT` from `vllm.envs`, which "
        "this release lacks",
    ),
    "local#nowhere": (
        EAGLE3,
        "return self.model.fc(hidden_states)",
        "return self.model.fc_norm_after(self.model.fc(hidden_states))",
        "the fix reads `self.model.fc_norm_after`, which nothing in this release "
        "defines or reads (no `fc_norm_after` in its vllm package)",
    ),
    "local#right": (SAMPLING, FIRST_CHECK, _guarded("max_model_len"), ""),
}


@pytest.mark.release
def test_each_kind_drifts_named_alike_on_the_whole_and_the_partial_release(
    tmp_path: Path,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
) -> None:
    """Adds: a typed attribute, an undeclared vllm.envs setting and an
    attribute the release defines nowhere, cut from 0.20.2's own files, drift
    with the same reason under ``status --release`` (a partial extraction,
    whole vllm package) as on the whole tree and on a copy without its
    ``pyproject.toml``, ``apply`` writes nothing, and a
    right fix of the same shape stays needed."""
    release = release_tree("0.20.2")
    folder, last = tmp_path / "patches", tmp_path / "last"
    folder.mkdir()
    last.mkdir()
    patches = []
    for patch_id, (path, old, new, _reason) in CASES.items():
        before = (release / path).read_text()
        assert before.count(old) >= 1, patch_id
        patches.append(patch_of(patch_id, path, before, before.replace(old, new, 1)))
        # local#right changes what local#typed changes: last in the series
        # (as in this list), local#typed is judged on the file as it is.
        write_derived(patches[-1], last if patch_id == "local#right" else folder)
    work = tmp_path / "work"  # no ./vllm-0.20.2 here: the cache's partial tree
    work.mkdir()
    status = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "status", "--release", "0.20.2"]
        + ["--patches", str(folder), "--patches", str(last), "--format", "json"]
        + [f"--only={patch_id}" for patch_id in CASES],
        capture_output=True,
        text=True,
        cwd=work,
        timeout=600,
    )
    assert status.returncode == 2, status.stderr
    partial = {p["id"]: p for p in json.loads(status.stdout)["patches"]}
    whole = plan_tree(VllmTree.open(release), patches, rewrite=False)
    # A vendor's copy: vllm/ and PKG-INFO, no pyproject.toml (issue 40, 7).
    vendor = link_copy(release, tmp_path / "vendor")
    for name in ("pyproject.toml", "setup.py"):
        (vendor / name).unlink(missing_ok=True)
    copied = plan_tree(VllmTree.open(vendor), patches, rewrite=False)
    for patch_id, (_path, _old, _new, reason) in CASES.items():
        report = whole.report(patch_id)
        expected = PatchState.DRIFTED if reason else PatchState.NEEDED
        assert report.state is expected, (patch_id, report.reason)
        assert partial[patch_id]["state"] == expected.value, partial[patch_id]
        assert copied.report(patch_id).state is expected, patch_id
        if reason:
            assert reason in report.reason, (patch_id, report.reason)
            assert reason in json.dumps(partial[patch_id]), partial[patch_id]
            assert reason in copied.report(patch_id).reason, patch_id
    copy = patched_copy("0.20.2")
    drifted = [p for p in patches if p.id != "local#right"]
    result = apply_tree(VllmTree.open(copy), drifted, {p.id for p in drifted})
    assert not result.written
    for path in {SAMPLING, CONNECTIONS, EAGLE3}:
        assert (copy / path).read_text() == (release / path).read_text()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (b"x = obj.limit\n", True),
        (b"class A:\n    limit: int = 3\n", True),
        (b"def limit(self):\n    pass\n", True),
        (b"getattr(obj, 'limit')\n", True),
        (b"limit = 3\n", True),
        (b"limits = 3\nif limit == 3: pass\n", False),  # a comparison binds nothing
        (b"unlimited.x = 1\n", False),
        (b"obj.limited = 1\n", False),
        (b"x = " + b"a" * 200 + b".limit\n", True),  # far into a long line
        (b"limit" + b" " * 100 + b"= 3\n", False),  # evidence out of reach: refused
        (b"limit" + b" " * 63 + b"==3\n", False),  # a lookahead cut at the window
        # Inside longer names only, or beside one that is its own word.
        (b"x.limits = obj.unlimit\n", False),
        (b"unlimited = 1; x.limit_ = 2; y.limit\n", True),
        (b"speedlimit = 1\n", False),
    ],
)
def test_a_name_is_mentioned_as_the_whole_search_says_or_refused(
    text: bytes, said: bool
) -> None:
    """``mentions`` looks around each occurrence of the word, never further
    than the pattern would (runtime.py's names defined nowhere)."""
    from deepstack_patch.engine.derived import outside

    assert outside.mentions("limit", [b"# nothing\n", text]) is said


def test_a_name_found_in_a_file_an_earlier_state_left_alone_is_not_looked_for_again(
    tmp_path: Path,
) -> None:
    """A name is looked up in every state of a series: where the file an
    earlier lookup found it in holds the same bytes, that file answers;
    where a fix rewrote it, the lookup goes through the files in order."""
    from deepstack_patch.engine.context import recognising_in
    from deepstack_patch.engine.derived import outside

    holder = ("vllm/b.py", b"class B:\n    width = 2\n")
    first = [("vllm/a.py", b"x = 1\n"), holder]
    later = [("vllm/a.py", b"width = 3\n"), holder]  # a.py rewritten, b.py not
    last = [later[0], ("vllm/b.py", b"class B:\n    pass\n")]
    with recognising_in(tmp_path) as context:
        assert outside.first_mention("width", first, dict(first)) == "vllm/b.py"
        assert outside.first_mention("width", later, dict(later)) == "vllm/b.py"
        assert outside.first_mention("width", last, dict(last)) == "vllm/a.py"
        assert outside.first_mention("depth", last, dict(last)) is None
    assert context.first_mentioned == {
        b"width": {"vllm/b.py", "vllm/a.py"},
        b"depth": {None},
    }

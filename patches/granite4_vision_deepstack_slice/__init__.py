"""vllm#40917: Granite4Vision hands the compiled model full-size deepstack buffers.

Symptom: Granite4Vision decode about 5x slower: Inductor compiles for the full
max_num_batched_tokens deepstack buffer on every step

Why: ``forward`` builds the ``IntermediateTensors`` it passes to the language
model from the persistent buffers ``self._ds_buffers[lvl]``, which hold
``max_num_batched_tokens`` rows. Inductor specialises on that size and
generates kernels for the whole buffer on every step, however few tokens
there are. The fix slices each buffer to the rows of this step,
``n = inputs_embeds.size(0)``.

Fix safety: Adds ``n = inputs_embeds.size(0)`` before the IntermediateTensors
is built, and slices each buffer in that build to the step's rows
(``self._ds_buffers[lvl]`` becomes ``self._ds_buffers[lvl][:n]``); nothing
else in forward changes.

A build is rewritten only in the shape upstream has: assigned to a name
(``ds = IntermediateTensors(...)``, annotated or not), one dict comprehension
over ``enumerate(self._ds_layer_indices)``, and as its value exactly the
level's buffer ``self._ds_buffers[lvl]``. A later ``n = ...`` in upstream's
``forward`` (the buffer clearing) assigns ``n`` again before reading it, so
it is unaffected. If ``n`` is read before that point the code is reported
drifted, since the new assignment could change its meaning.

Fixed already, and never sliced again: each level's buffer cut to the step's
rows, ``[:rows]``, ``[0:rows]`` or ``.narrow(0, 0, rows)``, with ``rows``
``inputs_embeds.size(0)``, ``inputs_embeds.shape[0]`` or a name whose last
assignment before the build is one of them; or what was built sliced to the
rows (``ds = ds[:n]``, or ``IntermediateTensors(...)[:n]``). Anything else
around the buffer (``.clone()``, ``* 0``, another call or bound, another
level), another iteration, or a build not assigned to a name is drifted, at
the line of what was found, quoting it.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Example, Finding, Patch, PatchState
from deepstack_patch.engine.syntax import (
    called_name,
    finding,
    is_self_attribute,
    iter_functions,
    matches_code,
    parameter_names,
    rewrite_definitions,
)

from .._follow_ups import FOLLOW_UPS

if TYPE_CHECKING:
    import libcst

BEFORE = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None,
                inputs_embeds=None, **kwargs):
        if (
            inputs_embeds is not None
            and get_pp_group().is_first_rank
            and self._ds_layer_indices
        ):
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": self._ds_buffers[lvl]
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

AFTER = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None,
                inputs_embeds=None, **kwargs):
        if (
            inputs_embeds is not None
            and get_pp_group().is_first_rank
            and self._ds_layer_indices
        ):
            n = inputs_embeds.size(0)
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": self._ds_buffers[lvl][:n]
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

# A vendor renamed the loop variables and the embeddings are positional: the
# fix follows the names the code uses.
RENAMED_BEFORE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        if inputs_embeds is not None:
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i]  # deepstack level i
                for i, layer in enumerate(self._ds_layer_indices)
            })
        return ds
"""

RENAMED_AFTER = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        if inputs_embeds is not None:
            n = inputs_embeds.size(0)
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i][:n]  # deepstack level i
                for i, layer in enumerate(self._ds_layer_indices)
            })
        return ds
"""

# A vendor's layout (another line length, single quotes, comments inside the
# comprehension, no blank lines): the fix goes in the same place, comments stay.
VENDOR_LAYOUT_BEFORE = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        # vendor: deepstack only on the first pipeline rank
        if inputs_embeds is not None and self._ds_layer_indices:
            # vendor: persistent buffers, see VENDOR-123
            ds: IntermediateTensors | None = IntermediateTensors({
                # one entry per deepstack level
                f'ds_{llm_layer}': self._ds_buffers[lvl]
                for lvl, llm_layer in enumerate(self._ds_layer_indices)
            })
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

VENDOR_LAYOUT_AFTER = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        # vendor: deepstack only on the first pipeline rank
        if inputs_embeds is not None and self._ds_layer_indices:
            # vendor: persistent buffers, see VENDOR-123
            n = inputs_embeds.size(0)
            ds: IntermediateTensors | None = IntermediateTensors({
                # one entry per deepstack level
                f'ds_{llm_layer}': self._ds_buffers[lvl][:n]
                for lvl, llm_layer in enumerate(self._ds_layer_indices)
            })
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""

# Sliced by something else: neither the bug nor the fix, so nothing is touched.
SLICED_OTHERWISE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i][: self.max_tokens]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds
"""

# `n` already holds something the function returns: assigning it would
# change what the function returns.
N_IN_USE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        n = len(input_ids)
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds, n
"""


# A vendor slices what it built (IntermediateTensors slices every tensor it
# holds): fixed already, and slicing the buffers as well would slice twice.
SLICED_AFTER_BUILDING = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        if inputs_embeds is not None and self._ds_layer_indices:
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": self._ds_buffers[lvl]
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
            n = inputs_embeds.size(0)
            ds = ds[:n]  # vendor: only this step's rows reach the compiled model
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""


# A vendor's forward with one line for the row count and the comprehension's
# value left open: the variants below fill them in.
VENDOR_FORWARD = """
class Granite4VisionForConditionalGeneration(nn.Module):
    def forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        if inputs_embeds is not None and self._ds_layer_indices:
            ROWS
            ds: IntermediateTensors | None = IntermediateTensors(
                {
                    f"ds_{llm_layer}": VALUE
                    for lvl, llm_layer in enumerate(self._ds_layer_indices)
                }
            )
        else:
            ds = None
        return self.language_model.model(input_ids, positions,
                                         deepstack_input_embeds=ds)
"""


def vendor_forward(value: str, rows: str = "pass") -> str:
    return VENDOR_FORWARD.replace("VALUE", value).replace("ROWS", rows)


# A vendor's own forms of the fix: each level's buffer cut to the step's rows,
# by the row count or a name assigned from it. Fixed: never sliced again.
NARROWED = vendor_forward("self._ds_buffers[lvl].narrow(0, 0, inputs_embeds.shape[0])")
NARROWED_BY_NAME = vendor_forward(
    "self._ds_buffers[lvl].narrow(0, 0, rows)", "rows = inputs_embeds.size(0)"
)
SLICED_FROM_ZERO = vendor_forward(
    "self._ds_buffers[lvl][0:rows]", "rows = inputs_embeds.shape[0]"
)

# Something else around the buffer: neither the bug nor the fix. Slicing it
# would write `self._ds_buffers[lvl][:n].clone()`, code nobody reviewed.
CLONED = vendor_forward("self._ds_buffers[lvl].clone()")
ZEROED = vendor_forward("self._ds_buffers[lvl] * 0")
NARROWED_OTHERWISE = vendor_forward("self._ds_buffers[lvl].narrow(0, 0, self.max_rows)")
# `n` is not the step's row count where the build reads it.
SLICED_BY_STALE_ROWS = vendor_forward(
    "self._ds_buffers[lvl][:n]", "n = inputs_embeds.size(0); n = self.max_rows"
)
# Another level of the buffers than the comprehension's own.
OTHER_LEVEL = vendor_forward("self._ds_buffers[llm_layer]")

# The build's context is not the known one: other levels, or the build not
# assigned to a name (here passed straight on, or chosen by a condition).
OTHER_LEVELS = (
    VENDOR_FORWARD.replace("VALUE", "self._ds_buffers[lvl]")
    .replace(
        "enumerate(self._ds_layer_indices)", "enumerate(self._ds_layer_indices[1:])"
    )
    .replace("ROWS", "pass")
)
BUILT_IN_THE_CALL = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        return self.language_model.model(
            input_ids,
            positions,
            deepstack_input_embeds=IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i]
                for i, layer in enumerate(self._ds_layer_indices)
            }),
        )
"""
BUILT_UNDER_A_CONDITION = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i]
            for i, layer in enumerate(self._ds_layer_indices)
        }) if self._ds_buffers[0].numel() else None
        return ds
"""


# A build in a nested function is its own finding: the enclosing function's
# rewrite leaves it to that finding, so each is sliced once.
NESTED_BUILD_BEFORE = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        def deepstack(inputs_embeds):
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i]
                for i, layer in enumerate(self._ds_layer_indices)
            })
            return ds

        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds, deepstack(inputs_embeds)
"""

NESTED_BUILD_AFTER = """
class Model:
    def forward(self, input_ids, positions, inputs_embeds=None):
        def deepstack(inputs_embeds):
            n = inputs_embeds.size(0)
            ds = IntermediateTensors({
                f"ds_{layer}": self._ds_buffers[i][:n]
                for i, layer in enumerate(self._ds_layer_indices)
            })
            return ds

        n = inputs_embeds.size(0)
        ds = IntermediateTensors({
            f"ds_{layer}": self._ds_buffers[i][:n]
            for i, layer in enumerate(self._ds_layer_indices)
        })
        return ds, deepstack(inputs_embeds)
"""


class Granite4VisionDeepstackSlice(Patch):
    id = "vllm#40917"
    title = "Granite4Vision: slice deepstack buffers to the step's tokens"
    upstream_url = "https://github.com/vllm-project/vllm/pull/40917"
    fixed_in = "0.21.0"
    # The module docstring (the class has none) is the one source of both.
    symptom = section(__doc__, "Symptom")
    also_changes = section(__doc__, "Fix safety")
    paths = ("vllm/model_executor/models/*.py",)
    markers = (b"_ds_buffers",)
    follow_ups = FOLLOW_UPS["vllm#40917"]
    parts = {"": "method that builds IntermediateTensors from self._ds_buffers"}
    examples = (
        Example("upstream 0.20.x forward", BEFORE, AFTER),
        Example(
            "renamed loop variables, trailing comment", RENAMED_BEFORE, RENAMED_AFTER
        ),
        Example(
            "vendor layout and comments", VENDOR_LAYOUT_BEFORE, VENDOR_LAYOUT_AFTER
        ),
        Example("already sliced (upstream 0.21.0)", AFTER, state=PatchState.APPLIED),
        Example(
            "sliced after building (vendor)",
            SLICED_AFTER_BUILDING,
            state=PatchState.APPLIED,
        ),
        Example("sliced by another bound", SLICED_OTHERWISE, state=PatchState.DRIFTED),
        Example(
            "n read before the fix's assignment", N_IN_USE, state=PatchState.DRIFTED
        ),
        Example(
            "a build in a nested function too", NESTED_BUILD_BEFORE, NESTED_BUILD_AFTER
        ),
        Example("narrowed to the rows (vendor)", NARROWED, state=PatchState.APPLIED),
        Example(
            "narrowed by a name for the rows (vendor)",
            NARROWED_BY_NAME,
            state=PatchState.APPLIED,
        ),
        Example("sliced [0:rows] (vendor)", SLICED_FROM_ZERO, state=PatchState.APPLIED),
        Example("buffer cloned", CLONED, state=PatchState.DRIFTED),
        Example("buffer multiplied", ZEROED, state=PatchState.DRIFTED),
        Example(
            "narrowed by another bound", NARROWED_OTHERWISE, state=PatchState.DRIFTED
        ),
        Example(
            "sliced by a name no longer the rows",
            SLICED_BY_STALE_ROWS,
            state=PatchState.DRIFTED,
        ),
        Example("another level's buffer", OTHER_LEVEL, state=PatchState.DRIFTED),
        Example("other levels", OTHER_LEVELS, state=PatchState.DRIFTED),
        Example("built inside the call", BUILT_IN_THE_CALL, state=PatchState.DRIFTED),
        Example(
            "built under a condition",
            BUILT_UNDER_A_CONDITION,
            state=PatchState.DRIFTED,
        ),
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        findings = []
        for qualname, function in iter_functions(tree):
            builds = [
                call
                for call in _own_nodes(function)
                if called_name(call) == "IntermediateTensors"
                and any(_mentions_buffers(arg) for arg in call.args)
            ]
            if builds:
                findings.append(self._recognise_function(qualname, function, builds))
        return findings

    def _recognise_function(
        self, qualname: str, function: ast.FunctionDef, builds: list[ast.Call]
    ) -> Finding:
        if "inputs_embeds" not in parameter_names(function):
            return finding(
                PatchState.DRIFTED,
                qualname,
                function,
                f"no inputs_embeds parameter to size the slice by; {EXPECTED}",
            )
        forms = []
        for build in builds:
            form = _build_form(function, build)
            if isinstance(form, Unknown):
                # The line of what was found; the function is the span.
                return finding(
                    PatchState.DRIFTED,
                    qualname,
                    [form.node, function],
                    f"found {form.found} at line {form.node.lineno}; "
                    f"expected {form.expected}",
                )
            forms.append(form)
        if all(form is BufferForm.WHOLE for form in forms):
            if _sliced_after_building(function, builds):
                # Fixed another way: slicing the buffers too would slice twice.
                return finding(PatchState.APPLIED, qualname, function, rewrites=())
            first_build = min(call.lineno for call in builds)
            if not _name_free_at(function, "n", first_build):
                return finding(
                    PatchState.DRIFTED,
                    qualname,
                    function,
                    f"`n` already has a meaning in {qualname} around line "
                    f"{first_build}, where the fix would assign it",
                )
            return finding(PatchState.NEEDED, qualname, function)
        if BufferForm.WHOLE not in forms:
            # A vendor's equivalent is the fix, but never upstream's code.
            upstream = all(form is BufferForm.UPSTREAM for form in forms)
            rewrites = None if upstream else ()
            return finding(PatchState.APPLIED, qualname, function, rewrites=rewrites)
        return finding(
            PatchState.DRIFTED,
            qualname,
            function,
            "some IntermediateTensors builds in it slice the buffers to the "
            f"step's rows and some do not; {EXPECTED}",
        )

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        return rewrite_definitions(module, {f.symbol: _slice_buffers for f in needed})

    def prove(self, tree: Path) -> None:
        """``forward`` hands the language model buffers of the step's rows."""
        from .proof import prove_forward

        prove_forward(tree, self)


EXPECTED = (
    "expected ds = IntermediateTensors({...: self._ds_buffers[lvl] for lvl, "
    "layer in enumerate(self._ds_layer_indices)}) (needed), or each buffer "
    "sliced to the step's rows, self._ds_buffers[lvl][:n] after "
    "n = inputs_embeds.size(0) or .narrow(0, 0, n) (applied)"
)

#: The step's row count, as vendors write it.
ROW_COUNTS = ("inputs_embeds.size(0)", "inputs_embeds.shape[0]")


class BufferForm(enum.Enum):
    """What the comprehension of a known build hands the model per level."""

    WHOLE = "self._ds_buffers[lvl]"  # the bug
    UPSTREAM = "self._ds_buffers[lvl][:n], n = inputs_embeds.size(0)"  # the fix
    EQUIVALENT = "sliced to the step's rows another way"  # a vendor's fix


@dataclass(frozen=True)
class Unknown:
    """Code around the buffers that is neither the bug nor the fix."""

    node: ast.AST
    found: str
    expected: str


def _own_nodes(function: ast.FunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``function``, those of nested functions and classes aside
    (they are recognised as functions of their own)."""
    stack: list[ast.AST] = list(reversed(function.body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _mentions_buffers(node: ast.AST) -> bool:
    """``self._ds_buffers`` anywhere inside ``node``."""
    return any(is_self_attribute(n, "_ds_buffers") for n in ast.walk(node))


def _quoted(node: ast.AST) -> str:
    """A node's code for a message, long code shortened."""
    code = ast.unparse(node)
    return f"`{code}`" if len(code) <= 80 else f"`{code[:77]}...`"


def _build_form(function: ast.FunctionDef, build: ast.Call) -> BufferForm | Unknown:
    """Recognise one ``IntermediateTensors`` build from the buffers.

    Only the known shape counts: the build assigned to a name (or sliced to
    the rows first), its one argument a dict comprehension over
    ``enumerate(self._ds_layer_indices)``, and as its value the level's
    buffer, whole or sliced to the step's rows. Anything else is unknown.
    """
    if not _assigned_as_is(function, build):
        return Unknown(
            build,
            "an IntermediateTensors build from self._ds_buffers that is not "
            "assigned to a name",
            "the build assigned to a name, ds = IntermediateTensors({...})",
        )
    match build:
        case ast.Call(
            args=[ast.DictComp(key=key, value=value, generators=[loop])],
            keywords=[],
        ):
            pass
        case _:
            return Unknown(
                build,
                _quoted(build),
                "IntermediateTensors with one dict comprehension, "
                "{...: self._ds_buffers[lvl] for lvl, layer in "
                "enumerate(self._ds_layer_indices)}",
            )
    match loop:
        case ast.comprehension(
            target=ast.Tuple(elts=[ast.Name(level), ast.Name()]),
            iter=levels,
            ifs=[],
            is_async=0,
        ) if matches_code(levels, "enumerate(self._ds_layer_indices)"):
            pass
        case _:
            return Unknown(
                loop.target,
                f"`for {ast.unparse(loop.target)} in {ast.unparse(loop.iter)}`"
                + (" with a condition" if loop.ifs else ""),
                "one level per deepstack layer, "
                "`for lvl, layer in enumerate(self._ds_layer_indices)`",
            )
    if _mentions_buffers(key):
        return Unknown(key, _quoted(key), "a key naming the layer, f'ds_{layer}'")
    form = _buffer_form(function, build, value, level)
    if form is None:
        return Unknown(
            value,
            _quoted(value),
            f"self._ds_buffers[{level}] (needed), or sliced to the step's rows: "
            f"self._ds_buffers[{level}][:n], [0:n] or .narrow(0, 0, n), with n "
            "inputs_embeds.size(0) or .shape[0] or a name assigned from them "
            "(applied)",
        )
    return form


def _assigned_as_is(function: ast.FunctionDef, build: ast.Call) -> bool:
    """``ds = <build>`` (or annotated), or ``ds = <build>[:rows]``."""
    for node in _own_nodes(function):
        match node:
            case (
                ast.Assign(targets=[ast.Name()], value=value)
                | ast.AnnAssign(target=ast.Name(), value=value)
            ) if value is build:
                return True
            case (
                ast.Assign(
                    targets=[ast.Name()], value=ast.Subscript(value=sliced) as value
                )
                | ast.AnnAssign(
                    target=ast.Name(), value=ast.Subscript(value=sliced) as value
                )
            ) if sliced is build:
                return _row_slice(function, value, build.lineno) is not None
    return False


def _buffer_form(
    function: ast.FunctionDef, build: ast.Call, value: ast.expr, level: str
) -> BufferForm | None:
    """The form of the comprehension's value, None if it is none of them."""

    def is_level_buffer(node: ast.expr) -> bool:
        return matches_code(node, "self._ds_buffers[{level}]", level=level)

    match value:
        case _ if is_level_buffer(value):
            return BufferForm.WHOLE
        case ast.Subscript(value=buffer) if is_level_buffer(buffer):
            rows = _row_slice(function, value, build.lineno)
            if rows is None:
                return None
            match value.slice:
                case ast.Slice(lower=None, upper=ast.Name("n"), step=None):
                    upstream = matches_code(rows, "inputs_embeds.size(0)")
                case _:
                    upstream = False
            return BufferForm.UPSTREAM if upstream else BufferForm.EQUIVALENT
        case ast.Call(
            func=ast.Attribute(value=buffer, attr="narrow"),
            args=[dim, start, length],
            keywords=[],
        ) if (
            is_level_buffer(buffer)
            and matches_code(dim, "0")
            and matches_code(start, "0")
            and _row_count(function, length, build.lineno) is not None
        ):
            return BufferForm.EQUIVALENT
    return None


def _row_slice(
    function: ast.FunctionDef, node: ast.Subscript, line: int
) -> ast.expr | None:
    """The row count ``<x>[:rows]`` or ``<x>[0:rows]`` slices to, read at
    ``line``; None for any other subscript."""
    match node.slice:
        case ast.Slice(lower=lower, upper=ast.expr() as upper, step=None) if (
            lower is None or matches_code(lower, "0")
        ):
            return _row_count(function, upper, line)
    return None


def _row_count(function: ast.FunctionDef, node: ast.expr, line: int) -> ast.expr | None:
    """The step's row count ``node`` stands for at ``line``: a row count
    itself, or a name whose last assignment before ``line`` is one."""
    if any(matches_code(node, count) for count in ROW_COUNTS):
        return node
    if not isinstance(node, ast.Name):
        return None
    stores = [
        n
        for n in _own_nodes(function)
        if isinstance(n, ast.Name)
        and n.id == node.id
        and isinstance(n.ctx, ast.Store)
        and n.lineno < line
    ]
    if not stores:
        return None
    last = max(stores, key=lambda store: (store.lineno, store.col_offset))
    for statement in _own_nodes(function):
        match statement:
            case (
                ast.Assign(targets=[target], value=value)
                | ast.AnnAssign(target=target, value=ast.expr() as value)
            ) if target is last:
                counts = any(matches_code(value, count) for count in ROW_COUNTS)
                return value if counts else None
    # Bound another way (a loop, a tuple, ``:=``): not known to be the rows.
    return None


def _sliced_after_building(function: ast.FunctionDef, builds: list[ast.Call]) -> bool:
    """Every build's result is sliced to the step's rows once built.

    ``IntermediateTensors({...})[:n]``, or ``ds = IntermediateTensors({...})``
    followed by ``ds = ds[:n]``, with ``n`` the row count or a name assigned
    from it (``IntermediateTensors`` slices every tensor it holds).
    """
    built_into: dict[int, str] = {}
    sliced_directly: set[int] = set()
    for node in _own_nodes(function):
        match node:
            case (
                ast.Assign(targets=[ast.Name(name)], value=value)
                | ast.AnnAssign(target=ast.Name(name), value=value)
            ):
                built_into[id(value)] = name
                if (
                    isinstance(value, ast.Subscript)
                    and _row_slice(function, value, value.lineno) is not None
                ):
                    sliced_directly.add(id(value.value))
    for build in builds:
        if id(build) in sliced_directly:
            continue
        name = built_into.get(id(build))
        end = build.end_lineno or build.lineno
        later = [
            node
            for node in _own_nodes(function)
            if _reslices(function, node, name) and node.lineno > end
        ]
        if name is None or not later:
            return False
    return True


def _reslices(function: ast.FunctionDef, node: ast.AST, name: str | None) -> bool:
    """``<name> = <name>[:rows]``."""
    match node:
        case ast.Assign(
            targets=[ast.Name(target)],
            value=ast.Subscript(value=ast.Name(source)) as sliced,
        ) if target == source == name:
            return _row_slice(function, sliced, node.lineno) is not None
    return False


def _name_free_at(function: ast.FunctionDef, name: str, line: int) -> bool:
    """True if assigning ``name`` just before ``line`` cannot change a read.

    That holds when the function does not use the name before ``line`` and
    every later read follows a later assignment (upstream's buffer clearing
    assigns ``n`` again before using it). Conservative: not flow-sensitive.
    """
    uses = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == name]
    if any(use.lineno < line for use in uses):
        return False
    stores = [u.lineno for u in uses if isinstance(u.ctx, ast.Store)]
    reads = [u.lineno for u in uses if isinstance(u.ctx, ast.Load)]
    return all(any(store < read for store in stores) for read in reads)


def _slice_buffers(function: libcst.FunctionDef) -> libcst.FunctionDef:
    """Insert ``n = inputs_embeds.size(0)`` before each build of the known
    shape and slice that build's comprehension value to ``[:n]``.

    Nothing else is touched: not a buffer subscript elsewhere in the
    statement, nor code in nested functions (recognised on their own).
    """
    import libcst

    # Plain `match` patterns, not libcst.matchers: importing that module
    # costs longer than the whole rewrite.
    def is_level_buffer(node: libcst.BaseExpression, level: str) -> bool:
        match node:
            case libcst.Subscript(
                value=libcst.Attribute(
                    value=libcst.Name(value="self"),
                    attr=libcst.Name(value="_ds_buffers"),
                ),
                slice=[
                    libcst.SubscriptElement(
                        slice=libcst.Index(value=libcst.Name(value=index))
                    )
                ],
            ):
                return index == level
        return False

    def sliced_build(
        statement: libcst.BaseStatement,
    ) -> libcst.SimpleStatementLine | None:
        """``statement`` with its build's value sliced, None if not a build."""
        match statement:
            case libcst.SimpleStatementLine(
                body=[
                    libcst.Assign(
                        targets=[libcst.AssignTarget(target=libcst.Name())],
                        value=libcst.Call() as call,
                    )
                    | libcst.AnnAssign(
                        target=libcst.Name(), value=libcst.Call() as call
                    ) as assignment
                ]
            ):
                pass
            case _:
                return None
        match call:
            case libcst.Call(
                func=libcst.Name(value="IntermediateTensors")
                | libcst.Attribute(attr=libcst.Name(value="IntermediateTensors")),
                args=[
                    libcst.Arg(
                        keyword=None,
                        star="",
                        value=libcst.DictComp(
                            for_in=libcst.CompFor(
                                target=libcst.Tuple(
                                    elements=[
                                        libcst.Element(value=libcst.Name(value=level)),
                                        libcst.Element(value=libcst.Name()),
                                    ]
                                ),
                                ifs=[],
                                inner_for_in=None,
                                asynchronous=None,
                            )
                        ) as comprehension,
                    ) as argument
                ],
            ) if is_level_buffer(comprehension.value, level):
                pass
            case _:
                return None
        sliced = libcst.Subscript(
            value=comprehension.value,
            slice=[
                libcst.SubscriptElement(
                    slice=libcst.Slice(lower=None, upper=libcst.Name("n"))
                )
            ],
        )
        argument = argument.with_changes(value=comprehension.with_changes(value=sliced))
        assignment = assignment.with_changes(value=call.with_changes(args=[argument]))
        return statement.with_changes(body=[assignment])

    class InsertRowCount(libcst.CSTTransformer):
        def visit_FunctionDef(self, node: libcst.FunctionDef) -> bool:
            return node is function  # a nested function is not this finding

        def visit_ClassDef(self, node: libcst.ClassDef) -> bool:
            return False

        def leave_IndentedBlock(
            self, original: libcst.IndentedBlock, updated: libcst.IndentedBlock
        ) -> libcst.IndentedBlock:
            body: list[libcst.BaseStatement] = []
            for statement in updated.body:
                sliced = sliced_build(statement)
                if sliced is not None:
                    row_count = libcst.parse_statement("n = inputs_embeds.size(0)\n")
                    # Comments above the statement stay above the group.
                    body.append(
                        row_count.with_changes(leading_lines=statement.leading_lines)
                    )
                    statement = sliced.with_changes(leading_lines=[])
                body.append(statement)
            return updated.with_changes(body=body)

    return function.visit(InsertRowCount())


PATCH = Granite4VisionDeepstackSlice()

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

Each ``self._ds_buffers[lvl]`` in the build becomes
``self._ds_buffers[lvl][:n]``. A later ``n = ...`` in upstream's ``forward``
(the buffer clearing) assigns ``n`` again before reading it, so it is
unaffected. If ``n`` is read before that point the code is reported drifted,
since the new assignment could change its meaning. A ``forward`` that already
slices what it built to the step's rows (``ds = ds[:n]``, or
``IntermediateTensors(...)[:n]``) is fixed: it is never sliced twice.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
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
    )

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        findings = []
        for qualname, function in iter_functions(tree):
            builds = [
                call
                for call in ast.walk(function)
                if called_name(call) == "IntermediateTensors"
                and any(_buffer_subscripts(arg) for arg in call.args)
            ]
            if builds:
                findings.append(self._recognise_function(qualname, function, builds))
        return findings

    def _recognise_function(
        self, qualname: str, function: ast.FunctionDef, builds: list[ast.Call]
    ) -> Finding:
        expected = (
            "expected IntermediateTensors({...: self._ds_buffers[lvl] for ...}) "
            "(needed) or the same with [lvl][:n] after n = inputs_embeds.size(0) "
            "(applied)"
        )
        if "inputs_embeds" not in parameter_names(function):
            return finding(
                PatchState.DRIFTED,
                qualname,
                function,
                f"no inputs_embeds parameter to size the slice by; {expected}",
            )
        subscripts = [
            s for call in builds for arg in call.args for s in _buffer_subscripts(arg)
        ]
        if all(_is_whole_buffer(s) for s in subscripts):
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
        if all(_is_sliced_by_n(s) for s in subscripts) and _assigns_rows(function):
            return finding(PatchState.APPLIED, qualname, function)
        return finding(PatchState.DRIFTED, qualname, function, expected)

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        return rewrite_definitions(module, {f.symbol: _slice_buffers for f in needed})

    def prove(self, tree: Path) -> None:
        """``forward`` hands the language model buffers of the step's rows."""
        from .proof import prove_forward

        prove_forward(tree, self)


def _buffer_subscripts(node: ast.AST) -> list[ast.Subscript]:
    """Outermost subscripts of ``self._ds_buffers`` inside ``node``."""
    found = [sub for sub in ast.walk(node) if _subscripts_buffers(sub)]
    # ast.walk visits outer subscripts first; keep only those not inside another.
    outer = []
    for sub in found:
        if not any(sub is not other and sub in ast.walk(other) for other in found):
            outer.append(sub)
    return outer


def _subscripts_buffers(node: ast.AST) -> bool:
    """``self._ds_buffers[...]``, subscripted any number of times."""
    match node:
        case ast.Subscript(value=ast.Subscript() as inner):
            return _subscripts_buffers(inner)
        case ast.Subscript(value=buffers):
            return is_self_attribute(buffers, "_ds_buffers")
    return False


def _is_whole_buffer(node: ast.Subscript) -> bool:
    """``self._ds_buffers[lvl]``."""
    match node:
        case ast.Subscript(value=buffers, slice=ast.Name()):
            return is_self_attribute(buffers, "_ds_buffers")
    return False


def _is_sliced_by_n(node: ast.Subscript) -> bool:
    """``self._ds_buffers[lvl][:n]``."""
    match node:
        case ast.Subscript(
            value=ast.Subscript() as buffer,
            slice=ast.Slice(lower=None, upper=ast.Name("n"), step=None),
        ):
            return _is_whole_buffer(buffer)
    return False


def _assigns_rows(function: ast.FunctionDef) -> bool:
    """``n = inputs_embeds.size(0)`` somewhere in ``function``."""
    return any(
        matches_code(node, "n = inputs_embeds.size(0)")
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
    )


#: The step's row count, as vendors write it.
ROW_COUNTS = ("inputs_embeds.size(0)", "inputs_embeds.shape[0]")


def _sliced_after_building(function: ast.FunctionDef, builds: list[ast.Call]) -> bool:
    """Every build's result is sliced to the step's rows once built.

    ``IntermediateTensors({...})[:n]``, or ``ds = IntermediateTensors({...})``
    followed by ``ds = ds[:n]``, with ``n`` the row count or a name assigned
    from it (``IntermediateTensors`` slices every tensor it holds).
    """
    row_names = {
        node.targets[0].id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and any(matches_code(node.value, rows) for rows in ROW_COUNTS)
    }

    def sliced(node: ast.AST) -> ast.AST | None:
        """``<base>`` of ``<base>[:<rows>]``."""
        match node:
            case ast.Subscript(
                value=base, slice=ast.Slice(lower=None, upper=rows, step=None)
            ) if (isinstance(rows, ast.Name) and rows.id in row_names) or any(
                matches_code(rows, count) for count in ROW_COUNTS
            ):
                return base
        return None

    built_into: dict[int, str] = {}
    for node in ast.walk(function):
        match node:
            case ast.Assign(targets=[ast.Name(name)], value=ast.Call() as call) | (
                ast.AnnAssign(target=ast.Name(name), value=ast.Call() as call)
            ):
                built_into[id(call)] = name
    slices = [(node, sliced(node)) for node in ast.walk(function)]
    for build in builds:
        if any(base is build for _, base in slices):
            continue
        name = built_into.get(id(build))
        later = [
            node
            for node, base in slices
            if isinstance(base, ast.Name)
            and base.id == name
            and node.lineno > (build.end_lineno or build.lineno)
        ]
        if name is None or not later:
            return False
    return True


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
    """Insert ``n = inputs_embeds.size(0)`` and slice every buffer to ``[:n]``."""
    import libcst

    # Plain `match` patterns, not libcst.matchers: importing that module
    # costs longer than the whole rewrite.
    def is_whole_buffer(node: libcst.CSTNode) -> bool:
        match node:
            case libcst.Subscript(
                value=libcst.Attribute(
                    value=libcst.Name(value="self"),
                    attr=libcst.Name(value="_ds_buffers"),
                ),
                slice=[
                    libcst.SubscriptElement(slice=libcst.Index(value=libcst.Name()))
                ],
            ):
                return True
        return False

    def builds_from_buffers(node: libcst.CSTNode) -> bool:
        match node:
            case libcst.Call(
                func=libcst.Name(value="IntermediateTensors")
                | libcst.Attribute(attr=libcst.Name(value="IntermediateTensors"))
            ):
                return any(_contains(arg.value, is_whole_buffer) for arg in node.args)
        return False

    class SliceBuffers(libcst.CSTTransformer):
        def leave_Subscript(
            self, original: libcst.Subscript, updated: libcst.Subscript
        ) -> libcst.BaseExpression:
            if not is_whole_buffer(original):
                return updated
            return libcst.Subscript(
                value=updated,
                slice=[
                    libcst.SubscriptElement(
                        slice=libcst.Slice(lower=None, upper=libcst.Name("n"))
                    )
                ],
            )

    class InsertRowCount(libcst.CSTTransformer):
        def leave_IndentedBlock(
            self, original: libcst.IndentedBlock, updated: libcst.IndentedBlock
        ) -> libcst.IndentedBlock:
            body: list[libcst.BaseStatement] = []
            for statement in updated.body:
                if isinstance(statement, libcst.SimpleStatementLine) and _contains(
                    statement, builds_from_buffers
                ):
                    row_count = libcst.parse_statement("n = inputs_embeds.size(0)\n")
                    # Comments above the statement stay above the group.
                    body.append(
                        row_count.with_changes(leading_lines=statement.leading_lines)
                    )
                    statement = statement.with_changes(leading_lines=[])
                    statement = statement.visit(SliceBuffers())
                body.append(statement)
            return updated.with_changes(body=body)

    return function.visit(InsertRowCount())


def _contains(
    node: libcst.CSTNode, predicate: Callable[[libcst.CSTNode], bool]
) -> bool:
    """Whether ``node`` or any node inside it satisfies ``predicate``."""
    import libcst

    found = False

    class Search(libcst.CSTVisitor):
        def on_visit(self, visited: libcst.CSTNode) -> bool:
            nonlocal found
            found = found or predicate(visited)
            return not found

    node.visit(Search())
    return found


PATCH = Granite4VisionDeepstackSlice()

"""A function's header compared only in the parts its fix changes (issue
40, item 4): vllm#41199 adds ``reasoning_parser_kwargs`` after
``reasoning_ended`` in ``Request.__init__``, whose header in 0.20.0 lacks
``prompt_is_token_ids``, a parameter the fix does not touch.

A ``def``'s header is read as parts: its decorators, name, return
annotation and type parameters, and its parameters one by one (kind, name,
annotation, default; the bare ``*`` is one). The fix's change is the parts
that differ between its header before and after: a field, or a run of
parameters replaced (none, for an insertion) between two neighbours. The
target is ``needed`` where each changed field is as the fix expects and
each run is there whole (an insertion: between the same neighbours, by
kind and name), with no parameter the fix adds; ``applied`` where each is
as the fix leaves it.
Every other part is the target's own and is neither compared nor written:
the rewrite changes the header's lines by the fix's line diff and checks
that the header it wrote is the target's with exactly the fix's change.
"""

from __future__ import annotations

import ast
import difflib
import functools
from dataclasses import dataclass

from deepstack_patch.engine.derived import shapes
from deepstack_patch.engine.protocol import PatchState

#: (kind, name, annotation, default), the last two as their shapes.
Param = tuple[str, str, str, str]

#: The parts of a header besides its parameters.
FIELDS = ("decorators", "name", "returns", "type_params", "kind")


@dataclass(frozen=True)
class Signature:
    fields: tuple[tuple[str, str], ...]
    params: tuple[Param, ...]

    def field(self, name: str) -> str:
        return dict(self.fields)[name]


def of(node: ast.stmt) -> Signature | None:
    """A ``def``'s header as parts; None for another statement."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (
        len(positional) - len(args.defaults)
    ) + list(args.defaults)
    params: list[Param] = []
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = "positional-only" if index < len(args.posonlyargs) else "positional"
        params.append((kind, arg.arg, _shape(arg.annotation), _shape(default)))
    if args.vararg is not None:
        params.append(("*", args.vararg.arg, _shape(args.vararg.annotation), ""))
    elif args.kwonlyargs:
        params.append(("*", "", "", ""))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(
            ("keyword-only", arg.arg, _shape(arg.annotation), _shape(default))
        )
    if args.kwarg is not None:
        params.append(("**", args.kwarg.arg, _shape(args.kwarg.annotation), ""))
    fields = (
        ("decorators", _shape(node.decorator_list)),
        ("name", node.name),
        ("returns", _shape(node.returns)),
        ("type_params", _shape(getattr(node, "type_params", []))),
        ("kind", type(node).__name__),
    )
    return Signature(fields, tuple(params))


@functools.lru_cache(maxsize=256)
def recorded(code: str) -> Signature | None:
    """The parts of a recorded header (a data file's ``header_before``)."""
    from deepstack_patch.engine.derived.match import one_statement, with_block

    return of(one_statement(with_block(code)))


def _shape(node: ast.AST | list[ast.AST] | None) -> str:
    if node is None:
        return ""
    if isinstance(node, list):
        return "[" + ", ".join(shapes.shape(n) for n in node) + "]"
    return shapes.shape(node)


def state(before: Signature, after: Signature, target: Signature) -> PatchState | str:
    """The target header's state for the fix's change from ``before`` to
    ``after`` (see the module's docstring); else the parts of the change
    the target has neither way, named."""
    changed = [f for f in FIELDS if before.field(f) != after.field(f)]
    runs = _runs(before.params, after.params)
    if all(target.field(f) == before.field(f) for f in changed) and all(
        _placed(target.params, old, new, before.params, i1, i2) is not None
        for old, new, i1, i2, _j1, _j2 in runs
    ):
        return PatchState.NEEDED
    if all(target.field(f) == after.field(f) for f in changed) and all(
        _placed(target.params, new, old, after.params, j1, j2) is not None
        for old, new, _i1, _i2, j1, j2 in runs
    ):
        return PatchState.APPLIED
    parts = [
        f"its {name}"
        for name in changed
        if target.field(name) not in (before.field(name), after.field(name))
    ]
    parts += [
        "its parameters " + ", ".join(f"`{p[1] or p[0]}`" for p in old + new)
        for old, new, i1, i2, j1, j2 in runs
        if _placed(target.params, old, new, before.params, i1, i2) is None
        and _placed(target.params, new, old, after.params, j1, j2) is None
    ]
    return " and ".join(parts or ["its parts the fix changes, taken together,"])


_Run = tuple[tuple[Param, ...], tuple[Param, ...], int, int, int, int]


def _runs(before: tuple[Param, ...], after: tuple[Param, ...]) -> list[_Run]:
    """The runs of parameters the fix replaces: (old, new, and where each
    lies in ``before`` and ``after``)."""
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return [
        (before[i1:i2], after[j1:j2], i1, i2, j1, j2)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def _placed(
    target: tuple[Param, ...],
    run: tuple[Param, ...],
    other: tuple[Param, ...],
    around: tuple[Param, ...],
    start: int,
    stop: int,
) -> int | None:
    """Where ``run`` (``around[start:stop]``) is in ``target``, with no
    parameter of ``other`` (the run it becomes or was) that ``run`` lacks:
    its index, or None (also where it is there more than once). A run of
    parameters is placed by itself (a name is there once); an empty one,
    where the fix inserts, between the neighbours it has in ``around`` (by
    kind and name; an edge for an edge)."""
    left = around[start - 1][:2] if start > 0 else None
    right = around[stop][:2] if stop < len(around) else None
    own = {p[:2] for p in run}
    present = {p[:2] for p in target}
    if any(p[:2] in present for p in other if p[:2] not in own):
        return None
    found = []
    for at in range(len(target) - len(run) + 1):
        end = at + len(run)
        if target[at:end] != run:
            continue
        if run:
            found.append(at)
            continue
        if (target[at - 1][:2] if at > 0 else None) != left:
            continue
        if (target[end][:2] if end < len(target) else None) != right:
            continue
        found.append(at)
    return found[0] if len(found) == 1 else None


def fixed(before: Signature, after: Signature, target: Signature) -> Signature | None:
    """The target's header with exactly the fix's change made (what the
    rewrite must write); None where the change cannot be placed."""
    fields = tuple(
        (name, after.field(name) if before.field(name) != after.field(name) else value)
        for name, value in target.fields
    )
    places = []
    for old, new, i1, i2, _j1, _j2 in _runs(before.params, after.params):
        at = _placed(target.params, old, new, before.params, i1, i2)
        if at is None:
            return None
        places.append((at, old, new))
    params = list(target.params)
    # From the last place back: an earlier run's place does not move.
    for at, old, new in sorted(places, key=lambda place: place[0], reverse=True):
        params[at : at + len(old)] = new
    return Signature(fields, tuple(params))

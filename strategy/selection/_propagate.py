"""Running an op under its selected strategy: on one rank (``propagate``) or all (simulated).

Both select the strategy, redistribute each input to the strategy's input spec with
the planner's plan, and run the op's torch implementation on the local tensors. The
simulated variant runs every rank in this process through the simulator — the
reference the property tests hold the selection to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from meshplan.errors import StrategyError
from meshplan.layout._ints import brief
from meshplan.placement import Spec, local_shape, same_layout

from ..rules._ruleset import RuleSet
from ._problem import check_inputs, check_op
from ._reference import run_local
from ._select import Choice, select

__all__ = ["propagate", "propagate_simulated"]


def _outputs(result: Any, n: int) -> tuple[torch.Tensor, ...]:
    return tuple(result) if n > 1 else (result,)


def _check_locals(
    op: str, locals_: Sequence[Mapping[int, torch.Tensor]], specs: tuple[Spec, ...]
) -> list[dict[int, torch.Tensor]]:
    """Each input's rank -> local tensor map, checked against its spec (ranks, shapes, dtypes)."""
    if isinstance(locals_, Mapping | str) or not isinstance(locals_, Sequence):
        raise StrategyError(
            f"{op}: locals_ must be a sequence with one rank -> local tensor mapping per input, "
            f"got {locals_!r}",
            value=locals_,
        )
    if len(locals_) != len(specs):
        raise StrategyError(
            f"{op}: {len(locals_)} local inputs for {len(specs)} specs; give one rank -> local "
            "tensor mapping per spec",
            value=locals_,
        )
    out = []
    for i, (loc, spec) in enumerate(zip(locals_, specs, strict=True)):
        if not isinstance(loc, Mapping):
            raise StrategyError(
                f"{op}: local input {i} must map each rank to its local tensor, got {loc!r}",
                value=loc,
            )
        ranks = tuple(spec.mesh.ranks)
        missing = [r for r in ranks if r not in loc]
        extra = [r for r in loc if r not in set(ranks)]
        if missing or extra:
            found = [f"missing {missing!r}"] if missing else []
            found += [f"{extra!r} not in the mesh"] if extra else []
            raise StrategyError(
                f"{op}: local input {i} must hold exactly the ranks {list(ranks)!r} of {spec}; "
                f"{' and '.join(found)}",
                value=loc,
            )
        checked = {}
        for r in ranks:
            t = loc[r]
            if not isinstance(t, torch.Tensor):
                raise StrategyError(
                    f"{op}: rank {r}'s local input {i} is {type(t).__name__}, not a torch.Tensor",
                    value=t,
                )
            want = local_shape(spec, r)
            if tuple(t.shape) != want:
                raise StrategyError(
                    f"{op}: rank {r}'s local input {i} has shape {tuple(t.shape)}, but {spec} "
                    f"gives it {want}; shard the global tensor with this spec",
                    value=tuple(t.shape),
                )
            dtype = str(t.dtype).removeprefix("torch.")
            if dtype != spec.dtype:
                raise StrategyError(
                    f"{op}: rank {r}'s local input {i} has dtype {dtype}, but {spec} says "
                    f"{spec.dtype}; convert the tensor or build the spec with dtype={dtype!r}",
                    value=dtype,
                )
            checked[r] = t
        out.append(checked)
    return out


def propagate_simulated(
    op: str,
    locals_: Sequence[Mapping[int, torch.Tensor]],
    input_specs: Sequence[Spec],
    ruleset: RuleSet | None = None,
    cost_model: Any = None,
    method: str = "search",
    **args: Any,
) -> tuple[dict[int, torch.Tensor], Choice]:
    """Run ``op`` on every rank's local inputs at once: (rank -> local output, the choice).

    ``locals_[i]`` maps each rank to its local part of input ``i`` laid out per
    ``input_specs[i]``. Inputs are redistributed in the simulator with the planner's
    plans; for ops with several outputs each rank's value is a tuple.

    >>> import torch
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard, shard, unshard
    >>> mesh = Mesh.create(2)
    >>> a = Spec(mesh, (Shard(1),), (2, 4), "float64")
    >>> b = Spec(mesh, (Replicate(),), (4, 3), "float64")
    >>> x, y = torch.randn(2, 4, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    >>> out, choice = propagate_simulated("mm", [shard(x, a), shard(y, b)], [a, b])
    >>> print(choice.output_spec)  # a partial sum would cost its reduction later
    f64[2,3](S(0))
    >>> torch.allclose(unshard(out, choice.output_spec), x @ y)
    True
    """
    specs = check_inputs(check_op(op), input_specs)
    checked = _check_locals(op, locals_, specs)
    choice = select(op, specs, ruleset, cost_model, method, **args)
    from meshplan.redistribute import plan, simulate

    moved = []
    for loc, src, dst in zip(checked, specs, choice.input_specs, strict=True):
        moved.append(
            simulate(plan(src, dst, cost_model=cost_model), loc) if src != dst else dict(loc)
        )
    ranks = sorted(moved[0])
    n_out = len(choice.output_specs)
    out = {}
    for r in ranks:
        result = run_local(op, [m[r] for m in moved], args, choice.output_specs, r)
        out[r] = result if n_out == 1 else tuple(_outputs(result, n_out))
    return out, choice


def _redistribute():
    try:
        from meshplan.runtime import redistribute
    except ImportError:
        from meshplan.runtime._autograd import redistribute
    return redistribute


def propagate(
    op: str,
    inputs: Sequence[Any],
    groups: Any,
    ruleset: RuleSet | None = None,
    cost_model: Any = None,
    **args: Any,
):
    """Run ``op`` on this rank's :class:`~meshplan.placement.Sharded` inputs; Sharded output(s).

    Selects the cheapest strategy for the inputs' specs, redistributes each input that
    needs it with ``meshplan.runtime.redistribute`` over ``groups`` (every rank
    must call this together, as with any collective), and runs the op locally.
    """
    from meshplan.placement import Sharded

    if isinstance(inputs, Sharded):
        inputs = (inputs,)
    try:
        inputs = tuple(inputs)
    except TypeError:
        inputs = ()
    if not inputs or not all(isinstance(x, Sharded) for x in inputs):
        raise StrategyError(
            f"{brief(op)}: propagate takes a sequence of Sharded inputs, got {brief(inputs)}",
            value=inputs,
        )
    rank = inputs[0].rank
    if any(x.rank != rank for x in inputs):
        raise StrategyError(
            f"{op}: inputs belong to ranks {[x.rank for x in inputs]!r}; pass one rank's inputs",
            value=inputs,
        )
    choice = select(op, [x.spec for x in inputs], ruleset, cost_model, "search", **args)
    locals_ = []
    for i, (x, dst) in enumerate(zip(inputs, choice.input_specs, strict=True)):
        if same_layout(x.spec, dst):  # nothing moves (the specs may still differ)
            locals_.append(x.local)
            continue
        from meshplan.runtime import ProcessGroups

        if not isinstance(groups, ProcessGroups):
            raise StrategyError(
                f"{op}: input {i} must move from {x.spec} to {dst}, which needs the mesh's "
                f"ProcessGroups as groups=, got {groups!r}",
                value=groups,
            )
        locals_.append(_redistribute()(x.local, x.spec, dst, groups, cost_model=cost_model))
    result = run_local(op, locals_, args, choice.output_specs, rank)
    outs = _outputs(result, len(choice.output_specs))
    sharded = tuple(Sharded(t, s, rank) for t, s in zip(outs, choice.output_specs, strict=True))
    return sharded[0] if len(sharded) == 1 else sharded

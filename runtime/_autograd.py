"""The differentiable move: :func:`redistribute`, its backward planned from the gradient's layout.

A gradient's layout is derived where the result's layout decides it
(:func:`derived_grad_spec`) and must be said (``dst_grad=``) where it does not: a
replicated result's gradient is replicated when every rank computes the same from it,
a partial sum when each rank combines it with other data. A Partial source's gradient
is its reduced value's: in full for sum, divided for avg, shared by the extreme pieces
for max/min.
"""

from __future__ import annotations

from typing import Any

import torch

from meshplan.errors import RuntimeShellError
from meshplan.placement import Partial, Replicate, Spec
from meshplan.redistribute._steps import grad_spec

from ._groups import ProcessGroups
from ._run import _check_local, dtype_of, run

__all__ = ["grad_spec", "derived_grad_spec", "redistribute"]


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local, src, dst, groups, options, dst_grad):  # type: ignore[override]
        from meshplan.redistribute._planner import plan

        ctx.specs = (src, dst, dst_grad)
        ctx.groups = groups
        ctx.options = options
        if any(isinstance(p, Partial) and p.op in ("max", "min") for p in src.placements):
            ctx.save_for_backward(local)
        return run(plan(src, dst, **options), local, groups)

    @staticmethod
    def backward(ctx: Any, grad):  # type: ignore[override]
        src, dst, dst_grad = ctx.specs
        grad_src, grad_dst = dst_grad, grad_spec(src)
        if dtype_of(grad) != grad_src.dtype:
            grad_src = _with_dtype(grad_src, dtype_of(grad))
            grad_dst = _with_dtype(grad_dst, dtype_of(grad))
        out = _Redistribute.apply(
            grad.contiguous(), grad_src, grad_dst, ctx.groups, ctx.options, grad_spec(grad_dst)
        )
        out = _partial_input_grad(ctx, src, out)
        return out, None, None, None, None, None


def _partial_input_grad(ctx: Any, src: Spec, grad: torch.Tensor) -> torch.Tensor:
    """A rank's share of the gradient of a Partial input, from the reduced value's gradient.

    sum: every rank's piece counts fully (the replicated gradient as it is); avg: each
    piece counts ``1/n`` over the avg dims; max/min: the pieces that reached the
    extreme share it equally (as ``amax``'s gradient does), the others get zero.
    """
    from meshplan.redistribute._planner import plan

    n_avg = 1
    extreme = []
    for m, p in enumerate(src.placements):
        if isinstance(p, Partial) and p.op == "avg":
            n_avg *= src.mesh.shape[m]
        elif isinstance(p, Partial) and p.op in ("max", "min"):
            extreme.append(m)
    if n_avg > 1:
        grad = grad / n_avg
    if extreme:
        (local,) = ctx.saved_tensors
        reduced = [Replicate() if m in extreme else p for m, p in enumerate(src.placements)]
        value_spec = Spec(src.mesh, reduced, src.shape, src.dtype, src.shard_order)
        value = run(plan(src, value_spec), local.detach().contiguous(), ctx.groups)
        hit = (local.detach() == value).to(grad.dtype)
        count_src = Spec(
            src.mesh,
            [Partial("sum") if m in extreme else p for m, p in enumerate(reduced)],
            src.shape,
            dtype_of(hit),
            src.shard_order,
        )
        count = run(plan(count_src, _with_dtype(value_spec, dtype_of(hit))), hit, ctx.groups)
        grad = grad * hit / count
    return grad


def _with_dtype(spec: Spec, dtype: str) -> Spec:
    return Spec(spec.mesh, spec.placements, spec.shape, dtype, spec.shard_order)


def derived_grad_spec(dst: Spec) -> Spec | None:
    """The layout of the gradient arriving for a value in ``dst``, where it follows from
    ``dst`` alone; None where it does not.

    A sharded value's gradient is sharded alike (a rank's consumer only saw its piece);
    a partial value's gradient is the reduced value's, replicated. A replicated value's
    gradient depends on its consumer: replicated if every rank computed the same thing
    from it, a partial sum if each rank combined it with other data (a weight gathered
    for a data-parallel batch). Then it is not derived.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> mesh = Mesh.create((2, 2))
    >>> print(derived_grad_spec(Spec(mesh, [Shard(0), Partial()], (4,))))
    f32[4](S(0) R)
    >>> derived_grad_spec(Spec(mesh, [Replicate(), Shard(0)], (4,))) is None
    True
    """
    if not isinstance(dst, Spec):
        raise RuntimeShellError(
            f"derived_grad_spec takes the Spec of a value, got {dst!r:.80}", value=dst
        )
    for m, p in enumerate(dst.placements):
        if isinstance(p, Replicate) and dst.mesh.shape[m] > 1:
            return None
    return grad_spec(dst)


def _check_dst_grad(dst: Spec, dst_grad: Any) -> Spec:
    if not isinstance(dst_grad, Spec):
        raise RuntimeShellError(
            f"dst_grad must be a Spec (the layout the result's gradient arrives in), got "
            f"{dst_grad!r}",
            value=dst_grad,
        )
    if dst_grad.mesh != dst.mesh or dst_grad.shape != dst.shape:
        raise RuntimeShellError(
            f"dst_grad {dst_grad} must lie on the result's mesh with its shape ({dst})",
            value=dst_grad,
        )
    return dst_grad


def redistribute(
    local: torch.Tensor,
    src: Spec,
    dst: Spec,
    groups: ProcessGroups,
    *,
    dst_grad: Spec | None = None,
    cost_model: Any = None,
    merge: bool = True,
    max_local_bytes: int | None = None,
) -> torch.Tensor:
    """Move the calling rank's ``local`` tensor from ``src`` to ``dst``; differentiable.

    Plans (cached on the specs and options) and runs; every rank of the mesh calls it.
    Without ``cost_model`` it plans with the groups' own options
    (:meth:`ProcessGroups.plan_options <meshplan.runtime.ProcessGroups.plan_options>`:
    by default those of their backend, e.g. the gloo host preset on gloo).
    The backward pass plans from the layout the gradient arrives in, ``dst_grad``, to
    ``src``'s gradient layout (:func:`grad_spec`: a Partial source gets its reduced
    value's gradient: replicated for sum, divided for avg, shared by the extreme pieces
    for max/min). ``dst_grad`` is derived where ``dst`` decides it
    (:func:`derived_grad_spec`); where ``dst`` replicates a mesh dim it depends on how
    the result is used, so a tensor that requires grad must say it: ``dst_grad=dst``
    when every rank computes the same from the result, a ``Partial`` on the dims where
    ranks combine it with other data (e.g. a weight gathered for a data-parallel
    batch: then its gradient is reduce-scattered back in one step).
    """
    if not isinstance(src, Spec) or not isinstance(dst, Spec):
        raise RuntimeShellError(
            f"redistribute moves between two Specs, got src={src!r:.80}, dst={dst!r:.80}",
            value=(src, dst),
        )
    _check_local(local, src, groups)
    # no cost model given: the one of the groups' backend (see ProcessGroups.plan_options)
    options = {
        **groups.plan_options(cost_model),
        "merge": merge,
        "max_local_bytes": max_local_bytes,
    }
    if dst_grad is None:
        dst_grad = derived_grad_spec(dst)
        if dst_grad is None:
            if isinstance(local, torch.Tensor) and local.requires_grad and torch.is_grad_enabled():
                raise RuntimeShellError(
                    f"the gradient of a result laid out {dst} cannot be derived: a replicated "
                    "mesh dim's gradient is replicated if every rank computes the same from "
                    "it, or a partial sum if each rank combines it with other data; say "
                    "which with dst_grad= (dst_grad=dst, or dst with Partial() on those dims)",
                    value=dst,
                )
            dst_grad = grad_spec(dst)
    dst_grad = _check_dst_grad(dst, dst_grad)
    return _Redistribute.apply(local, src, dst, groups, options, dst_grad)

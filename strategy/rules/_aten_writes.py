"""Single-mesh-dim rules for writes made values and for random draws (pure, no torch).

A traced write is functionalized (:mod:`._trace`): ``view.copy_(src)`` becomes
``copy(view, src)`` and a scatter of the result into the view's base
(``slice_scatter``, ``select_scatter``, ``diagonal_scatter``, ``as_strided_scatter``),
``fill_`` becomes ``fill``, ``masked_fill_``
``masked_fill`` (a pointwise op) and ``index_put_`` ``index_put``
(:mod:`._aten_pieces`). Each rule shards every dim the write does not cut, alike on the
base, the written piece and the result, and passes ``Partial(sum)`` where the op is
linear in its tensors (a copy, a scatter of a partial piece into a partial base).

Random ops (:mod:`._random`) shard their result freely: each rank keeps its chunks of
the one global draw. An op whose draw reads its input elementwise (``bernoulli`` of
probabilities, ``native_dropout``) is sharded like its input. No random result is ever
``Partial``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.placement import Partial, Replicate

from ._aten import Call, _factory, _norm, _pointwise
from ._aten_pieces import _new_factory
from ._random import ELEMENTWISE, FACTORIES, SHAPED
from ._rule import DimStrategy, Placeholder

__all__ = ["RULES"]

R = Replicate()
PSUM = Partial("sum")


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _copy(call: Call) -> list[DimStrategy]:
    """``copy(self, src)``: ``src`` broadcast to ``self``'s shape in ``self``'s dtype;
    ``self`` gives only shape (so it is sharded like the result), ``src`` sums pass
    when the result is a float (a cast to an integer would not add up)."""
    out = [s for s in _pointwise(call) if PSUM not in s.inputs]
    if _is_float(call.outputs[0].dtype) and _is_float(call.inputs[1].dtype):
        out.append(DimStrategy([PSUM], [R, PSUM]))
    return out


def _fill(call: Call) -> list[DimStrategy]:
    """``fill(self, value)``: ``self`` gives the shape; a value tensor is 0-d."""
    x = call.inputs[0]
    rest = [R] * (len(call.inputs) - 1)
    out = [DimStrategy([Placeholder(d)], [Placeholder(d)] + rest) for d in range(x.ndim)]
    out.append(DimStrategy([R], [PSUM] + rest))  # self's values are not read
    return out


def _slice_scatter(call: Call) -> list[DimStrategy]:
    """``slice_scatter(self, src, dim, start, end, step)``: every dim but ``dim``."""
    nd = call.inputs[0].ndim
    dim = _norm(call.arg(2, "dim", 0), nd)
    out = [
        DimStrategy([Placeholder(d)], [Placeholder(d), Placeholder(d)])
        for d in range(nd)
        if d != dim
    ]
    out.append(DimStrategy([PSUM], [PSUM, PSUM]))
    return out


def _select_scatter(call: Call) -> list[DimStrategy]:
    """``select_scatter(self, src, dim, index)``: ``src`` lacks ``dim``."""
    nd = call.inputs[0].ndim
    dim = _norm(call.arg(2, "dim"), nd)
    out = [
        DimStrategy([Placeholder(d)], [Placeholder(d), Placeholder(d - 1 if d > dim else d)])
        for d in range(nd)
        if d != dim
    ]
    out.append(DimStrategy([PSUM], [PSUM, PSUM]))
    return out


def _kept(nd: int, gone: set[int]) -> dict[int, int]:
    """Each dim of ``nd`` not in ``gone``: its index among the kept ones."""
    kept = [d for d in range(nd) if d not in gone]
    return {d: k for k, d in enumerate(kept)}


def _diagonal_dims(call: Call, at: int) -> tuple[int, int]:
    nd = call.inputs[0].ndim
    return _norm(call.arg(at, "dim1", 0), nd), _norm(call.arg(at + 1, "dim2", 1), nd)


def _diagonal(call: Call) -> list[DimStrategy]:
    """``diagonal(self, offset, dim1, dim2)``: the other dims of ``self`` in order, then
    the diagonal (its last dim)."""
    kept = _kept(call.inputs[0].ndim, set(_diagonal_dims(call, 2)))
    out = [DimStrategy([Placeholder(k)], [Placeholder(d)]) for d, k in kept.items()]
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _diagonal_scatter(call: Call) -> list[DimStrategy]:
    """``diagonal_scatter(self, src, offset, dim1, dim2)``: ``src`` is the diagonal
    (:func:`_diagonal`'s dims); every dim but ``dim1`` and ``dim2``."""
    kept = _kept(call.inputs[0].ndim, set(_diagonal_dims(call, 3)))
    out = [DimStrategy([Placeholder(d)], [Placeholder(d), Placeholder(k)]) for d, k in kept.items()]
    out.append(DimStrategy([PSUM], [PSUM, PSUM]))
    return out


def _diagonal_backward(call: Call) -> list[DimStrategy]:
    """``diagonal_backward(grad, input_sizes, offset, dim1, dim2)``: the diagonal put
    back in zeros of ``input_sizes`` (the result's, local on each rank)."""
    nd = call.outputs[0].ndim
    gone = {_norm(call.arg(3, "dim1"), nd), _norm(call.arg(4, "dim2"), nd)}
    kept = _kept(nd, gone)
    out = [DimStrategy([Placeholder(d)], [Placeholder(k)]) for d, k in kept.items()]
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _unfold(call: Call) -> list[DimStrategy]:
    """``unfold(self, dimension, size, step)``: windows of ``dimension`` (the result's
    dim there counts them, its last dim runs along one); every other dim."""
    nd = call.inputs[0].ndim
    dim = _norm(call.arg(1, "dimension"), max(nd, 1))
    out = [DimStrategy([Placeholder(d)], [Placeholder(d)]) for d in range(nd) if d != dim]
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _unfold_backward(call: Call) -> list[DimStrategy]:
    """``unfold_backward(grad, input_sizes, dim, size, step)``: the windows summed back
    into ``dim``; every other dim (the sizes are the result's, local on each rank)."""
    nd = call.outputs[0].ndim
    dim = _norm(call.arg(2, "dim"), max(nd, 1))
    out = [DimStrategy([Placeholder(d)], [Placeholder(d)]) for d in range(nd) if d != dim]
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _as_strided(call: Call) -> list[DimStrategy]:
    """``as_strided(self, size, stride, storage_offset)``: elements of ``self``'s
    contiguous storage. Linear (Partial sums pass), and sharded along dim 0 where the
    view's dim 0 steps through ``self``'s dim 0 one to one and the rest of the view lies
    within one of its slabs (a batch of equal windows): then each rank's view of its
    rows is the view of its local rows, with its local size."""
    out = [DimStrategy([PSUM], [PSUM])]
    if _rows_one_to_one(call.inputs[0].shape, call.arg(1, "size"), call.arg(2, "stride"),
                        call.arg(3, "storage_offset")):  # fmt: skip
        out.append(DimStrategy([Placeholder(0)], [Placeholder(0)]))
    return out


def _rows_one_to_one(shape, size, stride, offset) -> bool:
    if not shape or not size or size[0] != shape[0] or shape[0] <= 1:
        return False
    row = 1
    for n in shape[1:]:
        row *= n
    last = (offset or 0) + sum((n - 1) * s for n, s in zip(size[1:], stride[1:], strict=True))
    return stride[0] == row and (offset or 0) >= 0 and last < row and min(size) > 0


def _as_strided_scatter(call: Call) -> list[DimStrategy]:
    """``as_strided_scatter(self, src, size, stride, storage_offset)``: ``src`` written
    over those elements of ``self``'s storage. Linear in both: Partial sums pass."""
    return [DimStrategy([PSUM], [PSUM, PSUM])]


def _drawn(call: Call) -> list[DimStrategy]:
    """A draw whose input gives only shape and dtype (or that has none): any shard of
    the result from any layout of the input."""
    m = call.outputs[0]
    ins: list[Any] = [R]
    if call.inputs:
        x = call.inputs[0]
        ins += [Placeholder(e) for e in range(x.ndim)]
        if _is_float(x.dtype):
            ins.append(PSUM)
    out = []
    for o in [R] + [Placeholder(d) for d in range(m.ndim)]:
        for i in ins:
            if o == R and i == R:
                continue  # full replication is every op's, added elsewhere
            rest = [R] * max(len(call.inputs) - 1, 0)
            out.append(DimStrategy([o], ([i] + rest) if call.inputs else []))
    return out


def _drawn_elementwise(call: Call) -> list[DimStrategy]:
    """A draw per element reading the input there: sharded like the input (never sums)."""
    m = call.outputs[0]
    n_out = sum(1 for o in call.outputs if o is not None)
    out = []
    for d in range(m.ndim):
        ins = [
            Placeholder(d) if x.ndim == m.ndim and x.shape[d] == m.shape[d] else R
            for x in call.inputs
        ]
        if ins and isinstance(ins[0], Placeholder):
            out.append(DimStrategy([Placeholder(d)] * n_out, ins))
    return out


def _random_rule(overloads: frozenset[str], rule: Callable[[Call], list[DimStrategy]]):
    def read(call: Call) -> list[DimStrategy]:
        return rule(call) if call.target.removeprefix("aten.") in overloads else []

    return read


def _ops(overloads: frozenset[str]) -> set[str]:
    return {name.split(".")[0] for name in overloads}


RULES: dict[str, Callable[[Call], list[DimStrategy]]] = {
    "copy": _copy,
    "fill": _fill,
    "slice_scatter": _slice_scatter,
    "select_scatter": _select_scatter,
    # views functionalization cannot express as slices, and their writes' scatters
    "diagonal": _diagonal,
    "diagonal_scatter": _diagonal_scatter,
    "diagonal_backward": _diagonal_backward,
    "unfold": _unfold,
    "unfold_backward": _unfold_backward,
    "as_strided": _as_strided,
    "as_strided_scatter": _as_strided_scatter,
    # the buffers autograd's backward of a write into a view copies the gradient into
    # (strides of the global tensor stay valid on any local piece of it)
    "new_empty_strided": _new_factory,
    "empty_strided": _factory,
}
RULES |= {op: _random_rule(SHAPED | FACTORIES, _drawn) for op in _ops(SHAPED | FACTORIES)}
RULES |= {op: _random_rule(ELEMENTWISE, _drawn_elementwise) for op in _ops(ELEMENTWISE)}
# bernoulli has overloads of both kinds
RULES["bernoulli"] = lambda call: (
    _drawn(call) if call.target == "aten.bernoulli.p" else _drawn_elementwise(call)
)

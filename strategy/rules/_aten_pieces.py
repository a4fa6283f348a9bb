"""Single-mesh-dim rules for the aten ops real models trace to besides their matmuls (no torch).

Pieces of a tensor (``split``, ``split_with_sizes``, ``unbind``, ``slice``, ``select``,
their backward ``slice_backward`` / ``select_backward``, ``cat``, ``stack``,
``constant_pad_nd``, ``flip``), gathers on the batch dims (``index``, ``index_put``),
factories laid out as their consumers want (``arange``, ``new_ones`` and kin), scans
and masks (``cumsum``, ``triu``, ``tril``), and the complex views of rotary embeddings
(``view_as_complex``, ``view_as_real``, ``_conj``). Like every aten rule, each strategy
is one where every rank runs the same aten op on its local tensors (with the result's
local shape, or for ``arange`` its local range, in place of the global one).

A piece-taking op shards every dim it does not cut, alike on the input and the
pieces, and passes ``Partial(sum)`` through (taking pieces is linear). It does not
shard the dim it cuts: a rank would need its piece's offsets, which differ per rank.
So a fused q/k/v projection split along its last dim keeps that dim whole on every
rank (batch, sequence or, after the heads' view, the heads are sharded instead), and
Llama's ``rotate_half`` slices and concatenates the head dim, which stays whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.placement import Partial, Replicate

from ._aten import Call, TensorArg, _named, _norm, _softmax, _sums_only
from ._rule import DimStrategy, Placeholder

__all__ = ["RULES", "local_range"]

R = Replicate()
PSUM = Partial("sum")


def _n_out(call: Call) -> int:
    return sum(1 for m in call.outputs if m is not None)


def _keep_all_but(call: Call, cut: set[int], *, drop: int | None = None) -> list[DimStrategy]:
    """Shard every input dim not in ``cut`` alike on the input and the outputs (``drop``:
    an input dim the outputs do not have, so later dims move one down); sums pass."""
    x = call.inputs[0]
    n_out = _n_out(call)
    rest = [R] * (len(call.inputs) - 1)
    out = []
    for d in range(x.ndim):
        if d in cut or d == drop:
            continue
        o = d - 1 if drop is not None and d > drop else d
        out.append(DimStrategy([Placeholder(o)] * n_out, [Placeholder(d)] + rest))
    out.append(DimStrategy([PSUM] * n_out, [PSUM] + rest))
    return out


def _split(call: Call) -> list[DimStrategy]:
    # split.Tensor(self, split_size, dim=0), split_with_sizes(self, split_sizes, dim=0)
    return _keep_all_but(call, {_norm(call.arg(2, "dim", 0), call.inputs[0].ndim)})


def _unbind(call: Call) -> list[DimStrategy]:
    nd = call.inputs[0].ndim
    return _keep_all_but(call, set(), drop=_norm(call.arg(1, "dim", 0), nd))


def _slice(call: Call) -> list[DimStrategy]:
    # slice.Tensor(self, dim=0, start=None, end=None, step=1)
    return _keep_all_but(call, {_norm(call.arg(1, "dim", 0), call.inputs[0].ndim)})


def _select(call: Call) -> list[DimStrategy]:
    # select.int(self, dim, index)
    nd = call.inputs[0].ndim
    return _keep_all_but(call, set(), drop=_norm(call.arg(1, "dim"), nd))


def _flip(call: Call) -> list[DimStrategy]:
    nd = call.inputs[0].ndim
    return _keep_all_but(call, {_norm(d, nd) for d in call.arg(1, "dims")})


def _cumsum(call: Call) -> list[DimStrategy]:
    # cumsum(self, dim, dtype=None): every other dim; a running sum is linear
    return _keep_all_but(call, {_norm(call.arg(1, "dim"), call.inputs[0].ndim)})


def _triangle(call: Call) -> list[DimStrategy]:
    # triu / tril(self, diagonal=0) act on the last two dims; zeroing entries is linear
    nd = call.inputs[0].ndim
    return _keep_all_but(call, {nd - 2, nd - 1})


def _pad(call: Call) -> list[DimStrategy]:
    # constant_pad_nd(self, pad, value=0): pad pairs from the last dim backwards
    nd = call.inputs[0].ndim
    pad = call.arg(1, "pad")
    cut = {nd - 1 - i // 2 for i, p in enumerate(pad) if p}
    out = _keep_all_but(call, cut)
    if call.arg(2, "value", 0) != 0:
        out = [s for s in out if PSUM not in s.inputs]  # a pad value added once per rank
    return out


def _slice_backward(call: Call) -> list[DimStrategy]:
    # slice_backward(grad, input_sizes, dim, start, end, step): the grad in a zero tensor
    return _keep_all_but(call, {_norm(call.arg(2, "dim"), call.outputs[0].ndim)})


def _select_backward(call: Call) -> list[DimStrategy]:
    # select_backward(grad, input_sizes, dim, index): output dims around the selected one
    nd = call.outputs[0].ndim
    dim = _norm(call.arg(2, "dim"), nd)
    out = []
    for d in range(nd):
        if d != dim:
            out.append(DimStrategy([Placeholder(d)], [Placeholder(d - 1 if d > dim else d)]))
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _cat(call: Call) -> list[DimStrategy]:
    # torch.cat skips 1-D empty tensors next to tensors of more dims (a legacy rule that
    # caches built from torch.tensor([]) rely on): they stay replicated, the rest as cat
    nd = call.outputs[0].ndim
    skip = [call.op == "cat" and m.shape == (0,) and nd != 1 for m in call.inputs]
    kept = tuple(m for m, s in zip(call.inputs, skip, strict=True) if not s)
    if not kept:
        return []
    part = Call(call.target, kept, call.outputs, (), {}, call.tags)
    out = []
    for st in _sums_only(_named(call.op, part, dim=call.arg(1, "dim", 0))):
        it = iter(st.inputs)
        ins = [R if s else next(it) for s in skip]
        if any(s for s in skip) and any(p == PSUM for p in ins):
            ins = [p if not s else PSUM for p, s in zip(ins, skip, strict=True)]
        out.append(DimStrategy(st.outputs, ins))
    return out


def _complex_view(call: Call) -> list[DimStrategy]:
    # view_as_complex: (..., 2) real -> (...) complex; view_as_real the other way
    n = min(call.inputs[0].ndim, call.outputs[0].ndim)
    out = [DimStrategy([Placeholder(d)], [Placeholder(d)]) for d in range(n)]
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _same(call: Call) -> list[DimStrategy]:
    return _keep_all_but(call, set())


def _new_factory(call: Call) -> list[DimStrategy]:
    # new_ones / new_zeros / new_full / new_empty(self, size, ...): only self's dtype and
    # device matter, so any layout of self gives any shard of the result (its local shape)
    x, m = call.inputs[0], call.outputs[0]
    ins: list[Any] = [R] + [Placeholder(e) for e in range(x.ndim)]
    if x.dtype.startswith(("float", "bfloat", "complex")):
        ins.append(PSUM)
    outs: list[Any] = [R] + [Placeholder(d) for d in range(m.ndim)]
    out = []
    for o in outs:
        for i in ins:
            if o != R or i != R:
                out.append(DimStrategy([o], [i]))
    return out


def _arange(call: Call) -> list[DimStrategy]:
    # arange(end) / arange(start, end) / arange(start, end, step): a shard is a local range
    if call.outputs[0].ndim != 1 or local_range(call.target, call.args, 0, 0) is None:
        return []
    return [DimStrategy([Placeholder(0)], [])]


def local_range(target: str, args: tuple, offset: int, length: int) -> tuple | None:
    """``arange``'s arguments for the ``length`` elements from ``offset`` of its result
    (None: arguments that are not plain numbers).

    >>> local_range("aten.arange.start_step", (2, 20, 3), 1, 2)
    (5, 11, 3)
    """
    overload = target.rsplit(".", 1)[-1]
    if overload == "default":
        start, step = 0, 1
    elif overload == "start":
        start, step = args[0], 1
    elif overload == "start_step":
        start, step = args[0], args[2] if len(args) > 2 else 1
    else:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, step)):
        return None
    first = start + step * offset
    return (first, first + step * length, step)


def _index_layout(call: Call) -> tuple[list[int | None], int, int] | None:
    """Of ``index.Tensor(self, indices)``: per self dim the index input holding it (None:
    not indexed), where the indexed block lands in the result, and its ndim."""
    x = call.inputs[0]
    idx = call.arg(1, "indices")
    which: list[int | None] = []
    for d in range(x.ndim):
        a = idx[d] if d < len(idx) else None
        which.append(a.index if isinstance(a, TensorArg) else None)
    dims = [d for d, w in enumerate(which) if w is not None]
    if not dims:
        return None
    block = max(call.inputs[w].ndim for w in which if w is not None)
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    return which, dims[0] if adjacent else 0, block


def _index(call: Call) -> list[DimStrategy]:
    """A gather: shard a dim of self no index reads, or the indices' own dims alike (every
    index tensor as big as the block, self whole); sums pass through the gather."""
    lay = _index_layout(call)
    if lay is None:
        return []
    which, at, block = lay
    x = call.inputs[0]
    n_in = len(call.inputs)
    out = []
    o = 0
    for d in range(x.ndim):
        if which[d] is not None:
            continue
        od = o + (block if o >= at else 0)
        ins = [Placeholder(d)] + [R] * (n_in - 1)
        out.append(DimStrategy([Placeholder(od)], ins))
        o += 1
    idx_in = [i for i in range(1, n_in)]
    if all(call.inputs[i].ndim == block for i in idx_in):
        for k in range(block):
            sizes = {call.inputs[i].shape[k] for i in idx_in}
            if len(sizes) == 1:
                ins = [R] + [Placeholder(k)] * len(idx_in)
                out.append(DimStrategy([Placeholder(at + k)], ins))
    out.append(DimStrategy([PSUM], [PSUM] + [R] * (n_in - 1)))
    return out


def _index_put(call: Call) -> list[DimStrategy]:
    """``index_put(self, indices, values, accumulate)``: the gather's transpose. A dim no
    index reads is sharded on self, values and the result alike; with ``accumulate``,
    sharded indices and values scatter into partial sums of the result."""
    x, m = call.inputs[0], call.outputs[0]
    idx = call.arg(1, "indices")
    which = []
    for d in range(x.ndim):
        a = idx[d] if d < len(idx) else None
        which.append(a.index if isinstance(a, TensorArg) else None)
    dims = [d for d, w in enumerate(which) if w is not None]
    vals = call.arg(2, "values")
    if not dims or not isinstance(vals, TensorArg) or m is None:
        return []
    v = call.inputs[vals.index]
    idx_in = sorted({w for w in which if w is not None})
    block = max(call.inputs[i].ndim for i in idx_in)
    at = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
    if v.ndim != x.ndim - len(dims) + block:
        return []  # broadcast values: left whole
    n_in = len(call.inputs)

    def strategy(out, self_p, idx_p, val_p) -> DimStrategy:
        ins = [R] * n_in
        ins[0] = self_p
        for i in idx_in:
            ins[i] = idx_p
        ins[vals.index] = val_p
        return DimStrategy([out], ins)

    out = []
    o = 0
    for d in range(x.ndim):
        if which[d] is not None:
            continue
        od = o + (block if o >= at else 0)
        out.append(strategy(Placeholder(d), Placeholder(d), R, Placeholder(od)))
        o += 1
    if call.arg(3, "accumulate", False):
        out.append(strategy(PSUM, PSUM, R, PSUM))
        if all(call.inputs[i].ndim == block for i in idx_in):
            for k in range(block):
                if len({call.inputs[i].shape[k] for i in idx_in}) == 1:
                    out.append(strategy(PSUM, PSUM, Placeholder(k), Placeholder(at + k)))
    return out


RULES: dict[str, Callable[[Call], list[DimStrategy]]] = {
    "split": _split,
    "split_with_sizes": _split,
    "unbind": _unbind,
    "slice": _slice,
    "select": _select,
    "slice_backward": _slice_backward,
    "select_backward": _select_backward,
    "cat": _cat,
    "stack": _cat,
    "constant_pad_nd": _pad,
    "flip": _flip,
    "cumsum": _cumsum,
    "triu": _triangle,
    "tril": _triangle,
    "view_as_complex": _complex_view,
    "view_as_real": _complex_view,
    "_conj": _same,
    "conj_physical": _same,
    "resolve_conj": _same,
    "resolve_neg": _same,
    "new_ones": _new_factory,
    "new_zeros": _new_factory,
    "new_full": _new_factory,
    "new_empty": _new_factory,
    "arange": _arange,
    "_safe_softmax": _softmax,  # softmax whose fully masked rows are zeros
    "index": _index,
    "index_put": _index_put,
    "_index_put_impl": _index_put,
}

"""Single-mesh-dim rules for the aten ops a traced program holds (pure, no torch).

A traced program (:func:`~meshplan.strategy.plan_program`) is a graph of aten calls,
forward and backward alike: ``aten.mm.default``, ``aten.view.default``,
``aten.native_layer_norm_backward.default`` … :func:`aten_strategies` gives each call's
strategies on ONE mesh dim, in the same :class:`DimStrategy` form the op-name rules use
(it reuses them where an aten op is one of those ops with other argument names), from
the call's :class:`Call` — its tensor inputs' and outputs' metadata, its other
arguments, and its aten tags. Every rule lists only strategies where each rank running
the very same aten op on its local tensors computes its part of the result, so a
program runs as local aten calls and redistributions, nothing else.

These rules are entries of the one rule table, :class:`RuleSet` (``OpRule.aten``); a
call is looked up there by its op name (``"mm"`` for ``aten.mm.default``), so a rule a
user adds with :meth:`RuleSet.with_rule` serves programs as well as
:func:`~meshplan.strategy.select`. Ops with no rule get ``None``: the program falls
back to full replication for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.placement import Partial, Replicate

from ._rule import DimStrategy, Meta, Placeholder, call_rule, check_strategies

__all__ = ["Call", "aten_strategies", "has_rule", "SIZE_ARGS", "ATEN_RULES", "POINTWISE"]

R = Replicate()
PSUM = Partial("sum")


def _check_target(value: Any) -> None:
    if not isinstance(value, str):
        raise StrategyError(
            f"a Call's target is an op overload's name such as 'aten.mm.default', got "
            f"{value!r:.80}",
            value=value,
        )


def _collection(value: Any, what: str, kind: type) -> Any:
    """``value`` as a ``kind`` (tuple or frozenset); a StrategyError for what is not a
    collection (a string, a non-iterable, or an iterable that refuses iteration, such as
    a 0-d tensor)."""
    error = StrategyError(f"a Call's {what} must be a sequence, got {value!r:.80}", value=value)
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise error
    try:
        return kind(value)
    except TypeError:  # a 0-d tensor, or an unhashable member of a frozenset
        raise error from None


def _keywords(value: Any) -> tuple:
    try:
        return tuple(sorted(dict(value).items()))
    except (TypeError, ValueError) as e:
        raise StrategyError(
            f"a Call's kwargs must be a mapping of argument names, got {value!r:.80}",
            value=value,
        ) from e


@attrs.frozen
class Call:
    """One aten call as a rule sees it: metadata of tensor inputs and outputs, other args.

    ``inputs`` and ``outputs`` hold a :class:`Meta` per tensor (inputs in argument order,
    non-tensor arguments skipped; an output that is not a tensor is None); ``args`` the
    call's arguments by position with tensors replaced by their input index wrapped in
    :class:`TensorArg`; ``tags`` the op's aten tags (``"pointwise"`` …).

    >>> c = Call("aten.mm.default", (Meta((4, 3)), Meta((3, 2))), (Meta((4, 2)),),
    ...          (TensorArg(0), TensorArg(1)), {}, frozenset())
    >>> from meshplan.strategy import RuleSet
    >>> [str(s) for s in aten_strategies(c, RuleSet.default())][:3]
    ['S?(0), R -> S?(0)', 'S?(1), S?(0) -> P(sum)', 'R, S?(1) -> S?(1)']
    """

    target: str = attrs.field(validator=lambda _, a, v: _check_target(v))
    inputs: tuple[Meta, ...] = attrs.field(converter=lambda v: _collection(v, "inputs", tuple))
    outputs: tuple[Meta | None, ...] = attrs.field(
        converter=lambda v: _collection(v, "outputs", tuple)
    )
    args: tuple[Any, ...] = attrs.field(converter=lambda v: _collection(v, "args", tuple))
    kwargs: Any = attrs.field(converter=_keywords)
    tags: frozenset[str] = attrs.field(converter=lambda v: _collection(v, "tags", frozenset))
    names: tuple[str, ...] = attrs.field(
        default=(), converter=lambda v: _collection(v, "names", tuple)
    )

    @property
    def op(self) -> str:
        """The overload packet's name: ``"mm"`` for ``aten.mm.default``."""
        return self.target.split(".")[1]

    def arg(self, i: int, name: str, default: Any = None) -> Any:
        if i < len(self.args):
            return self.args[i]
        return dict(self.kwargs).get(name, default)

    def named_args(self) -> dict[str, Any]:
        """The call's non-tensor arguments by their schema names (what an op-name rule
        takes as keywords).

        >>> c = Call("aten.roll.default", (Meta((4,)),), (Meta((4,)),),
        ...          (TensorArg(0), (1,), (0,)), {}, (), ("self", "shifts", "dims"))
        >>> c.named_args()
        {'shifts': (1,), 'dims': (0,)}
        """
        out = {}
        for i, a in enumerate(self.args):
            if i < len(self.names) and not _holds_tensor(a):
                out[self.names[i]] = a
        for k, v in self.kwargs:
            if not _holds_tensor(v):
                out[k] = v
        return out


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, TensorArg):
        return True
    return isinstance(value, tuple) and any(_holds_tensor(v) for v in value)


@attrs.frozen
class TensorArg:
    """Stands for the ``index``-th tensor input among a call's arguments."""

    index: int


# arguments holding the result's global shape: a rank passes its local shape instead
SIZE_ARGS: dict[str, tuple[int, int | None]] = {
    # op: (argument position, output tensor dim or None for the whole shape)
    "view": (1, None),
    "_unsafe_view": (1, None),
    "reshape": (1, None),
    "expand": (1, None),
    "new_zeros": (1, None),
    "new_ones": (1, None),
    "new_empty": (1, None),
    "new_full": (1, None),
    "full": (0, None),
    "zeros": (0, None),
    "ones": (0, None),
    "empty": (0, None),
    "new_empty_strided": (1, None),
    "empty_strided": (0, None),
    "embedding_dense_backward": (2, 0),
    "slice_backward": (1, None),
    "select_backward": (1, None),
    "unfold_backward": (1, None),
    "diagonal_backward": (1, None),
    "as_strided": (1, None),
}


@functools.cache
def _op_rules() -> dict[str, Any]:
    """The built-in op-name rules: the tables the default :class:`RuleSet` is built from
    (read here, not through a rule set, which is built from this module's rules)."""
    from . import _rules_matrix, _rules_pointwise, _rules_shape

    return _rules_matrix.RULES | _rules_pointwise.RULES | _rules_shape.RULES


def _named(op: str, call: Call, **args: Any) -> list[DimStrategy]:
    """The built-in op-name rule of ``op`` on the call's inputs."""
    return list(_op_rules()[op].strategies(call.inputs, **args))


def _sums_only(strategies: Sequence[DimStrategy]) -> list[DimStrategy]:
    """Programs keep Partial(sum) (what backward passes produce) and drop other ops."""
    out = []
    for s in strategies:
        kinds = {p.op for p in s.entries if isinstance(p, Partial)}
        if kinds <= {"sum"}:
            out.append(s)
    return out


def _norm(d: int, nd: int) -> int:
    return d % nd if nd else 0


# -- pointwise ----------------------------------------------------------------------------


_LINEAR_UNARY = {"neg", "clone", "detach", "alias", "lift_fresh_copy", "_to_copy", "to"}
_KEEPS_SUM_BINARY = {
    # op: the inputs' placements that give a Partial(sum) result (each input Partial(sum)
    # or Replicate)
    "add": ((PSUM, PSUM),),
    "sub": ((PSUM, PSUM),),
    "mul": ((PSUM, R), (R, PSUM)),
    "div": ((PSUM, R),),
}


def _pointwise(call: Call) -> list[DimStrategy]:
    out_meta = call.outputs[0]
    if out_meta is None:
        return []
    nd = out_meta.ndim
    outs: list[DimStrategy] = []
    n_out = sum(1 for m in call.outputs if m is not None)
    for d in range(nd):
        ins = []
        for m in call.inputs:
            k = d - (nd - m.ndim)
            ins.append(Placeholder(k) if k >= 0 and m.shape[k] == out_meta.shape[d] else R)
        if any(isinstance(p, Placeholder) for p in ins):
            outs.append(DimStrategy([Placeholder(d)] * n_out, ins))
    op = call.op
    n = len(call.inputs)
    if n_out != 1:
        return outs
    if op in _LINEAR_UNARY and n == 1:
        outs.append(DimStrategy([PSUM], [PSUM]))
    elif op in _KEEPS_SUM_BINARY and n == 2:
        outs.extend(DimStrategy([PSUM], list(ins)) for ins in _KEEPS_SUM_BINARY[op])
    elif op in ("mul", "div") and n == 1 and _scalar_other(call) or op == "sum" and n == 1:
        outs.append(DimStrategy([PSUM], [PSUM]))
    return outs


def _scalar_other(call: Call) -> bool:
    other = call.arg(1, "other")
    return isinstance(other, int | float) and not isinstance(other, bool)


# -- shape ops ------------------------------------------------------------------------------


def _view(call: Call) -> list[DimStrategy]:
    shape = call.outputs[0].shape
    return _sums_only(_named("view", call, shape=tuple(shape)))


def _transpose(call: Call) -> list[DimStrategy]:
    nd = call.inputs[0].ndim
    if call.op == "t":
        if nd < 2:
            return _identity(call)
        d0, d1 = 0, 1
    else:
        d0, d1 = _norm(call.arg(1, "dim0"), nd), _norm(call.arg(2, "dim1"), nd)
    perm = list(range(nd))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permutation(perm)


def _permute(call: Call) -> list[DimStrategy]:
    nd = call.inputs[0].ndim
    return _permutation([_norm(d, nd) for d in call.arg(1, "dims")])


def _permutation(perm: Sequence[int]) -> list[DimStrategy]:
    out = [DimStrategy([Placeholder(o)], [Placeholder(i)]) for o, i in enumerate(perm)]
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _identity(call: Call) -> list[DimStrategy]:
    nd = call.inputs[0].ndim
    out = [DimStrategy([Placeholder(d)], [Placeholder(d)]) for d in range(nd)]
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _unsqueeze(call: Call) -> list[DimStrategy]:
    nd = call.inputs[0].ndim
    at = _norm(call.arg(1, "dim"), nd + 1)
    out = []
    for d in range(nd):
        out.append(DimStrategy([Placeholder(d if d < at else d + 1)], [Placeholder(d)]))
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _squeeze(call: Call) -> list[DimStrategy]:
    src, dst = call.inputs[0].shape, call.outputs[0].shape
    # map every kept input dim to its output dim (squeezed dims have size 1)
    dims = call.arg(1, "dim")
    if dims is None:
        gone = {d for d, n in enumerate(src) if n == 1}
    else:
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        gone = {_norm(d, len(src)) for d in dims if src[_norm(d, len(src))] == 1}
    out, o = [], 0
    for d in range(len(src)):
        if d in gone:
            continue
        out.append(DimStrategy([Placeholder(o)], [Placeholder(d)]))
        o += 1
    assert o == len(dst) or not dst
    out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _expand(call: Call) -> list[DimStrategy]:
    src, dst = call.inputs[0].shape, call.outputs[0].shape
    lead = len(dst) - len(src)
    out = []
    for d, n in enumerate(src):
        if n == dst[lead + d]:
            out.append(DimStrategy([Placeholder(lead + d)], [Placeholder(d)]))
    return out


# -- reductions ----------------------------------------------------------------------------


def _reduce_dims(call: Call) -> tuple[set[int], bool]:
    nd = call.inputs[0].ndim
    if call.target.endswith(".default") and call.op == "sum":
        return set(range(nd)), False
    dims = call.arg(1, "dim")
    keep = bool(call.arg(2, "keepdim", False))
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return set(range(nd)), keep
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return {_norm(d, nd) for d in dims}, keep


def _reduction(call: Call) -> list[DimStrategy]:
    nd = call.inputs[0].ndim
    gone, keep = _reduce_dims(call)
    out, o = [], 0
    linear = call.op == "sum"
    for d in range(nd):
        if d in gone:
            if linear:
                out.append(DimStrategy([PSUM], [Placeholder(d)]))
            if keep:
                o += 1
            continue
        out.append(DimStrategy([Placeholder(o)], [Placeholder(d)]))
        o += 1
    if linear:
        out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _along(call: Call, dim: int, n_in: int | None = None) -> list[DimStrategy]:
    """Shard any dim but ``dim`` on every tensor input and output alike (same ndim)."""
    nd = call.outputs[0].ndim
    dim = _norm(dim, nd)
    n_out = sum(1 for m in call.outputs if m is not None)
    n_in = len(call.inputs) if n_in is None else n_in
    return [
        DimStrategy([Placeholder(d)] * n_out, [Placeholder(d)] * n_in)
        for d in range(nd)
        if d != dim
    ]


def _softmax(call: Call) -> list[DimStrategy]:
    return _along(call, call.arg(1, "dim"))


def _softmax_backward(call: Call) -> list[DimStrategy]:
    return _along(call, call.arg(2, "dim"))


def _gather(call: Call) -> list[DimStrategy]:
    # gather(self, dim, index) / scatter(self, dim, index, value|src): other dims alike,
    # where index spans self's size there
    x, idx = call.inputs[0], call.inputs[1]
    dim = _norm(call.arg(1, "dim"), x.ndim)
    out = []
    for d in range(x.ndim):
        if d == dim or idx.shape[d] != x.shape[d]:
            continue
        out.append(DimStrategy([Placeholder(d)], [Placeholder(d)] * len(call.inputs)))
    return out


# -- matrix products, embedding, normalization, attention ---------------------------------


def _mm(call: Call) -> list[DimStrategy]:
    return _sums_only(_named(call.op, call))


def _addmm(call: Call) -> list[DimStrategy]:
    return _sums_only(
        _named("addmm", call, beta=call.arg(3, "beta", 1), alpha=call.arg(4, "alpha", 1))
    )


def _embedding(call: Call) -> list[DimStrategy]:
    # aten.embedding(weight, indices); the named rule reads (indices, weight)
    swapped = Call(call.target, (call.inputs[1], call.inputs[0]), call.outputs, (), {}, call.tags)
    out = []
    for s in _sums_only(_named("embedding", swapped)):
        if any(isinstance(p, Partial) for p in s.inputs):
            continue  # partial weights: a sum of lookups, kept out of programs for clarity
        out.append(DimStrategy(s.outputs, (s.inputs[1], s.inputs[0])))
    return out


def _embedding_backward(call: Call) -> list[DimStrategy]:
    grad, idx = call.inputs
    out = [DimStrategy([PSUM], [Placeholder(d), Placeholder(d)]) for d in range(idx.ndim)]
    out.append(DimStrategy([Placeholder(1)], [Placeholder(grad.ndim - 1), R]))
    out.append(DimStrategy([PSUM], [PSUM, R]))
    return out


def _layer_norm(call: Call) -> list[DimStrategy]:
    x = call.inputs[0]
    k = len(call.arg(1, "normalized_shape"))
    n_out = len(call.outputs)
    rest = [R] * (len(call.inputs) - 1)
    return [
        DimStrategy([Placeholder(d)] * n_out, [Placeholder(d)] + rest) for d in range(x.ndim - k)
    ]


def _layer_norm_backward(call: Call) -> list[DimStrategy]:
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    x = call.inputs[1]
    k = len(call.arg(2, "normalized_shape"))
    outs = []
    for d in range(x.ndim - k):
        o = [Placeholder(d) if j == 0 else PSUM for j in range(len(call.outputs))]
        ins = [Placeholder(d)] * 4 + [R] * (len(call.inputs) - 4)
        outs.append(DimStrategy(o, ins))
    return outs


def _sdpa(call: Call) -> list[DimStrategy]:
    # q, k, v (and an optional mask broadcast over batch/heads) sharded on batch or heads;
    # every rank's piece non-empty (torch's CPU kernels fault on an empty batch or head).
    # Grouped-query attention (k, v with fewer heads than q): q heads h read kv head
    # h // (H / KV), so heads are sharded only evenly on q, k, v and their gradients
    # alike, each rank's q heads then reading its own kv heads
    n_out = len(call.outputs)
    heads = call.inputs[0].shape[1] if call.inputs[0].ndim >= 3 else None
    kv = {m.shape[1] for m in call.inputs if m.ndim == 4} - {heads, 1}
    sizes = {heads} | kv
    out = []
    for d in (0, 1):
        gqa = d == 1 and bool(kv)
        shard = Placeholder(d, nonempty=True, even=gqa)
        ins = []
        for m in call.inputs:
            # q, k, v, out and their gradients are (B, H, T, E); logsumexp is (B, H, T)
            if gqa:
                lead = m.ndim >= 3 and m.shape[1] in sizes
            else:
                lead = m.ndim >= 3 and m.shape[d] == call.inputs[0].shape[d]
            ins.append(shard if lead else R)
        o = []
        for m in call.outputs:
            lead = m is not None and m.ndim >= 2 and (not gqa or m.shape[1] in sizes)
            o.append(shard if lead else R)
        out.append(DimStrategy(o[:n_out], ins))
    return out


def _like(call: Call) -> list[DimStrategy]:
    # ones_like / zeros_like / full_like / empty_like: the input's shards, never its sums
    nd = call.inputs[0].ndim
    out = [DimStrategy([Placeholder(d)], [Placeholder(d)]) for d in range(nd)]
    out.append(DimStrategy([R], [PSUM]))
    return out


def _factory(call: Call) -> list[DimStrategy]:
    # scalar_tensor, full, zeros, ones, empty: any shard of the result (its local shape)
    m = call.outputs[0]
    if call.op == "scalar_tensor":
        return []
    return [DimStrategy([Placeholder(d)], []) for d in range(m.ndim)]


ATEN_RULES: dict[str, Callable[[Call], list[DimStrategy]]] = {
    "mm": _mm,
    "bmm": _mm,
    "addmm": _addmm,
    "t": _transpose,
    "transpose": _transpose,
    "permute": _permute,
    "view": _view,
    "_unsafe_view": _view,
    "reshape": _view,
    "unsqueeze": _unsqueeze,
    "squeeze": _squeeze,
    "expand": _expand,
    "clone": _identity,
    "detach": _identity,
    "alias": _identity,
    "lift_fresh_copy": _identity,
    "contiguous": _identity,
    "sum": _reduction,
    "mean": _reduction,
    "amax": _reduction,
    "amin": _reduction,
    "_softmax": _softmax,
    "_log_softmax": _softmax,
    "_softmax_backward_data": _softmax_backward,
    "_log_softmax_backward_data": _softmax_backward,
    "gather": _gather,
    "scatter": _gather,
    "embedding": _embedding,
    "embedding_dense_backward": _embedding_backward,
    "native_layer_norm": _layer_norm,
    "native_layer_norm_backward": _layer_norm_backward,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa,
    "_scaled_dot_product_efficient_attention": _sdpa,
    "_scaled_dot_product_efficient_attention_backward": _sdpa,
    "_scaled_dot_product_flash_attention": _sdpa,
    "_scaled_dot_product_flash_attention_backward": _sdpa,
    "ones_like": _like,
    "zeros_like": _like,
    "empty_like": _like,
    "full_like": _like,
    "_to_copy": _pointwise,
    "scalar_tensor": _factory,
    "full": _factory,
    "zeros": _factory,
    "ones": _factory,
    "empty": _factory,
}


POINTWISE = _pointwise
"""The rule of every op torch tags ``pointwise`` (broadcasting, Partial(sum) where linear)."""


def _entry(call: Call, ruleset: Any) -> Any:
    return ruleset.rules.get(call.op)


def has_rule(call: Call, ruleset: Any) -> bool:
    """Whether ``call`` has a rule in ``ruleset`` (a :class:`RuleSet`), its own or the
    generic one of pointwise ops."""
    return _entry(call, ruleset) is not None or "pointwise" in call.tags


def aten_strategies(call: Call, ruleset: Any) -> list[DimStrategy] | None:
    """The call's strategies on one mesh dim (full replication not included); None: no rule.

    The rule is ``ruleset``'s entry for the call's op name (a :class:`RuleSet`, e.g.
    ``RuleSet.default()``): its ``aten`` reading of the call where it has one, else its
    op-name rule called with the call's tensor metadata and its other arguments by
    schema name; an op without an entry that torch tags pointwise gets the pointwise rule.
    """
    entry = _entry(call, ruleset)
    if entry is None:
        return _pointwise(call) if "pointwise" in call.tags else None
    op = call.target
    if entry.aten is not None:
        value = call_rule(op, "aten rule", entry.aten, call)
    else:
        value = call_rule(op, "rule", entry.strategies, call.inputs, **call.named_args())
    outputs = [None if m is None else m.ndim for m in call.outputs]
    checked = check_strategies(op, value, outputs, [m.ndim for m in call.inputs])
    return [s for s in checked if _sums_in_one_dtype(call, s)]


def _is_sum(p: Any) -> bool:
    return isinstance(p, Partial) and p.op in ("sum", "avg")


def _sums_in_one_dtype(call: Call, strategy: DimStrategy) -> bool:
    """Whether every Partial(sum) output of ``strategy`` keeps the dtype of its Partial(sum)
    inputs.

    Parts rounded to another dtype do not sum to the rounded sum (a float64 sum cast to
    float32 part by part is off by float32's rounding of each part, worse under
    cancellation; a cast to an integer truncates each part): a cast, or an op promoting a
    Partial input to a wider dtype, takes its Partial input summed, as one process does.
    """
    ins = {m.dtype for m, p in zip(call.inputs, strategy.inputs, strict=False) if _is_sum(p)}
    if not ins:
        return True
    return all(
        m is None or not _is_sum(p) or {m.dtype} == ins
        for m, p in zip(call.outputs, strategy.outputs, strict=False)
    )

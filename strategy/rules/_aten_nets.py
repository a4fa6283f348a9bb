"""Single-mesh-dim rules for the aten ops of the model families beyond a plain decoder (no torch).

Vision and state-space models convolve (``convolution`` and its backward: conv1d/2d,
ViT's patch embedding, ResNet, Mamba's depthwise conv1d), pool
(``max_pool2d_with_indices``) and normalize by batch (``native_batch_norm``); ALiBi
attention adds its bias with ``baddbmm`` and tiles it with ``repeat``; mixture-of-experts
routing picks experts with ``topk``; Mamba's step size goes through ``softplus``. Like
every aten rule, each strategy is one where every rank runs the same aten op on its local
tensors.

A convolution is a contraction: its batch dim shards the input and the output alike; with
one group, its output channels shard the weight's and the output's, and its input channels
the input's and the weight's, leaving a partial sum (the bias then partial too, or it
would be added once per rank). Grouped convolutions (Mamba's depthwise one) shard only
the batch: a rank's channels would need its own ``groups``. Spatial dims stay whole (a
kernel reads across a shard's edge).
"""

from __future__ import annotations

from collections.abc import Callable

from meshplan.placement import Partial, Replicate

from ._aten import Call, _along, _pointwise, _sums_only
from ._rule import DimStrategy, Placeholder
from ._rules_matrix import _with_bias, einsum_strategies

__all__ = ["RULES"]

R = Replicate()
PSUM = Partial("sum")


def _ne(d: int) -> Placeholder:
    return Placeholder(d, nonempty=True)


def _convolution(call: Call) -> list[DimStrategy]:
    # convolution(input, weight, bias?, stride, padding, dilation, transposed,
    # output_padding, groups)
    x, w = call.inputs[0], call.inputs[1]
    bias = len(call.inputs) == 3
    c = x.ndim - w.ndim + 1  # the channel dim (1 batched, 0 unbatched)
    transposed = bool(call.arg(6, "transposed", False))
    w_out, w_in = (1, 0) if transposed else (0, 1)

    def s(o, xp, wp, bp) -> DimStrategy:
        return DimStrategy([o], [xp, wp] + ([bp] if bias else []))

    out = []
    if c == 1:
        out.append(s(_ne(0), _ne(0), R, R))
    if call.arg(8, "groups", 1) == 1:
        out.append(s(_ne(c), R, _ne(w_out), _ne(0)))
        out.append(s(PSUM, _ne(c), _ne(w_in), PSUM))
    out.append(s(PSUM, PSUM, R, PSUM))
    out.append(s(PSUM, R, PSUM, PSUM))
    return out


def _convolution_backward(call: Call) -> list[DimStrategy]:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    # dilation, transposed, output_padding, groups, output_mask) -> (grad_input,
    # grad_weight, grad_bias); bias_sizes only shapes the traced result (the kernel sums)
    g, w = call.inputs[0], call.inputs[2]
    c = g.ndim - w.ndim + 1
    transposed = bool(call.arg(7, "transposed", False))
    w_out, w_in = (1, 0) if transposed else (0, 1)
    out = []
    if c == 1:
        out.append(DimStrategy([_ne(0), PSUM, PSUM], [_ne(0), _ne(0), R]))
    if call.arg(9, "groups", 1) == 1:
        out.append(DimStrategy([PSUM, _ne(w_out), _ne(0)], [_ne(c), R, _ne(w_out)]))
        out.append(DimStrategy([_ne(c), _ne(w_in), R], [R, _ne(c), _ne(w_in)]))
    out.append(DimStrategy([PSUM, PSUM, PSUM], [PSUM, R, R]))  # linear in grad_output
    out.append(DimStrategy([R, PSUM, R], [R, PSUM, R]))  # grad_weight linear in input
    out.append(DimStrategy([PSUM, R, R], [R, R, PSUM]))  # grad_input linear in weight
    return out


def _baddbmm(call: Call) -> list[DimStrategy]:
    # baddbmm(self, batch1, batch2, beta=1, alpha=1): beta * self + alpha * (b1 @ b2), the
    # bias broadcast to the product as addmm's
    bias, b1, b2 = call.inputs
    shape = (b1.shape[0], b1.shape[1], b2.shape[2])
    pairs = einsum_strategies(("bmk", "bkn"), "bmn", True)
    return _sums_only(_with_bias(pairs, 2, shape, bias, True, False))


def _repeat(call: Call) -> list[DimStrategy]:
    # repeat(self, repeats): dim d tiled r times; a rank's tile of its shard is its part of
    # the strided shard that splits the result into the r copies
    x, m = call.inputs[0], call.outputs[0]
    reps = tuple(call.arg(1, "repeats"))
    lead = len(reps) - x.ndim
    out = []
    for d in range(x.ndim):
        r = reps[lead + d]
        if r >= 1:
            out.append(DimStrategy([Placeholder(lead + d, split=r)], [Placeholder(d)]))
    if m.ndim and all(r >= 1 for r in reps):
        out.append(DimStrategy([PSUM], [PSUM]))
    return out


def _topk(call: Call) -> list[DimStrategy]:
    # topk(self, k, dim=-1, largest=True, sorted=True) -> (values, indices): other dims
    x = call.inputs[0]
    if x.ndim == 0:
        return []
    return _along(call, call.arg(2, "dim", -1))


def _softplus_backward(call: Call) -> list[DimStrategy]:
    # softplus_backward(grad_output, self, beta, threshold): pointwise, linear in the grad
    out = _pointwise(call)
    if len(call.inputs) == 2:
        out.append(DimStrategy([PSUM], [PSUM, R]))
    return out


def _max_pool(call: Call) -> list[DimStrategy]:
    # max_pool2d_with_indices(self, kernel, stride, padding, dilation, ceil_mode) ->
    # (out, indices): batch and channels; the indices count within a plane
    x = call.inputs[0]
    n_out = sum(1 for m in call.outputs if m is not None)
    return [DimStrategy([_ne(d)] * n_out, [_ne(d)]) for d in range(x.ndim - 2)]


def _max_pool_backward(call: Call) -> list[DimStrategy]:
    # max_pool2d_with_indices_backward(grad_output, self, kernel, stride, padding,
    # dilation, ceil_mode, indices): batch and channels alike; linear in the grad
    x = call.inputs[1]
    out = [DimStrategy([_ne(d)], [_ne(d)] * 3) for d in range(x.ndim - 2)]
    out.append(DimStrategy([PSUM], [PSUM, R, R]))
    return out


def _training(call: Call) -> bool:
    if call.op == "_native_batch_norm_legit_no_training":
        return False
    no_stats = call.target.endswith(".no_stats")
    return bool(call.arg(3 if no_stats else 5, "training", True))


def _batch_norm(call: Call) -> list[DimStrategy]:
    """Channels (dim 1) sharded on the input, the output, and every per-channel tensor
    (weight, bias, running statistics, the saved mean and inverse std) alike; out of
    training (statistics given, not computed) also the batch, every sample alone.

    ``native_batch_norm`` and ``_native_batch_norm_legit`` in training with running
    statistics write them in place, which a moved (sliced) buffer would lose: they are
    left whole until the write is a program output (the functional form's outputs)."""
    x = call.inputs[0]
    training = _training(call)
    writes = call.op in ("native_batch_norm", "_native_batch_norm_legit")
    stats = not call.target.endswith(".no_stats") and call.arg(3, "running_mean") is not None
    if x.ndim < 2 or (training and writes and stats):
        return []
    n_in = len(call.inputs)

    def per_channel(m) -> Placeholder | Replicate:
        return R if m is None or m.shape == (0,) else _ne(0)

    outs = [_ne(1)] + [per_channel(m) for m in call.outputs[1:]]
    out = [DimStrategy(outs, [_ne(1)] + [_ne(0)] * (n_in - 1))]
    if not training:
        out.append(DimStrategy([_ne(0)] + [R] * (len(outs) - 1), [_ne(0)] + [R] * (n_in - 1)))
    return out


def _native_batch_norm_backward(call: Call) -> list[DimStrategy]:
    # native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?,
    # save_mean?, save_invstd?, train, eps, output_mask) -> (grad_input, grad_weight,
    # grad_bias): per channel
    x = call.inputs[1]
    if x.ndim < 2:
        return []
    ins = [_ne(1), _ne(1)] + [_ne(0)] * (len(call.inputs) - 2)
    return [DimStrategy([_ne(1), _ne(0), _ne(0)], ins)]


def _var_mean(call: Call) -> list[DimStrategy]:
    # var_mean.correction(self, dim=None, *, correction=None, keepdim=False) -> (var,
    # mean), and var: the dims kept (what batch norm in training decomposes to)
    x = call.inputs[0]
    dims = call.arg(1, "dim")
    keep = bool(dict(call.kwargs).get("keepdim", call.arg(3, "keepdim", False)))
    if dims is None or (isinstance(dims, list | tuple) and not dims):
        gone = set(range(x.ndim))
    else:
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        gone = {d % x.ndim for d in dims}
    n_out = sum(1 for m in call.outputs if m is not None)
    out, o = [], 0
    for d in range(x.ndim):
        if d in gone:
            o += keep
            continue
        out.append(DimStrategy([Placeholder(o)] * n_out, [Placeholder(d)]))
        o += 1
    return out


RULES: dict[str, Callable[[Call], list[DimStrategy]]] = {
    "convolution": _convolution,
    "convolution_backward": _convolution_backward,
    "baddbmm": _baddbmm,
    "repeat": _repeat,
    "topk": _topk,
    "softplus_backward": _softplus_backward,
    "max_pool2d_with_indices": _max_pool,
    "max_pool2d_with_indices_backward": _max_pool_backward,
    "native_batch_norm": _batch_norm,
    "_native_batch_norm_legit_functional": _batch_norm,
    "_native_batch_norm_legit": _batch_norm,
    "_native_batch_norm_legit_no_training": _batch_norm,
    "native_batch_norm_backward": _native_batch_norm_backward,
    "var_mean": _var_mean,
    "var": _var_mean,
}

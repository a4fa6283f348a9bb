"""Torch implementations of the built-in ops, run on global tensors or on one rank's shards.

The same function serves as the unsharded reference (the rule checker's oracle) and
as the local kernel every rank runs under a strategy; only ``view``/``reshape`` need to
know the rank, as their ``shape`` argument is global.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from meshplan.errors import StrategyError
from meshplan.placement import Spec, local_shape

from ._rule import Meta

__all__ = ["OPS", "run_op", "run_local", "random_inputs"]


def _dims(x: torch.Tensor, dim: Any) -> tuple[int, ...]:
    dims = (dim,) if isinstance(dim, int) else tuple(dim or ())
    return dims or tuple(range(x.ndim))  # None or (): every dim, as in torch


def _reduce(fn: Callable) -> Callable:
    def run(x: torch.Tensor, dim: Any = None, keepdim: bool = False) -> torch.Tensor:
        dims = _dims(x, dim)
        if not dims:  # a 0-d tensor: nothing to reduce
            return fn(x.reshape(1), dim=0)
        return fn(x, dim=dims, keepdim=keepdim)

    return run


def _binary(fn: Callable) -> Callable:
    def run(*ts: torch.Tensor, other: Any = None) -> torch.Tensor:
        if other is not None:
            return fn(ts[0], other)
        return fn(ts[0], ts[1])

    return run


OPS: dict[str, Callable[..., torch.Tensor]] = {
    "mm": torch.mm,
    "bmm": torch.bmm,
    "addmm": torch.addmm,
    "linear": F.linear,
    "einsum": lambda *ts, equation: torch.einsum(equation, *ts),
    "embedding": F.embedding,
    "neg": torch.neg,
    "clone": torch.clone,
    "exp": torch.exp,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "abs": torch.abs,
    "sin": torch.sin,
    "cos": torch.cos,
    "square": torch.square,
    "gelu": F.gelu,
    "silu": F.silu,
    "add": _binary(torch.add),
    "sub": _binary(torch.sub),
    "mul": _binary(torch.mul),
    "div": _binary(torch.div),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "sum": _reduce(torch.sum),
    "mean": _reduce(torch.mean),
    "amax": _reduce(torch.amax),
    "amin": _reduce(torch.amin),
    "softmax": lambda x, dim: torch.softmax(x, dim),
    "log_softmax": lambda x, dim: torch.log_softmax(x, dim),
    "cat": lambda *ts, dim=0: torch.cat(ts, dim),
    "stack": lambda *ts, dim=0: torch.stack(ts, dim),
    "transpose": lambda x, dim0, dim1: x.transpose(dim0, dim1).contiguous(),
    "permute": lambda x, dims: x.permute(
        tuple(dims) if isinstance(dims, list | tuple) else (dims,)
    ).contiguous(),
    "view": lambda x, shape: x.reshape(shape),
    "reshape": lambda x, shape: x.reshape(shape),
}


def _impl(op: str, ops: dict[str, Callable] | None) -> Callable:
    table = OPS if ops is None else {**OPS, **ops}
    try:
        return table[op]
    except KeyError:
        raise StrategyError(
            f"no torch implementation for op {op!r}; pass one (a function of the tensors and "
            "the op's keyword arguments)",
            value=op,
        ) from None


def run_op(
    op: str, tensors: Sequence[torch.Tensor], args: dict[str, Any], impl: Callable | None = None
) -> Any:
    """Run ``op`` on (global) tensors."""
    fn = impl or _impl(op, None)
    return fn(*tensors, **args)


def run_local(
    op: str,
    tensors: Sequence[torch.Tensor],
    args: dict[str, Any],
    output_specs: Sequence[Spec],
    rank: int,
    impl: Callable | None = None,
) -> Any:
    """Run ``op`` on one rank's local tensors (global shape arguments made local)."""
    if op in ("view", "reshape") and impl is None:
        args = {**args, "shape": local_shape(output_specs[0], rank)}
    return run_op(op, tensors, args, impl)


_TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def random_inputs(op: str, metas: Sequence[Meta], gen: torch.Generator) -> list[torch.Tensor]:
    """Random global inputs for ``op`` (embedding indices stay within the weight's rows)."""
    out = []
    for i, m in enumerate(metas):
        dtype = torch_dtype(m.dtype)
        if dtype.is_floating_point or dtype.is_complex:
            out.append(torch.randn(m.shape, generator=gen, dtype=dtype))
        else:
            hi = metas[1].shape[0] if op == "embedding" and i == 0 else 7
            lo = 0 if op == "embedding" else -3
            out.append(torch.randint(lo, max(hi, lo + 1), m.shape, generator=gen, dtype=dtype))
    return out

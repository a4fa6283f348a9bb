"""Torch implementations of the built-in ops, run on global tensors or on one rank's shards.

The same function serves as the unsharded reference (the rule checker's oracle) and
as the local kernel every rank runs under a strategy; only ``view``/``reshape`` need to
know the rank, as their ``shape`` argument is global.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from meshplan.errors import StrategyError
from meshplan.placement import Spec, local_shape

from ..rules._args import as_int
from ..rules._rule import Meta
from ._problem import check_op

__all__ = ["OPS", "run_op", "run_local", "random_inputs"]


def _dims(x: torch.Tensor, dim: Any) -> tuple[int, ...]:
    dims = (as_int(dim),) if as_int(dim) is not None else tuple(dim or ())
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


def _check_call(
    op: str, tensors: Sequence[torch.Tensor], args: Mapping[str, Any], impl: Callable | None
) -> tuple[torch.Tensor, ...]:
    check_op(op)
    if isinstance(tensors, torch.Tensor | str | Mapping) or not isinstance(tensors, Sequence):
        raise StrategyError(
            f"{op}: tensors must be a sequence of torch.Tensor inputs, got {tensors!r}",
            value=tensors,
        )
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise StrategyError(f"{op}: input {t!r} is not a torch.Tensor", value=t)
    if not isinstance(args, Mapping):
        raise StrategyError(
            f"{op}: args must be a mapping of the op's keyword arguments, got {args!r}",
            value=args,
        )
    if impl is not None and not callable(impl):
        raise StrategyError(
            f"{op}: impl must be a function of the tensors and the op's keyword arguments, got "
            f"{impl!r}",
            value=impl,
        )
    return tuple(tensors)


def run_op(
    op: str, tensors: Sequence[torch.Tensor], args: dict[str, Any], impl: Callable | None = None
) -> Any:
    """Run ``op`` on (global) tensors.

    >>> run_op("add", [torch.ones(2)], {"other": 2}).tolist()
    [3.0, 3.0]
    """
    tensors = _check_call(op, tensors, args, impl)
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
    """Run ``op`` on one rank's local tensors (global shape arguments made local).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> out = Spec(Mesh.create(2), (Shard(0),), (24,))
    >>> run_local("view", [torch.ones(1, 3, 4)], {"shape": (24,)}, [out], 1).shape
    torch.Size([12])
    """
    tensors = _check_call(op, tensors, args, impl)
    if isinstance(output_specs, Spec | str) or not isinstance(output_specs, Sequence):
        raise StrategyError(
            f"{op}: output_specs must be a sequence of the outputs' Specs, got {output_specs!r}",
            value=output_specs,
        )
    for s in output_specs:
        if not isinstance(s, Spec):
            raise StrategyError(f"{op}: output spec {s!r} is not a Spec", value=s)
    if op in ("view", "reshape") and impl is None:
        if not output_specs:
            raise StrategyError(
                f"{op}: give the output's Spec in output_specs; its global shape= is made "
                "local with it",
                value=output_specs,
            )
        r = as_int(rank)
        if r is None or not output_specs[0].mesh.contains(r):
            raise StrategyError(
                f"{op}: rank {rank!r} is not in the mesh of {output_specs[0]}; pass one of its "
                "ranks",
                value=rank,
            )
        args = {**args, "shape": local_shape(output_specs[0], r)}
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
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
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
        if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # randn has no float8 kernel
            out.append(torch.randn(m.shape, generator=gen).to(dtype))
        elif dtype.is_floating_point or dtype.is_complex:
            out.append(torch.randn(m.shape, generator=gen, dtype=dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, m.shape, generator=gen).bool())
        else:
            hi = metas[1].shape[0] if op == "embedding" and i == 0 else 7
            lo = 0 if op == "embedding" or dtype == torch.uint8 else -3
            out.append(torch.randint(lo, max(hi, lo + 1), m.shape, generator=gen, dtype=dtype))
    return out

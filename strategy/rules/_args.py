"""Argument checks shared by the built-in rules (they raise :class:`StrategyError`)."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any

from meshplan.errors import StrategyError
from meshplan.layout._ints import as_int

if TYPE_CHECKING:
    from ._rule import Meta

__all__ = [
    "as_int",
    "is_real",
    "check_count",
    "norm_dim",
    "norm_dims",
    "is_float",
    "broadcast_shapes",
    "LINEAR",
    "ALL",
]

LINEAR = ("sum", "avg")  # reductions a linear op commutes with
ALL = ("sum", "avg", "max", "min")  # reductions a pure selection/rearrangement commutes with


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (ints, floats, numpy scalars), not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def check_count(op: str, inputs: Sequence[Meta], lo: int, hi: int | None = None) -> None:
    """Raise unless ``lo <= len(inputs) <= hi`` (``hi=None``: exactly ``lo``)."""
    hi = lo if hi is None else hi
    if not lo <= len(inputs) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise StrategyError(
            f"{op} takes {want} tensor inputs, got {len(inputs)}: {list(inputs)!r}", value=inputs
        )


def norm_dim(op: str, dim: Any, ndim: int, *, extra: int = 0) -> int:
    """``dim`` in ``[0, ndim + extra)`` (negative dims count from the end)."""
    size = ndim + extra
    i = as_int(dim)
    if i is None or not -max(size, 1) <= i < max(size, 1):
        raise StrategyError(
            f"{op}: dim {dim!r} is out of range for a {ndim}-D tensor; use an int in "
            f"[{-max(size, 1)}, {max(size, 1)})",
            value=dim,
        )
    return i % max(size, 1)


def norm_dims(op: str, dim: Any, ndim: int) -> tuple[int, ...]:
    """The reduced dims: an int or a sequence of ints; ``None`` or an empty sequence
    means every dim (as in torch)."""
    if dim is None:
        return tuple(range(ndim))
    if as_int(dim) is not None:
        dims: tuple = (dim,)
    elif isinstance(dim, list | tuple | range):
        dims = tuple(dim)
    else:
        raise StrategyError(f"{op}: dim {dim!r} is not an int or a sequence of ints", value=dim)
    if not dims:
        return tuple(range(ndim))
    out = tuple(sorted({norm_dim(op, d, ndim) for d in dims}))
    if len(out) != len(dims):
        raise StrategyError(f"{op}: dim {dim!r} repeats a dim", value=dim)
    return out


def is_float(meta: Meta) -> bool:
    return meta.dtype.startswith(("float", "bfloat", "complex"))


def broadcast_shapes(op: str, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The broadcast result shape (numpy rules)."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        sizes = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise StrategyError(
                f"{op}: shapes {list(shapes)!r} do not broadcast (dim {i} has sizes "
                f"{sorted(sizes)!r})",
                value=shapes,
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)

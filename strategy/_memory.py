"""What a program's training state costs in memory per rank (pure arithmetic, no torch).

Each differentiated argument (a parameter) holds, on every rank, its local shard, its
gradient's local shard (the gradient lies as the parameter does: :func:`grad_spec`)
and the optimizer's state for it: ``state_bytes_per_param`` bytes per local element
(default: two moments in the parameter's dtype, what AdamW keeps). Arguments without
a gradient (token ids, masks, tables) are inputs, not training state, and count
nothing.

A rank's bytes are counted as the sum of each tensor's largest local size over the
mesh: every rank holds at most that much (an uneven shard's short ranks hold less), so
a budget met this way is met on every rank. The count is separable (a sum over
tensors), which is what lets the auto-sharding solver price memory per argument.
"""

from __future__ import annotations

import sys

import attrs

from meshplan.errors import StrategyError
from meshplan.layout._ints import brief
from meshplan.placement import Spec, dtype_itemsize

from ._candidates import local_numel

__all__ = [
    "ProgramMemory",
    "state_bytes",
    "program_memory",
    "check_state_bytes_per_param",
    "as_float",
]


@attrs.frozen
class ProgramMemory:
    """Bytes per rank of a program's training state: ``params``, ``grads``, ``optimizer``.

    ``total`` is their sum, the quantity a ``memory_budget`` bounds; ``per_arg`` each
    argument's share (0 for arguments without a gradient).

    >>> ProgramMemory(params=8.0, grads=8.0, optimizer=16.0, per_arg=(32.0,)).total
    32.0
    """

    params: float
    grads: float
    optimizer: float
    per_arg: tuple[float, ...] = ()

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer

    def __str__(self) -> str:
        return (
            f"{self.total / 1e3:.1f} kB per rank (params {self.params / 1e3:.1f}, grads "
            f"{self.grads / 1e3:.1f}, optimizer {self.optimizer / 1e3:.1f})"
        )


def as_float(value) -> float | None:
    """``value`` as a float if it is an int or float (never a bool) a float can hold,
    else None (an int beyond a float's range too).

    >>> as_float(3), as_float(10**400), as_float(True)
    (3.0, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def check_state_bytes_per_param(value) -> float | None:
    """``value`` as a float if it is None or a number >= 0 a float can hold; raise a
    StrategyError naming it and the range otherwise."""
    if value is None:
        return None
    number = as_float(value)
    if number is None or not number >= 0:
        raise StrategyError(
            f"state_bytes_per_param={brief(value)} must be a number of bytes >= 0 and <= "
            f"{sys.float_info.max:.2g} per parameter element (None: two moments in the "
            "parameter's dtype, as AdamW keeps)",
            value=value,
        )
    return number


def _parts(spec: Spec, state_bytes_per_param: float | None) -> tuple[float, float, float]:
    n = local_numel(spec)
    item = dtype_itemsize(spec.dtype)
    state = 2.0 * item if state_bytes_per_param is None else state_bytes_per_param
    return float(n * item), float(n * item), float(n * state)


def state_bytes(spec: Spec, differentiated: bool, state_bytes_per_param: float | None) -> float:
    """Bytes per rank one argument's training state takes in ``spec`` (0 without a gradient).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((4,))
    >>> state_bytes(Spec(mesh, [Shard(0)], (8, 2), "float32"), True, None)  # 4 elems x 16 B
    64.0
    >>> state_bytes(Spec(mesh, [Replicate()], (8, 2), "float32"), True, None)
    256.0
    """
    if not isinstance(spec, Spec):
        raise StrategyError(
            f"state_bytes takes the argument's Spec, got {spec!r:.80}; e.g. "
            "state_bytes(Spec(mesh, [Shard(0)], shape, dtype), True, None)",
            value=spec,
        )
    if not differentiated:
        return 0.0
    return sum(_parts(spec, check_state_bytes_per_param(state_bytes_per_param)))


def program_memory(
    arg_specs, differentiated, state_bytes_per_param: float | None
) -> ProgramMemory:
    """The :class:`ProgramMemory` of arguments in ``arg_specs`` (``differentiated[i]``:
    whether argument ``i`` has a gradient)."""
    params = grads = optimizer = 0.0
    per_arg = []
    for spec, d in zip(arg_specs, differentiated, strict=True):
        if not d:
            per_arg.append(0.0)
            continue
        p, g, o = _parts(spec, state_bytes_per_param)
        params, grads, optimizer = params + p, grads + g, optimizer + o
        per_arg.append(p + g + o)
    return ProgramMemory(params, grads, optimizer, tuple(per_arg))

"""Placement values: how one mesh dim distributes a tensor (Shard, StridedShard, Replicate, Partial)."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from meshplan.errors import PlacementError
from meshplan.layout._ints import int_or_same

__all__ = [
    "global_shape",
    "Shard",
    "StridedShard",
    "Replicate",
    "Partial",
    "Placement",
    "REDUCE_OPS",
    "DTYPES",
    "dtype_itemsize",
    "is_shard_like",
]

REDUCE_OPS = ("sum", "avg", "max", "min")


def _check_dim(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlacementError(
            f"{type(instance).__name__} needs an int tensor dim, got {value!r}", value=value
        )


@attrs.frozen(repr=False)
class Shard:
    """Mesh dim splits tensor dim ``dim`` like ``torch.chunk`` (last chunks may be short).

    >>> Shard(0), str(Shard(1))
    (Shard(0), 'S(1)')
    """

    dim: int = attrs.field(converter=int_or_same, validator=_check_dim)

    def __str__(self) -> str:
        return f"S({self.dim})"

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@attrs.frozen(repr=False)
class StridedShard:
    """Split ``dim`` into ``split_factor`` pieces, chunk each over the mesh dim, concatenate.

    The rank's local tensor is the concatenation of its chunk of every piece (torch's
    ``_StridedShard``). ``split_factor=1`` is plain :class:`Shard` (a :class:`Spec`
    canonicalizes it so).

    >>> StridedShard(0, 2), str(StridedShard(0, 2))
    (StridedShard(0, 2), 'SS(0,2)')
    """

    dim: int = attrs.field(converter=int_or_same, validator=_check_dim)
    split_factor: int = attrs.field(converter=int_or_same)

    @split_factor.validator
    def _check_sf(self, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlacementError(
                f"StridedShard({self.dim}, {value!r}): split_factor must be an int >= 1",
                value=value,
            )

    def __str__(self) -> str:
        return f"SS({self.dim},{self.split_factor})"

    def __repr__(self) -> str:
        return f"StridedShard({self.dim}, {self.split_factor})"


@attrs.frozen(repr=False)
class Replicate:
    """Every rank along the mesh dim holds the same full data.

    >>> Replicate(), str(Replicate())
    (Replicate(), 'R')
    """

    def __str__(self) -> str:
        return "R"

    def __repr__(self) -> str:
        return "Replicate()"


@attrs.frozen(repr=False)
class Partial:
    """Ranks along the mesh dim hold parts that reduce (``op``) to the value.

    >>> Partial(), Partial("max"), str(Partial("avg"))
    (Partial('sum'), Partial('max'), 'P(avg)')
    """

    op: str = attrs.field(default="sum")

    @op.validator
    def _check_op(self, attribute, value) -> None:
        if value not in REDUCE_OPS:
            raise PlacementError(
                f"unknown reduce op {value!r} for Partial; use one of {REDUCE_OPS!r}",
                value=value,
            )

    def __str__(self) -> str:
        return f"P({self.op})"

    def __repr__(self) -> str:
        return f"Partial({self.op!r})"


Placement = Shard | StridedShard | Replicate | Partial


def is_shard_like(p: Placement) -> bool:
    """True for :class:`Shard` and :class:`StridedShard`."""
    return isinstance(p, Shard | StridedShard)


# dtype name -> (bytes per element, short name)
DTYPES: dict[str, tuple[int, str]] = {
    "float64": (8, "f64"),
    "float32": (4, "f32"),
    "float16": (2, "f16"),
    "bfloat16": (2, "bf16"),
    "float8_e4m3fn": (1, "f8e4m3"),
    "float8_e5m2": (1, "f8e5m2"),
    "complex64": (8, "c64"),
    "complex128": (16, "c128"),
    "int64": (8, "i64"),
    "int32": (4, "i32"),
    "int16": (2, "i16"),
    "int8": (1, "i8"),
    "uint8": (1, "u8"),
    "bool": (1, "b8"),
}
_SHORT = {short: name for name, (_, short) in DTYPES.items()}


def dtype_name(value: object) -> str:
    """Normalize a dtype given as a name, a short name or a ``torch.dtype`` to its name.

    >>> dtype_name("f32"), dtype_name("bfloat16")
    ('float32', 'bfloat16')
    """
    name = str(value)
    if name.startswith("torch."):
        name = name[len("torch.") :]
    name = _SHORT.get(name, name)
    if name not in DTYPES:
        raise PlacementError(f"unknown dtype {value!r}; use one of {sorted(DTYPES)!r}", value=value)
    return name


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a dtype name."""
    return DTYPES[dtype_name(name)][0]


def dtype_short(name: str) -> str:
    return DTYPES[dtype_name(name)][1]


def global_shape(value: Iterable[int]) -> tuple[int, ...]:
    """A global shape as a tuple of ints (validated where a Spec is built).

    >>> global_shape([8, 4])
    (8, 4)
    """
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise PlacementError(
            f"global shape {value!r} is not a sequence of sizes; write e.g. (8, 4)", value=value
        )
    try:
        return tuple(int_or_same(v) for v in value)
    except TypeError:  # an iterable that refuses to iterate (a 0-d tensor or array)
        raise PlacementError(
            f"global shape {value!r} is not a sequence of sizes; write e.g. (8, 4)", value=value
        ) from None

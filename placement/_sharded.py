"""The :class:`Sharded` value: one rank's local tensor together with its spec."""

from __future__ import annotations

import attrs
import torch

from meshplan.errors import PlacementError
from meshplan.layout._ints import int_or_same

from ._local import Chunk, global_offset, local_chunks, local_shape
from ._spec import Spec
from ._tensor import shard_one

__all__ = ["Sharded"]


@attrs.frozen(eq=False, repr=False)
class Sharded:
    """Rank ``rank``'s part of a tensor laid out by ``spec`` (not a tensor subclass).

    What a training loop passes around: the local tensor plus everything needed to
    place it in the global tensor. Checked on construction: the rank is in the mesh,
    and the local tensor's shape and dtype are the ones ``spec`` gives that rank.
    Compares by identity (tensors have no value equality); compare ``local`` tensors
    with ``torch.equal``.

    >>> import torch
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> spec = Spec(Mesh.create(4), (Shard(0),), (5, 2))
    >>> s = Sharded.from_global(torch.zeros(5, 2), spec, rank=2)
    >>> s
    Sharded(rank=2, spec=f32[5,2](S(0)), local_shape=(1, 2))
    >>> s.global_offset, s.chunks()
    ((4, 0), (Chunk(offsets=(4, 0), sizes=(1, 2)),))
    """

    local: torch.Tensor
    spec: Spec
    rank: int = attrs.field(converter=int_or_same)  # numpy ints, 0-d int tensors

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.spec, Spec):
            raise PlacementError(f"Sharded needs a Spec, got {self.spec!r}", value=self.spec)
        if not isinstance(self.local, torch.Tensor):
            raise PlacementError(
                f"Sharded needs a torch.Tensor as its local part, got {type(self.local)!r}",
                value=self.local,
            )
        rank = self.rank
        if isinstance(rank, bool) or not isinstance(rank, int) or not self.spec.mesh.contains(rank):
            raise PlacementError(
                f"rank {rank!r} is not in mesh {self.spec.mesh} of {self.spec}; pass a rank of "
                "its rank map",
                value=rank,
            )
        want = local_shape(self.spec, rank)
        if tuple(self.local.shape) != want:
            raise PlacementError(
                f"rank {rank}'s local tensor has shape {tuple(self.local.shape)}, but {self.spec} "
                f"gives it {want}; shard the global tensor with this spec",
                value=tuple(self.local.shape),
            )
        name = str(self.local.dtype).removeprefix("torch.")
        if name != self.spec.dtype:
            raise PlacementError(
                f"rank {rank}'s local tensor has dtype {name}, but {self.spec} says "
                f"{self.spec.dtype}; convert the tensor or build the spec with dtype={name!r}",
                value=name,
            )

    @classmethod
    def from_global(cls, tensor: torch.Tensor, spec: Spec, rank: int) -> Sharded:
        """Rank ``rank``'s part of the global ``tensor`` under ``spec``."""
        return cls(shard_one(tensor, spec, rank), spec, rank)

    @property
    def shape(self) -> tuple[int, ...]:
        """The global shape."""
        return self.spec.shape

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(self.local.shape)

    @property
    def global_offset(self) -> tuple[int, ...]:
        """Where the local data begins in the global tensor (see :func:`global_offset`)."""
        return global_offset(self.spec, self.rank)

    @property
    def coordinate(self) -> tuple[int, ...]:
        """This rank's mesh coordinate."""
        coord = self.spec.mesh.coordinate(self.rank)
        assert coord is not None  # checked on construction
        return coord

    def chunks(self) -> tuple[Chunk, ...]:
        """The boxes of the global tensor held here, in local storage order."""
        return local_chunks(self.spec, self.rank)

    def with_local(self, local: torch.Tensor) -> Sharded:
        """The same rank and spec with another local tensor (checked)."""
        return Sharded(local, self.spec, self.rank)

    def __repr__(self) -> str:
        return f"Sharded(rank={self.rank}, spec={self.spec}, local_shape={self.local_shape})"

"""A chunk's bytes on disk: the form they are stored in and the checksum that covers them.

Save and load agree here on what a shard file holds for a box of a tensor: its bytes in
row-major order (a dtype safetensors cannot hold is stored as its real view), and a
crc32 checksum over them and over the box's place, which the index records and a load
verifies.
"""

from __future__ import annotations

import zlib

import torch

from meshplan.errors import CheckpointError

from ._crc import crc32
from ._index import ChunkRecord, TensorMeta

__all__ = [
    "REAL_VIEW",
    "checksum",
    "digest_text",
    "place_seed",
    "recorded_checksum",
    "restored",
    "stored",
]


def checksum(
    tensor: torch.Tensor, *, key: str | None = None, offsets: tuple[int, ...] | None = None
) -> str:
    """``"crc32:<hex>"`` of a tensor's bytes in row-major order (any dtype); with ``key``
    and ``offsets``, ``"crc32+box:<hex>"``, which also covers the chunk's place: the
    tensor's name, the box's global offsets and its sizes (what a save records, so an
    index whose records were swapped or moved fails verification).

    >>> checksum(torch.zeros(2, dtype=torch.int32))
    'crc32:6522df69'
    >>> t = torch.arange(2)
    >>> checksum(t, key="w", offsets=(0,)) != checksum(t, key="w", offsets=(2,))
    True
    """
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(
            f"checksum needs a torch.Tensor, got {type(tensor).__name__} {tensor!r:.80}; "
            "convert it first (e.g. torch.from_numpy)",
            value=tensor,
        )
    if tensor.is_meta:
        raise CheckpointError(
            "checksum of a meta-device tensor: it holds no data; materialize it first",
            value=tensor,
        )
    seed = 0
    if key is not None or offsets is not None:
        if not isinstance(key, str) or offsets is None:
            raise CheckpointError(
                f"checksum(key={key!r}, offsets={offsets!r}): a chunk's place is its tensor "
                "name (a str) and its global offsets; pass both or neither",
                value=key,
            )
        seed = place_seed(key, offsets, tuple(tensor.shape))
    flat = tensor.detach().contiguous().reshape(-1)
    crc = seed
    if flat.numel():
        crc = crc32(memoryview(flat.view(torch.uint8).cpu().numpy()), seed)
    return digest_text(crc, boxed=key is not None)


def place_seed(key: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """The crc32 a box's checksum starts from: it covers the tensor's name, the box's
    global offsets and its sizes. A writer that checksums bytes as it streams them
    continues ``zlib.crc32(data, seed)`` from here and gets :func:`checksum`'s value.

    >>> t = torch.arange(4, dtype=torch.int32)
    >>> crc = zlib.crc32(t.numpy().tobytes(), place_seed("w", (0,), (4,)))
    >>> digest_text(crc, boxed=True) == checksum(t, key="w", offsets=(0,))
    True
    """
    place = f"{key}\0{[int(o) for o in offsets]}\0{[int(n) for n in shape]}\0"
    return zlib.crc32(place.encode("utf-8"))


def digest_text(crc: int, *, boxed: bool) -> str:
    """The recorded form of a crc32: ``"crc32+box:<hex>"`` when it covers the box's place
    (it started from :func:`place_seed`), else ``"crc32:<hex>"``."""
    return f"crc32+box:{crc:08x}" if boxed else f"crc32:{crc:08x}"


def recorded_checksum(tensor: torch.Tensor, meta: TensorMeta, rec: ChunkRecord) -> str:
    """The checksum of a chunk read back, in the scheme its record uses."""
    if rec.checksum.startswith("crc32+box:"):
        return checksum(tensor, key=meta.key, offsets=rec.offsets)
    return checksum(tensor)  # an index written before checksums covered places


# dtypes safetensors cannot hold, stored as their real view (same bytes, a trailing dim of 2)
REAL_VIEW = {torch.complex128: torch.float64}


def stored(piece: torch.Tensor) -> torch.Tensor:
    """``piece`` in a dtype safetensors holds (complex128 as its float64 real view).

    >>> stored(torch.tensor([1 + 2j], dtype=torch.complex128))
    tensor([[1., 2.]], dtype=torch.float64)
    """
    return torch.view_as_real(piece) if piece.dtype in REAL_VIEW else piece


def restored(tensor: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
    """A chunk read back in the index's dtype (undoing :func:`stored`)."""
    dtype = getattr(torch, meta.dtype)
    if REAL_VIEW.get(dtype) == tensor.dtype and tensor.dim() and tensor.shape[-1] == 2:
        return torch.view_as_complex(tensor.contiguous())
    return tensor

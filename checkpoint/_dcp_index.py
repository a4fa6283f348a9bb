"""A torch DCP ``.metadata``, checked field by field, as a meshplan index of where bytes lie.

DCP's metadata is a pickled object graph (:mod:`._dcp_pickle` unpickles it with an
allow-list), so any field may hold any allowed value, and pickle memo references let a
small file list one chunk a million times. :func:`dcp_index` reads it in an order that
keeps time and memory proportional to the file:

1. counts first: every chunk has its own storage entry (DCP keys them by tensor and
   offsets), so a tensor listing more chunks than the file has entries, or a file holding
   more chunks than :data:`MIN_CHUNK_BYTES` per chunk allows (a real chunk takes ~130
   bytes), repeats records and is refused before any record is built; past the counts, a
   chunk repeated is refused at its second listing (its offsets were seen), so building
   records stops there;
2. each storage entry's types (a relative path inside the directory, int offset and length,
   no transform), and that no two entries share bytes of a data file;
3. each tensor's dtype, size and chunks, each chunk listed once and stored once, and that
   the chunks tile the tensor (:func:`~meshplan.checkpoint.check_tiles`, the check
   meshplan's own index gets).

No torch import at module level: the DCP classes are looked up when a file is read.
"""

from __future__ import annotations

from typing import Any

import attrs

from meshplan.errors import CheckpointError
from meshplan.layout import FrozenMap
from meshplan.layout._ints import as_int, brief

from ._index import ChunkRecord, Metadata, TensorMeta, check_dtype_name, check_tiles, ints_of
from ._index_json import _file

__all__ = ["CHECKSUM", "MIN_CHUNK_BYTES", "DcpIndex", "Stored", "dcp_index"]

CHECKSUM = "dcp:zip-crc32"  # each chunk's zip records carry a CRC-32, checked on read
MIN_CHUNK_BYTES = 32  # fewer bytes of .metadata per chunk than this: records are repeated
_MAX_INT = 2**63 - 1


@attrs.frozen
class Stored:
    """Where one saved chunk lies: ``length`` bytes at ``offset`` of the data ``file``.

    >>> Stored("__0_0.distcp", 0, 1577)
    Stored(file='__0_0.distcp', offset=0, length=1577)
    """

    file: str
    offset: int
    length: int


@attrs.frozen
class DcpIndex:
    """A checked DCP metadata: the tensors as a meshplan :class:`Metadata` (chunk records
    name their data file and ``key#n``) and, per ``(key, chunk number)``, its bytes."""

    meta: Metadata
    stored: FrozenMap[tuple[str, int], Stored] = attrs.field(converter=FrozenMap)


def _damaged(where: str, what: str, value: Any = None) -> CheckpointError:
    return CheckpointError(
        f"the DCP metadata of {where!r}: {what}; the checkpoint is damaged (save it again)",
        value=value,
    )


def _field(obj: Any, name: str) -> Any:
    """``obj.name``, or None when the unpickled object lacks it."""
    try:
        return getattr(obj, name, None)
    except Exception:  # a hostile __getattr__ cannot come through the allow-list, but be safe
        return None


def _count_chunks(tensors: dict[str, Any], storage: dict, nbytes: int, where: str) -> None:
    """Refuse repeated chunk records before any is built (step 1 of the module docstring)."""
    total = 0
    for key, entry in tensors.items():
        chunks = _field(entry, "chunks")
        if type(chunks) not in (list, tuple):
            raise _damaged(where, f"tensor {key!r} has chunks {brief(chunks)}, not a list", key)
        if len(chunks) > len(storage):
            raise _damaged(
                where,
                f"tensor {key!r} lists {len(chunks)} chunks but the file has {len(storage)} "
                "storage entries, one per saved chunk: its chunk records are repeated (pickle "
                "memo references)",
                key,
            )
        total += len(chunks)
    if total > nbytes // MIN_CHUNK_BYTES:
        worst = max(tensors, key=lambda k: len(_field(tensors[k], "chunks")))
        raise _damaged(
            where,
            f"its {nbytes} bytes list {total} chunks ({len(storage)} storage entries; a chunk "
            f"takes at least {MIN_CHUNK_BYTES} bytes), most of them of tensor {worst!r}: chunk "
            "records are repeated (pickle memo references)",
            worst,
        )


def _places(storage: dict, where: str) -> dict[tuple[str, tuple[int, ...] | None], Stored]:
    """Storage entries by (tensor key, offsets), checked (step 2 of the module docstring)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    places: dict[tuple[str, tuple[int, ...] | None], Stored] = {}
    for index, info in storage.items():
        fqn = _field(index, "fqn")
        if not isinstance(index, MetadataIndex) or not isinstance(fqn, str):
            raise _damaged(where, f"storage key {brief(index)} is not a MetadataIndex of a name")
        raw = _field(index, "offset")
        offsets = None if raw is None else ints_of(f"tensor {fqn!r}: storage offsets")(raw)
        entry = f"the storage entry of tensor {fqn!r} at offsets {offsets!r}"
        if not isinstance(info, _StorageInfo):
            raise _damaged(where, f"{entry} is {brief(info)}, not a _StorageInfo", fqn)
        path = _field(info, "relative_path")
        try:
            _file(path)
        except ValueError:
            raise _damaged(
                where,
                f"{entry} places data in {brief(path)}, outside the checkpoint directory (or "
                "not a file name); the checkpoint is damaged or hostile",
                path,
            ) from None
        start, length = as_int(_field(info, "offset")), as_int(_field(info, "length"))
        if (
            start is None
            or length is None
            or not (0 <= start <= _MAX_INT and 0 <= length <= _MAX_INT)
        ):
            raise _damaged(
                where,
                f"{entry} in {path!r} has offset {brief(_field(info, 'offset'))} and length "
                f"{brief(_field(info, 'length'))}; both are ints >= 0",
                fqn,
            )
        if _field(info, "transform_descriptors"):
            raise CheckpointError(
                f"{entry} in {path!r} of the DCP checkpoint {where!r} is transformed "
                f"({brief(_field(info, 'transform_descriptors'))}, e.g. compressed by a DCP "
                "extension); meshplan reads plain DCP data only: save without extensions",
                value=fqn,
            )
        places[(fqn, offsets)] = Stored(path, start, length)
    _check_disjoint(places, where)
    return places


def _check_disjoint(places: dict, where: str) -> None:
    """Refuse two storage entries sharing bytes of one file (one would read the other's)."""
    spans = sorted((s.file, s.offset, s.length, key) for key, s in places.items())
    for (file, a, n, ka), (file_b, b, _, kb) in zip(spans, spans[1:], strict=False):
        if file == file_b and a + n > b:
            raise _damaged(
                where,
                f"the storage entries of tensor {ka[0]!r} at offsets {ka[1]!r} and tensor "
                f"{kb[0]!r} at offsets {kb[1]!r} share bytes of {file!r} ({a}+{n} > {b})",
                ka[0],
            )


def _tensor(key: str, entry: Any, places: dict, stored: dict, where: str) -> TensorMeta:
    """One tensor's entry as a checked TensorMeta (step 3 of the module docstring)."""
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties

    props = _field(entry, "properties")
    dtype = _field(props, "dtype")
    if not isinstance(props, TensorProperties) or not isinstance(dtype, torch.dtype):
        raise _damaged(where, f"tensor {key!r} has properties {brief(props)} without a dtype", key)
    name = str(dtype).removeprefix("torch.")
    try:
        check_dtype_name(name)
    except CheckpointError as e:
        raise _damaged(where, f"tensor {key!r}: {e}", key) from None
    shape = ints_of(f"tensor {key!r}: size")(_field(entry, "size"))
    records, seen = [], set()
    for i, chunk in enumerate(_field(entry, "chunks")):
        if not isinstance(chunk, ChunkStorageMetadata):
            raise _damaged(where, f"tensor {key!r}: chunk {i} is {brief(chunk)}", key)
        offsets = ints_of(f"tensor {key!r}: chunk {i} offsets")(_field(chunk, "offsets"))
        sizes = ints_of(f"tensor {key!r}: chunk {i} sizes")(_field(chunk, "sizes"))
        if offsets in seen:
            raise _damaged(
                where, f"tensor {key!r}: chunk {i} at offsets {offsets!r} is listed twice", key
            )
        seen.add(offsets)
        place = places.get((key, offsets))
        if place is None:
            raise _damaged(
                where, f"tensor {key!r}: chunk {i} at offsets {offsets!r} has no storage entry", key
            )
        records.append(ChunkRecord(offsets, sizes, place.file, f"{key}#{i}", CHECKSUM))
        stored[(key, i)] = place
    meta = TensorMeta(key, shape, name, records)
    check_tiles(meta, f" in the DCP checkpoint {where!r}")
    return meta


def dcp_index(dcp_meta: Any, where: str, nbytes: int) -> DcpIndex:
    """Check the unpickled DCP ``Metadata`` of the ``nbytes``-long ``.metadata`` in ``where``
    and index its tensors, or raise a :class:`CheckpointError` naming the tensor and field."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    entries, storage = _field(dcp_meta, "state_dict_metadata"), _field(dcp_meta, "storage_data")
    if not isinstance(entries, dict):
        raise _damaged(where, f"its state_dict_metadata is {brief(entries)}, not a dict")
    if not isinstance(storage, dict):
        raise _damaged(where, f"its storage_data is {brief(storage)}, not a dict")
    tensors = {}
    for key, entry in entries.items():
        if not isinstance(key, str) or not isinstance(
            entry, TensorStorageMetadata | BytesStorageMetadata
        ):
            raise _damaged(where, f"entry {brief(key)} is {brief(entry)}", key)
        if isinstance(entry, TensorStorageMetadata):
            tensors[key] = entry
    _count_chunks(tensors, storage, nbytes, where)
    places = _places(storage, where)
    stored: dict[tuple[str, int], Stored] = {}
    metas = {key: _tensor(key, entry, places, stored, where) for key, entry in tensors.items()}
    return DcpIndex(Metadata(metas), stored)

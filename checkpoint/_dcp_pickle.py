"""Unpickling a DCP ``.metadata`` with an allow-list: an untrusted checkpoint runs no code.

torch's DCP writes its checkpoint's metadata with :mod:`pickle`, and its reader unpickles
it unrestricted, so a hostile ``.metadata`` could run any code the moment a directory is
read. Here every global the pickle names is looked up in an allow-list: DCP's own metadata
classes, ``torch.Size``, torch dtypes, layouts and memory formats, and the path types DCP
records. Anything else (``os.system``, ``builtins.eval``, any other class) is refused with
a :class:`CheckpointError` before it is called.

The unpickler is Python's pure-Python one: time and memory stay proportional to the file
(memo references cost one slot each, and a memo index, however large, one dict entry),
where the C unpickler allocates an array as long as the largest memo index a file names.
What the file then describes (a chunk referenced a million times, say) is checked before
it is used (:mod:`._dcp_index`).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from meshplan.errors import CheckpointError

__all__ = ["load_metadata"]

_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_METADATA, name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    *(
        ("pathlib", name)
        for name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")
    ),
}


def _allowed_torch_value(name: str) -> Any:
    """``torch.<name>`` when it is a dtype, a layout or a memory format, else None."""
    import torch

    value = getattr(torch, name, None)
    kinds = (torch.dtype, torch.layout, torch.memory_format)
    return value if isinstance(value, kinds) else None


class _Unpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """The pure-Python unpickler: its memo is a dict, so a ``LONG_BINPUT`` of index 2**32-1
    costs one entry (the C unpickler grows an array to that index: ~64 GB)."""

    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and (value := _allowed_torch_value(name)) is not None:
            return value
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise CheckpointError(
            f"the DCP metadata of {self.where!r} refers to {module}.{name}, which a DCP "
            "checkpoint's metadata never holds: it is refused unread (unpickling it could "
            "run code); read only checkpoints written by torch.distributed.checkpoint",
            value=f"{module}.{name}",
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(
            f"the DCP metadata of {self.where!r} holds a persistent reference, which DCP "
            "never writes; the file is damaged or not DCP metadata",
            value=self.where,
        )


def load_metadata(data: bytes, where: str) -> Any:
    """The DCP ``Metadata`` pickled in ``data`` (``where`` names it in errors)."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        meta = _Unpickler(data, where).load()
    except CheckpointError:
        raise
    except Exception as e:  # a damaged pickle raises many types
        raise CheckpointError(
            f"the DCP metadata of {where!r} cannot be read: {type(e).__name__}: {e}",
            value=where,
        ) from None
    if not isinstance(meta, Metadata):
        raise CheckpointError(
            f"the .metadata of {where!r} holds a {type(meta).__name__}, not a DCP Metadata; "
            "the checkpoint is damaged",
            value=where,
        )
    return meta

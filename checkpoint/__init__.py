"""meshplan.checkpoint — save sharded tensors and load them back under any layout.

Decides which rank writes which box of each tensor (every element exactly once:
replicas are written by one owner, a StridedShard or uneven-shard-order local tensor
is written box by box), what the JSON index records (global shape, dtype, the spec it
was saved in, and per chunk its global box, file, name and crc32 checksum), and which
slices of which saved chunks fill a rank's local tensor under a target spec
(:func:`plan_reads`: pure box intersection, any mesh, world size, shard order or
StridedShard). The shell
(:func:`save`, :func:`save_all`, :func:`load`, :func:`load_all`) writes safetensors
shard files under fresh names and commits by atomically replacing ``index.json`` last,
so a crash mid-save leaves the previous checkpoint loadable, and a save that raises
(a full disk) removes what it wrote; loads verify checksums. A load while other
processes save into the same directory gets the checkpoint committed when it started,
whole (it claims its files: a save's sweep keeps them). ``save(..., blocking=False)``
(:func:`save_async`) copies the rank's boxes and returns, writing and committing in the
background on a gloo group of its own (one per mesh's ranks, shared by saves).

Never saves ``Partial`` values (reduce them first), never reads another rank's data on
load (a load with ``groups`` exchanges only its outcome: when one rank's load fails,
every rank raises), never overwrites a committed file in place, and never trusts a
chunk whose checksum or shape disagrees with the index. Hostile directories fail at
once with a :class:`CheckpointError`: only regular files are read (a FIFO or a device
is refused), an index over ``MAX_INDEX_BYTES`` is refused unread, the tiling check is
linear in the number of chunks, and every chunk a load reads is checked against its
shard file's header before anything is allocated. The index and planning modules
import no torch.

torch DCP checkpoints read into any spec too (:func:`load_dcp`, :func:`load_dcp_all`,
:func:`read_dcp_metadata`: DCP's public reader, meshplan's box intersection), and
:func:`convert_to_dcp` writes a meshplan checkpoint as one, for ``dcp.load``. A DCP
``.metadata`` is unpickled with an allow-list (DCP's metadata classes, ``torch.Size``,
dtypes, layouts, memory formats, paths): an untrusted DCP checkpoint cannot run code
when it is read, and data paths outside its directory are refused.

>>> import tempfile, torch
>>> from meshplan.layout import Mesh
>>> from meshplan.placement import Shard, Spec, Sharded, shard, unshard
>>> from meshplan.checkpoint import load_all, read_metadata, save_all
>>> src = Spec(Mesh.create(4), (Shard(0),), (6, 2), "int64")
>>> x = torch.arange(12).reshape(6, 2)
>>> path = tempfile.mkdtemp()
>>> _ = save_all({r: {"x": Sharded(t, src, r)} for r, t in shard(x, src).items()}, path)
>>> dst = Spec(Mesh.create((2, 2)), (Shard(1), Shard(0)), (6, 2), "int64")
>>> got = load_all(path, {"x": dst})
>>> torch.equal(unshard({r: s["x"].local for r, s in got.items()}, dst), x)
True
>>> read_metadata(path)["x"].shape
(6, 2)
"""

from meshplan.errors import CheckpointError
from meshplan.layout._lazy import lazy_attributes

from ._index import INDEX_NAME, ChunkRecord, Metadata, MissingTensorError, TensorMeta, check_tiles
from ._index_json import MAX_INDEX_BYTES, metadata_from_json, metadata_to_json, read_metadata
from ._plan import Box, Read, check_target, intersect, local_boxes, plan_reads, writes

_LAZY = {
    "save": "_save",
    "save_async": "_async",
    "SaveHandle": "_async",
    "save_all": "_save",
    "load": "_load",
    "load_all": "_load",
    "checksum": "_encoding",
    "load_dcp": "_dcp",
    "load_dcp_all": "_dcp",
    "read_dcp_metadata": "_dcp",
    "convert_to_dcp": "_dcp",
}

# save/load touch tensors and files: import torch only when they are used.
__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "INDEX_NAME",
    "MAX_INDEX_BYTES",
    "Box",
    "CheckpointError",
    "ChunkRecord",
    "Metadata",
    "MissingTensorError",
    "Read",
    "SaveHandle",
    "TensorMeta",
    "check_target",
    "check_tiles",
    "checksum",
    "convert_to_dcp",
    "intersect",
    "load",
    "load_all",
    "load_dcp",
    "load_dcp_all",
    "local_boxes",
    "metadata_from_json",
    "metadata_to_json",
    "plan_reads",
    "read_dcp_metadata",
    "read_metadata",
    "save",
    "save_all",
    "save_async",
    "writes",
]

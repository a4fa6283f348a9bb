"""The saved spec of a checkpointed tensor as JSON: mesh, placements, shard order (no torch).

The index records, next to a tensor's boxes, the :class:`~meshplan.placement.Spec` it
was saved in, so a reader sees how the tensor lay (and can load it back the same way)
without knowing the program that wrote it. The document is plain JSON::

    {"mesh": {"shape": [2, 4], "names": ["dp", "tp"], "ranks": {"range": [0, 8, 1]},
              "layout": [[[2], [4]], [[4], [1]]], "device_type": "cpu"},
     "placements": ["S(0)", "S(1)"], "shard_order": {"0": [0], "1": [1]}}

``layout`` lists each mesh dim's CuTe modes (sizes, strides) over the rank map, so a
sliced or permuted mesh comes back equal; ``ranks`` is a ``range`` (start, stop, step)
when the map is a progression, else the list of ranks. Aliases (flattened dims) are kept
as ``aliases``. The global shape and dtype are the tensor entry's own.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import CheckpointError
from meshplan.layout import Axis, FrozenMap, Mesh, MeshLayout
from meshplan.placement import Spec
from meshplan.placement._text import parse_placements

__all__ = ["spec_from_doc", "spec_to_doc"]


def _modes(axis: Axis) -> list[list[int]]:
    return [list(axis.sizes), list(axis.strides)]


def spec_to_doc(spec: Spec) -> dict[str, Any]:
    """The JSON document of ``spec``'s layout (its shape and dtype are left out).

    >>> from meshplan.placement import Replicate, Shard
    >>> spec = Spec(Mesh.create((2, 2), ("dp", "tp")), (Shard(0), Replicate()), (4, 2))
    >>> doc = spec_to_doc(spec)
    >>> doc["placements"], doc["shard_order"], doc["mesh"]["ranks"]
    (['S(0)', 'R'], {'0': [0]}, {'range': [0, 4, 1]})
    >>> spec_from_doc(doc, (4, 2), "float32") == spec
    True
    """
    mesh = spec.mesh
    ranks = mesh.ranks
    doc_ranks: Any = (
        {"range": [ranks.start, ranks.stop, ranks.step]}
        if isinstance(ranks, range)
        else list(ranks)
    )
    out: dict[str, Any] = {
        "mesh": {
            "shape": list(mesh.shape),
            "names": list(mesh.names),
            "ranks": doc_ranks,
            "layout": [_modes(a) for a in mesh.layout.axes],
            "device_type": mesh.device_type,
        },
        "placements": [str(p) for p in spec.placements],
        "shard_order": {str(d): list(ms) for d, ms in sorted(spec.shard_order.items())},
    }
    if mesh.aliases:
        out["mesh"]["aliases"] = {n: _modes(a) for n, a in sorted(mesh.aliases.items())}
    return out


def spec_from_doc(doc: Any, shape: tuple[int, ...], dtype: str) -> Spec:
    """The :class:`Spec` a document of :func:`spec_to_doc` describes, for a tensor of
    ``shape`` and ``dtype``; a :class:`CheckpointError` naming the field when it is not one.
    """
    try:
        m = doc["mesh"]
        raw = m["ranks"]
        if isinstance(raw, dict):
            start, stop, step = raw["range"]
            ranks: Any = range(start, stop, step)
        else:
            ranks = list(raw)
        layout = MeshLayout(tuple(Axis.of(s, d) for s, d in m["layout"]))
        aliases = {n: Axis.of(s, d) for n, (s, d) in dict(m.get("aliases", {})).items()}
        mesh = Mesh(layout, ranks, tuple(m["names"]), FrozenMap(aliases), m["device_type"])
        if list(mesh.shape) != list(m["shape"]):
            raise ValueError(f"mesh shape {m['shape']!r} disagrees with its layout {layout}")
        placements, _ = parse_placements(" ".join(doc["placements"]))
        order = {int(d): tuple(ms) for d, ms in dict(doc["shard_order"]).items()}
        return Spec(mesh, placements, shape, dtype, order)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        # MeshError and PlacementError are ValueErrors: the saved spec is not a valid one
        raise CheckpointError(
            f"saved spec {doc!r:.200} is malformed ({type(e).__name__}: {e}); the index is damaged",
            value=doc,
        ) from None

"""Which link a process group communicates on: per mesh dim, per node, per collective, or
the links a profile gives a flattened group of several dims."""

from __future__ import annotations

import functools

from meshplan.errors import PlanError
from meshplan.layout import Mesh
from meshplan.layout._axis import complement

from ._collectives import MERGEABLE
from ._profile import CostModel, HardwareProfile, Link

__all__ = ["group_link"]


@functools.lru_cache(maxsize=4096)
def _spans_nodes(mesh: Mesh, dims: tuple[int, ...], ranks_per_node: int) -> bool:
    """Whether some group of ``mesh`` along ``dims`` holds ranks of two nodes (node:
    ``rank // ranks_per_node``). A rank map that is a range is decided from the layout in
    time independent of the number of ranks (see :func:`_range_spans_nodes`); any other
    rank map lists its groups."""
    ranks = mesh.ranks
    if isinstance(ranks, range) and len(ranks) > ranks_per_node:
        return _range_spans_nodes(mesh, dims, ranks_per_node)
    for group in mesh.groups(dims):
        node = group[0] // ranks_per_node
        if any(r // ranks_per_node != node for r in group):
            return True
    return False


def _range_spans_nodes(mesh: Mesh, dims: tuple[int, ...], r: int) -> bool:
    """:func:`_spans_nodes` for a rank map ``range(s, ..., k)``.

    A group is ``s + (b + o) * k`` for its base ``b`` (an offset of the complement of the
    group's layout) and every offset ``o`` of the group's layout, ``0 <= o <= M``. Ranks
    are monotone in ``o``, so the group spans nodes when its lowest rank ``lo`` has
    ``lo % r + M * |k| >= r``. Only ``lo % r`` matters: the residues of every base are
    built mode by mode of the complement, a set of at most ``r`` values.
    """
    ranks = mesh.ranks
    modes = [mode for m in dims for mode in mesh.axis(m).modes]
    extent = sum((n - 1) * d for n, d in modes) * abs(ranks.step)
    if extent >= r:
        return True
    if extent == 0:
        return False
    low = ranks.start - extent if ranks.step < 0 else ranks.start  # base 0's lowest rank
    residues = {low % r}
    for n, d in complement(modes, len(ranks)).modes:
        step = (d * ranks.step) % r
        residues = {(x + c * step) % r for x in residues for c in range(min(n, r))}
        if len(residues) == r:
            break
    return max(residues) + extent >= r


def group_link(
    model: CostModel, mesh: Mesh, dims: tuple[int, ...], collective: str | None = None
) -> Link:
    """The link a group over ``dims`` communicates on: the slowest of its dims' links (for
    ``collective``, its own links when the profile has them), or for a merged step the
    links the profile gives the group of those dims (``HardwareProfile.flattened``)."""
    hw = model.profile
    if hw.flattened:
        _check_flattened(hw, mesh)
        if len(dims) > 1 and collective in MERGEABLE:
            links = hw.flattened.get(tuple(sorted(dims)))
            if links is not None and collective in links:
                return links[collective]
    own = hw.per_collective.get(collective) if hw.per_collective else None
    if own is None and collective == "all_permute" and hw.per_collective:
        own = hw.per_collective.get("all_to_all")
    if isinstance(own, Link):
        return own
    if own is not None:
        return _slowest(own, mesh, dims, f"per_collective[{collective!r}]", hw)
    if hw.dims is not None:
        return _slowest(hw.dims, mesh, dims, "dims", hw)
    if hw.ranks_per_node is not None and _spans_nodes(mesh, tuple(dims), hw.ranks_per_node):
        return hw.inter
    return hw.intra


@functools.lru_cache(maxsize=256)
def _check_flattened(hw: HardwareProfile, mesh: Mesh) -> None:
    for dims in hw.flattened:
        if dims[-1] >= mesh.ndim:
            raise PlanError(
                f"hardware profile has flattened links for mesh dims {dims}, but mesh {mesh} "
                f"has {mesh.ndim} dims; calibrate it on this mesh",
                value=hw,
            )


def _slowest(links: tuple[Link, ...], mesh: Mesh, dims, what: str, hw) -> Link:
    if len(links) != mesh.ndim:
        raise PlanError(
            f"hardware profile has {what} links for {len(links)} mesh dims, but mesh "
            f"{mesh} has {mesh.ndim}; calibrate it on this mesh",
            value=hw,
        )
    chosen = [links[m] for m in dims]
    return Link(max(x.latency_s for x in chosen), min(x.bytes_per_s for x in chosen))

"""Which ranks a save or load acts for: its ``groups=`` and ``rank=`` arguments.

A save or load with ``groups`` (a :class:`~meshplan.runtime.ProcessGroups`) acts for
the calling process's rank of ``groups.mesh``; a save needs the whole mesh, since every
instance of a sliced mesh would commit on its own. A load may name its rank instead
(``rank=``), or leave it out when every target lives on one rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshplan.errors import CheckpointError
from meshplan.layout import Mesh
from meshplan.layout._ints import as_int
from meshplan.placement import Spec

__all__ = ["check_groups", "check_whole_mesh", "resolve_rank"]


def check_groups(groups: Any) -> None:
    """Raise unless ``groups`` is a :class:`~meshplan.runtime.ProcessGroups`.

    >>> check_groups("dp")
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: groups='dp' must be a meshplan.runtime.ProcessGroups ...
    """
    from meshplan.runtime import ProcessGroups

    if not isinstance(groups, ProcessGroups):
        raise CheckpointError(
            f"groups={groups!r:.80} must be a meshplan.runtime.ProcessGroups built on the "
            "mesh (ProcessGroups(mesh)), or None",
            value=groups,
        )


def check_whole_mesh(mesh: Mesh) -> None:
    """Raise unless ``mesh`` spans its whole world (a save's groups must: one commit).

    >>> check_whole_mesh(Mesh.create((2, 2), ("a", "b"))["a"])
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: save needs ProcessGroups over a whole mesh, ...
    """
    if mesh.size() != mesh.world_size:
        raise CheckpointError(
            f"save needs ProcessGroups over a whole mesh, got one over the sliced mesh {mesh} "
            "(several instances would each commit); build ProcessGroups on the root mesh",
            value=mesh,
        )


def resolve_rank(targets: Mapping[str, Spec], groups: Any, rank: Any) -> int:
    """The global rank a load of ``targets`` is for: ``rank``, or ``groups.rank`` (they
    must agree when both are given), or the one rank of 1-rank targets.

    >>> from meshplan.placement import Replicate
    >>> resolve_rank({"w": Spec(Mesh.create(1, ranks=(3,)), (Replicate(),), (2,))}, None, None)
    3
    >>> resolve_rank({}, None, 2)
    2
    """
    if groups is not None:
        check_groups(groups)
    if rank is not None:
        given = rank
        rank = as_int(given)
        if rank is None:
            raise CheckpointError(
                f"rank={given!r} must be an int: the global rank to load for", value=given
            )
        if groups is not None and groups.rank != rank:
            raise CheckpointError(
                f"rank={rank!r} disagrees with groups (rank {groups.rank}); pass one of them",
                value=rank,
            )
        return rank
    if groups is not None:
        return groups.rank
    sizes = {spec.mesh.size() for spec in targets.values()}
    if sizes <= {1}:
        return next((spec.mesh.ranks[0] for spec in targets.values()), 0)
    raise CheckpointError(
        "load needs to know which rank it loads for: pass groups= (ProcessGroups) or rank=; "
        "load_all loads every rank in one process",
    )

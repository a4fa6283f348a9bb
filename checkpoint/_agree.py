"""Ranks agree on a load's outcome: one fails, every rank raises, within seconds.

A load reads only local files, so ranks could part ways: one finds a shard truncated
and raises, the others return and enter the training loop's first collective, where
they wait for it until their timeout. A load with ``groups`` therefore ends with one
all-gather of each rank's outcome (None, or its error's text) over the mesh's group:
a rank whose load failed raises its own error, every other rank a
:class:`CheckpointError` quoting the first failing rank's. The same message carries a
token of how the ranks shared out the checksum checks, so they learn in that one
collective whether every chunk was checked by someone.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import CheckpointError

from ._exchange import all_gather_small

__all__ = ["agree"]


def agree(
    groups: Any, directory: str, error: BaseException | None, token: str | None = None
) -> bool:
    """Share this rank's load outcome with every rank of ``groups.mesh``; raise on every
    rank when any rank's load failed (``error``: this rank's, or None). Otherwise return
    whether every rank passed the same ``token`` (the same answer on every rank)."""
    group = groups.create(None)
    if group is None:  # outside the mesh: it took part in creating the group only
        if error is not None:
            raise error
        return True
    text = None if error is None else f"{type(error).__name__}: {error}"
    try:
        gathered = all_gather_small((groups.rank, text, token), group)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"load from {directory!r}: the ranks could not agree on its outcome on rank "
            f"{groups.rank} ({first}); a peer died or timed out: restart the job's processes",
            value=directory,
        ) from error
    failed = sorted((r, t) for r, t, _ in gathered if t is not None)
    if error is not None:
        raise error
    if failed:
        r, t = failed[0]
        others = f" (and on {len(failed) - 1} other ranks)" if len(failed) > 1 else ""
        raise CheckpointError(
            f"load from {directory!r} failed on rank {r}{others}: {t}; no rank uses it",
            value=directory,
        )
    return all(t == token for _, _, t in gathered)

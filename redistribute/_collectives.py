"""The collectives a plan's steps run, named once (no torch).

Every other list of collective names (the cost model's, the merge pass's, the search's,
the simulator's, the runtime's) is one of these.

>>> MERGEABLE
('all_gather', 'all_reduce', 'reduce_scatter', 'all_to_all')
"""

from __future__ import annotations

__all__ = ["COLLECTIVES", "MERGEABLE", "ASSEMBLING", "REDUCING", "EXCHANGING"]

COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_permute")
"""The collectives a :class:`~meshplan.redistribute.Step` may run (None: a local step);
``HardwareProfile.per_collective``'s keys."""

MERGEABLE = tuple(c for c in COLLECTIVES if c != "all_permute")
"""The collectives a step merged onto a flattened alias may run as one
(``HardwareProfile.flattened``'s links are theirs; an all_permute spans whichever mesh
dims it moves)."""

REDUCING = ("all_reduce", "reduce_scatter")
"""The collectives that reduce a Partial input."""

EXCHANGING = ("all_to_all", "all_permute")
"""The collectives in which each rank sends parts of its local tensor to others."""

ASSEMBLING = tuple(c for c in COLLECTIVES if c not in REDUCING)
"""The collectives whose output each rank assembles from pieces other ranks send."""

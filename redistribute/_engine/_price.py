"""How the search prices a move: a step's linear price in its local bytes, an all_permute's
price through its permute hub, and the tie-breaking factor every price carries (the one
formula searches, tables and plans shared across sizes all use, so they agree)."""

from __future__ import annotations

import functools
from typing import NamedTuple

from .._step_cost import coefficients

__all__ = [
    "Coefficients",
    "price_coefficients",
    "step_price",
    "permute_price",
    "permute_hub",
    "hub_key",
    "prefix_length",
    "suffix_mask",
    "tie",
]


class Coefficients(NamedTuple):
    """A step's price as ``fixed + per_in * b_in + per_out * b_out`` (seconds; bytes in
    and out per rank)."""

    fixed: float
    per_in: float
    per_out: float


@functools.lru_cache(maxsize=4096)
def price_coefficients(
    model, mesh, dims, collective, n_send, per_collective: float = 0.0
) -> Coefficients:
    """A step's price coefficients, communication and compute together (plus
    ``per_collective`` on a collective: the "collectives" objective)."""
    comm0, comm_in, comm_out, work0, work_in, work_out, _ = coefficients(
        model, mesh, dims, collective, n_send
    )
    fixed = comm0 + work0 + (per_collective if collective is not None else 0.0)
    return Coefficients(fixed, comm_in + work_in, comm_out + work_out)


def step_price(c: Coefficients, b_in: int, b_out: int, scaled: bool, copy: float) -> float:
    """The price of a step of coefficients ``c`` (:func:`price_coefficients`) on ``b_in``
    bytes in, ``b_out`` out; ``scaled`` adds writing the output once more (an avg scale)
    at ``copy`` seconds per byte. The one formula every price of the planner comes from
    (searches, tables and plans shared across sizes agree to the last bit).

    >>> step_price(Coefficients(1.0, 2.0, 3.0), 10, 100, False, 0.5)
    321.0
    """
    total = c.fixed + c.per_in * b_in + c.per_out * b_out
    if scaled:
        total += b_out * copy
    return total


def prefix_length(codes, chain, new_codes, new_chain) -> int:
    """How long a prefix two shard orders of one tensor dim share (the same mesh dims,
    each with the same placement)."""
    k = 0
    n = min(len(chain), len(new_chain))
    while k < n and chain[k] == new_chain[k] and codes[chain[k]] == new_codes[chain[k]]:
        k += 1
    return k


def suffix_mask(chains, ks) -> int:
    """The mesh dims (a bit mask) after the first ``ks[d]`` of each tensor dim's order."""
    mask = 0
    for chain, k in zip(chains, ks, strict=True):
        for x in chain[k:]:
            mask |= 1 << x
    return mask


def hub_key(codes, chains, ks, mask: int) -> tuple:
    """The permute hub of a state (``codes``, ``chains``) keeping the first ``ks[d]`` mesh
    dims of each tensor dim's order (see ``_permutes.hubs_of``); ``mask``: the mesh dims
    after those prefixes (:func:`suffix_mask`), which its permutes exchange pieces over."""
    base = tuple(-1 if mask >> m & 1 else c for m, c in enumerate(codes))
    prefixes = tuple(chain[:k] for chain, k in zip(chains, ks, strict=True))
    nexts = tuple(
        (chain[k], codes[chain[k]]) if k < len(chain) else -1
        for chain, k in zip(chains, ks, strict=True)
    )
    return (base, prefixes, nexts)


def permute_hub(a, b) -> tuple:
    """The permute hub (``_permutes.hubs_of``) an all_permute from state ``a`` to ``b``
    passes through: the one keeping their common order prefixes."""
    codes, chains = a
    new_codes, new_chains = b
    ks = tuple(
        prefix_length(codes, x, new_codes, y) for x, y in zip(chains, new_chains, strict=True)
    )
    return hub_key(codes, chains, ks, suffix_mask(chains, ks))


def permute_price(c: tuple, b_in: int, b_out: int, a, b) -> float:
    """The price of an all_permute from state ``a`` to ``b`` of coefficients ``c``
    (:func:`price_coefficients`): its halves into and out of its hub, each with its own
    tie-breaking factor, summed as every search, table and shared plan sums them."""
    hub = permute_hub(a, b)
    return (c.fixed + c.per_in * b_in) * tie(a, hub) + c.per_out * b_out * tie(hub, b)


def tie(a, b) -> float:
    """A deterministic factor in [1, 1 + 2**-31) for the transition ``a -> b`` (states).

    Every price carries it, so plans that would tie exactly differ, and each pair of specs
    has one cheapest plan, whichever way it is found (search or table, in any process of
    one Python build: states hold only ints, whose hashes are fixed). A plan's price moves
    by under 5e-10 of itself.
    """
    return 1.0 + (hash((a, b)) & 0xFFFFFFFF) * 2.0**-63

"""Search goals: the states holding a target's layout, and patterns standing for many.

A plan may end at any spec holding the target's layout (every rank the same local
tensor): on a tiny tensor dim or one with StridedShards, another shard placement of its
mesh dims in another order may chunk it alike. :func:`goal_class` lists those states
(the target's own first); past :data:`CLASS_LIMIT` of them a pattern stands for them all
(:func:`class_goal`), and on a tensor without elements each goal is a pattern too
(:func:`unreduced_goal`). A pattern is a state whose codes may be ``ANY`` or
``SHARD_ANY - d`` and whose chains may be None or sets of ways (``_encoding``);
:func:`admits` tells the states it stands for.
"""

from __future__ import annotations

import functools
import itertools

from ._encoding import ANY, SHARD_ANY, R
from ._exact import piece_classes, tiny_dims

__all__ = ["CLASS_LIMIT", "goal_class", "unreduced_goal", "class_goal", "is_pattern", "admits"]


CLASS_LIMIT = 8  # specs of the target's layout a plan is searched to, at most


@functools.lru_cache(maxsize=4096)
def goal_class(goal_state: tuple, shape: tuple, sizes: tuple, shards: tuple) -> tuple:
    """The states holding the layout of ``goal_state`` (every rank the same local tensor),
    ``goal_state`` first: on a tiny tensor dim or one with StridedShards, another shard
    placement of its mesh dims in another order may chunk it alike (``_moves.relabels``).
    The cheapest plan to any of them is the cheapest plan; past ``CLASS_LIMIT`` of them
    (a min over each one's bound would cost too much) a pattern stands for them all
    (:func:`class_goal`: a looser bound, the same optimum). On a tensor without
    elements, along a dim of length 0 every rank holds nothing however mesh dims shard
    it: each goal is then a pattern standing for every state that differs from it only
    there (:func:`unreduced_goal`)."""
    per_dim, count = _class_ways(goal_state, shape, sizes, shards)
    if count > CLASS_LIMIT:
        found = (class_goal(goal_state, {d: ways for d, _, ways in per_dim}),)
    else:
        found = _goal_states(goal_state, per_dim)
    if 0 in shape:
        return tuple(dict.fromkeys(unreduced_goal(s, shape) for s in found))
    return found


def _class_ways(goal_state: tuple, shape: tuple, sizes: tuple, shards: tuple):
    """Per tiny tensor dim with more than one, ``(d, its mesh dims sorted, ways)``: the
    ``(placements, order)`` of its mesh dims that chunk it as ``goal_state`` does; and the
    size of the goal class (the product of their counts)."""
    codes, chains = goal_state
    tiny = tiny_dims(shape, sizes, shards)
    per_dim = []
    count = 1
    for d, chain in enumerate(chains):
        if not chain or not tiny[d] or shape[d] == 0:
            continue  # (elsewhere two shard orders never hold the same pieces)
        dims = tuple(sorted(chain))
        sig_of, members = piece_classes(
            shape[d], dims, sizes, tuple(c for c in shards if c[0] == d)
        )
        ways = members[sig_of[tuple(codes[x] for x in dims), chain]]
        ways = [(own, order) for own, orders in ways.items() for order in orders]
        if len(ways) > 1:
            count *= len(ways)
            per_dim.append((d, dims, ways))
    return per_dim, count


def _goal_states(goal_state: tuple, per_dim: list) -> tuple:
    """Every state of the goal class (:func:`_class_ways`), ``goal_state`` first."""
    codes, chains = goal_state
    out = [goal_state]
    for combo in itertools.product(*(ways for _, _, ways in per_dim)):
        new_codes, new_chains = list(codes), list(chains)
        for (d, dims, _), (own, order) in zip(per_dim, combo, strict=True):
            for x, c in zip(dims, own, strict=True):
                new_codes[x] = c
            new_chains[d] = order
        state = (tuple(new_codes), tuple(new_chains))
        if state != goal_state:
            out.append(state)
    return tuple(out)


def unreduced_goal(goal_state: tuple, shape: tuple) -> tuple:
    """The search goal of a plan to ``goal_state`` on a tensor of ``shape`` without
    elements. Along a tensor dim of length 0 every rank holds nothing however mesh dims
    shard it, so any state with the goal's Partial dims (and ops) and its shard orders of
    the other tensor dims holds the target's layout, whatever its remaining mesh dims do
    but Partial. As a state: ANY for the codes of those mesh dims (Replicate or sharding
    a dim of length 0 in the goal), and None for the orders of the dims of length 0
    (:func:`admits`)."""
    codes, chains = goal_state
    free = {m for d, chain in enumerate(chains) if shape[d] == 0 for m in chain}
    return (
        tuple(ANY if c == R or m in free else c for m, c in enumerate(codes)),
        tuple(None if shape[d] == 0 else chain for d, chain in enumerate(chains)),
    )


def class_goal(goal_state: tuple, ways: dict) -> tuple:
    """The search goal standing for every state of the layout of ``goal_state`` (a big goal
    class, :func:`goal_class`): ``ways`` gives per tiny tensor dim ``d`` the
    ``(placements, order)`` of its mesh dims (placements by sorted mesh dim) that chunk it
    as ``goal_state`` does, and the class is every choice of one per dim. As a state: the
    code ``SHARD_ANY - d`` for those mesh dims (any shard placement of ``d``, for the
    heuristic) and the frozen set of ways for ``d``'s order (:func:`admits`).

    >>> class_goal((((0, 1), (0, 1)), ((0, 1),)), {0: [(((0, 1), (0, 1)), (0, 1)),
    ...                                                  (((0, 1), (0, 1)), (1, 0))]})
    ((-3, -3), (frozenset({(((0, 1), (0, 1)), (0, 1)), (((0, 1), (0, 1)), (1, 0))}),))
    """
    codes, chains = list(goal_state[0]), list(goal_state[1])
    for d, options in ways.items():
        for m in chains[d]:
            codes[m] = SHARD_ANY - d
        chains[d] = frozenset(options)
    return tuple(codes), tuple(chains)


def is_pattern(state: tuple) -> bool:
    """Whether ``state`` is a goal pattern (:func:`unreduced_goal`, :func:`class_goal`)."""
    return any(type(chain) is not tuple for chain in state[1])


def admits(goal: tuple, state: tuple) -> bool:
    """Whether ``state`` is one of those the pattern ``goal`` stands for: its codes, where
    a goal code ANY takes any but a Partial (and a SHARD_ANY code any, its order decides),
    and its shard orders, where a goal order None takes any, and a set of ways (of
    :func:`class_goal`) the state's placements and order of that tensor dim if it holds
    them."""
    codes = state[0]
    for g, c in zip(goal[0], codes, strict=True):
        if g == ANY:
            if type(c) is int and c != R:
                return False
        elif g != c and not (type(g) is int and g <= SHARD_ANY):
            return False
    for g, chain in zip(goal[1], state[1], strict=True):
        if g is None or g == chain:
            continue
        if type(g) is tuple:
            return False
        if (tuple([codes[m] for m in sorted(chain)]), chain) not in g:
            return False
    return True

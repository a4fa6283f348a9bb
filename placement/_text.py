"""Text forms: ``str(spec)`` and parsing placements back (``parse_placements``)."""

from __future__ import annotations

import re

from meshplan.errors import PlacementError
from meshplan.layout._ints import brief

from ._types import Partial, Placement, Replicate, Shard, StridedShard

__all__ = ["format_placements", "parse_placements"]


def format_placements(placements, shard_order=None) -> str:
    """Placements as text; a non-default shard order shows on its first mesh dim.

    >>> format_placements((Shard(0), Shard(0), Replicate()), {0: (1, 0)})
    'S(0)[1,0] S(0) R'
    """
    try:
        shard_order = dict(shard_order or {})
        placements = tuple(placements)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: truth of a tensor
        raise PlacementError(
            f"format_placements takes placements and a mapping tensor dim -> mesh dims, got "
            f"{brief(placements)} and {brief(shard_order)}",
            value=shard_order,
        ) from None
    shown: set[int] = set()
    parts = []
    for p in placements:
        if not isinstance(p, Placement):
            raise PlacementError(
                f"format_placements: {brief(p)} in {brief(placements)} is not a placement; give Shard, "
                "StridedShard, Replicate or Partial values (parse text with parse_placements)",
                value=p,
            )
        text = str(p)
        if isinstance(p, Shard | StridedShard):
            order = tuple(shard_order.get(p.dim, ()))
            if p.dim not in shown and list(order) != sorted(order):
                text += "[" + ",".join(map(str, order)) + "]"
            shown.add(p.dim)
        parts.append(text)
    return " ".join(parts)


# digits are ASCII [0-9] only: ``\d`` and ``int`` also take other scripts' digits ("S(٣)")
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<ss>SS|_S)\(\s*(?P<ssd>-?[0-9]+)\s*,\s*(?P<sf>[0-9]+)\s*\)
      | S\(\s*(?P<sd>-?[0-9]+)\s*\)
      | (?P<r>R)\b
      | P(?:\(\s*(?P<op>\w+)\s*\))?
    )(?:\[(?P<order>[0-9,\s]*)\])?(?=\s|$)\s*""",
    re.VERBOSE,
)


def parse_placements(text: str) -> tuple[tuple[Placement, ...], dict[int, tuple[int, ...]]]:
    """Parse ``"S(0)[1,0] S(0) R P(sum)"`` into placements and a shard order.

    ``SS(d,sf)`` (or torch's ``_S(d, sf)``) is a StridedShard; a bare ``P`` is
    ``Partial("sum")``; ``[i,j]`` after a shard gives its tensor dim's shard order.

    >>> parse_placements("S(0)[1,0] S(0) R")
    ((Shard(0), Shard(0), Replicate()), {0: (1, 0)})
    >>> parse_placements("P(max) SS(1,2)")[0]
    (Partial('max'), StridedShard(1, 2))
    """
    if not isinstance(text, str):
        raise PlacementError(
            f"parse_placements takes a string such as 'S(0) R P(sum)', got {text!r}", value=text
        )
    placements: list[Placement] = []
    order: dict[int, tuple[int, ...]] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise PlacementError(
                f"cannot parse placements {text!r} at {text[pos:]!r}; write e.g. "
                "'S(0) SS(1,2) R P(sum)', with '[1,0]' after a shard for its order",
                value=text,
            )
        if m.group("ss"):
            p: Placement = StridedShard(int(m.group("ssd")), int(m.group("sf")))
        elif m.group("sd") is not None:
            p = Shard(int(m.group("sd")))
        elif m.group("r"):
            p = Replicate()
        else:
            p = Partial(m.group("op") or "sum")
        if m.group("order") is not None:
            if not isinstance(p, Shard | StridedShard):
                raise PlacementError(
                    f"shard order given after {p} in {text!r}; only shards take an order",
                    value=text,
                )
            nums = [s for s in m.group("order").replace(" ", "").split(",") if s]
            if p.dim in order:
                raise PlacementError(
                    f"{text!r} gives tensor dim {p.dim}'s shard order twice; write it once, "
                    "after its first shard",
                    value=text,
                )
            order[p.dim] = tuple(int(s) for s in nums)
        placements.append(p)
        pos = m.end()
    return tuple(placements), order

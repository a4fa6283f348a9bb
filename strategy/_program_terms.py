"""Pricing a program's terms and the op-by-op baseline (no torch; numpy when used).

The objective's terms are redistributions: from a fixed argument spec into an op's
input (``"fixed"``), from a producer's output into a consumer's input (``"pair"``), and
from an op's output to a fixed output or gradient spec (``"sink"``). Each term prices a
pair of spec numbers; :func:`_matrix` builds a term's price table over the two ops'
candidates, each distinct pair priced once.
"""

from __future__ import annotations

__all__ = ["order_too_wide", "greedy", "term_sides", "pair_count", "all_pairs", "matrix"]


def order_too_wide(unary, pairs, max_factor: int) -> bool:
    """Whether :func:`._solve.solve` leaves the pairwise problem to its bounds."""
    from ._solve import elimination_order

    return elimination_order([len(u) for u in unary], pairs.keys(), max_factor) is None


def greedy(calls, var, graph, terms, ins, outs_, unary, pairs, price, exact_price):
    """Each op in order takes its cheapest option given its producers' choices (exact prices)."""
    from ._solve import Solution, total

    choice = [0] * len(unary)  # variables past the calls (free arguments) keep option 0
    inputs_of: dict[int, list] = {}
    for t in terms:
        if t[0] == "fixed":
            inputs_of.setdefault(t[1], []).append(("fixed", t[2], t[3]))
        elif t[0] == "pair":
            inputs_of.setdefault(t[3], []).append(("pair", t[4], t[1], t[2]))
    for node in calls:  # a topological order
        c = var[node]
        best = None
        for k in range(len(ins[c])):
            cost = float(unary[c][k]) - _fixed_part(inputs_of.get(c, ()), ins[c][k], price)
            for entry in inputs_of.get(c, ()):
                if entry[0] == "fixed":
                    cost += exact_price(entry[2], ins[c][k][entry[1]])
                else:
                    _, i, p, j = entry
                    cost += exact_price(outs_[p][choice[p]][j], ins[c][k][i])
            if best is None or cost < best[0]:
                best = (cost, k)
        choice[c] = best[1]
    value = total(choice, unary, pairs)
    return Solution(tuple(choice), value, 0.0, "op by op")


def _fixed_part(entries, option_ins, price) -> float:
    """What ``unary`` already holds for an option's fixed inputs (replaced by exact prices)."""
    return sum(price(e[2], option_ins[e[1]]) for e in entries if e[0] == "fixed")


def term_sides(t, ins, outs_) -> tuple[list[int], list[int]]:
    if t[0] == "fixed":
        _, c, i, src = t
        return [src], list(dict.fromkeys(row[i] for row in ins[c]))
    if t[0] == "sink":
        _, c, j, dst = t
        return list(dict.fromkeys(row[j] for row in outs_[c])), [dst]
    _, p, j, c, i = t
    return (
        list(dict.fromkeys(row[j] for row in outs_[p])),
        list(dict.fromkeys(row[i] for row in ins[c])),
    )


def pair_count(terms, ins, outs_) -> int:
    n = 0
    for t in terms:
        a, b = term_sides(t, ins, outs_)
        n += len(a) * len(b)
    return n


def all_pairs(terms, ins, outs_):
    for t in terms:
        a, b = term_sides(t, ins, outs_)
        for x in a:
            for y in b:
                yield x, y


def matrix(srcs: list[int], dsts: list[int], price):
    """``price(src, dst)`` for every pair of spec numbers, each distinct pair priced once."""
    import numpy as np

    us, ud = list(dict.fromkeys(srcs)), list(dict.fromkeys(dsts))
    row = {s: i for i, s in enumerate(us)}
    col = {d: j for j, d in enumerate(ud)}
    small = np.array([[price(s, d) for d in ud] for s in us], dtype=float)
    return small[np.array([row[s] for s in srcs])][:, np.array([col[d] for d in dsts])]

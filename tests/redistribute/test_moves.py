"""The search's moves, against definitions that know nothing of how the search builds them.

* all_permutes, found through permute hubs: from a state, exactly the states with the same
  sharding mesh dims (and every other dim's placement) whose shard orders differ from its
  own in at least two mesh dims after their common prefixes; each through exactly one hub;
* the exact check of a merged all_gather / all_to_all / reduce_scatter on index intervals,
  one tensor dim at a time, agrees with the exchange bookkeeping of the whole step;
* the exact check's canonical form (mesh dims renamed) gives the answer of the check itself;
* moves shared by the tensor shapes of a mesh (merged steps) give each shape its own plan.
"""

from __future__ import annotations

import collections
import itertools
import math

from _plan_cases import context_of, spec_pairs
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Spec
from meshplan.redistribute import CostModel
from meshplan.redistribute import _merge as M
from meshplan.redistribute._engine import _encoding as N
from meshplan.redistribute._engine import _exact as E
from meshplan.redistribute._engine import _price as Pr
from meshplan.redistribute._engine import _table as T
from meshplan.redistribute._engine._edges import permutes
from meshplan.redistribute._engine._encoding import R
from meshplan.redistribute._engine._merged_moves import valid_moving_merge
from meshplan.redistribute._engine._permutes import hub_members, hubs_of
from meshplan.redistribute._engine._problem import Problem
from meshplan.redistribute._store import default_planner

MODEL = CostModel.default()
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _context(src, dst, merge=True):
    return context_of(src, dst, MODEL, merge=merge)


def _suffix_mask(a, b) -> int:
    """The mesh dims (bits) after the common prefix of two states' orders, per tensor dim
    (a prefix entry agrees in mesh dim and placement)."""
    (codes, chains), (new_codes, new_chains) = a, b
    mask = 0
    for x, y in zip(chains, new_chains, strict=True):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k] and codes[x[k]] == new_codes[y[k]]:
            k += 1
        for m in x[k:] + y[k:]:
            mask |= 1 << m
    return mask


def _states(ctx, limit=3000):
    """Every state of the context, or None when it has more than ``limit``."""
    states = list(itertools.islice(T._states(ctx), limit + 1))
    return states if len(states) <= limit else None


@SLOW
@given(pair=spec_pairs(max_ranks=16, max_dims=4, max_side=6), data=st.data())
def test_permutes_through_hubs_are_every_permute(pair, data):
    src, dst = pair
    ctx = _context(src, dst, merge=False)
    states = _states(ctx)
    if states is None:
        event("too many states")
        return
    sharded = {s: frozenset(m for m, c in enumerate(s[0]) if type(c) is tuple) for s in states}
    several = [s for s in states if len(sharded[s]) >= 2]
    x = data.draw(st.sampled_from(several or states), label="state")
    codes = x[0]
    want = set()
    for y in states:
        if y == x or sharded[y] != sharded[x]:
            continue
        if any(y[0][m] != c for m, c in enumerate(codes) if m not in sharded[x]):
            continue
        mask = _suffix_mask(x, y)
        if mask & (mask - 1):  # at least two mesh dims exchange pieces
            want.add((y, tuple(m for m in range(len(codes)) if mask >> m & 1)))
    i = ctx.intern(x)
    with ctx.lock:
        got = [(ctx.states[t.target], t.dims) for t in permutes(ctx, i)]
        hubs = hubs_of(ctx, x)
    event(f"{len(want)} permutes" if len(want) < 10 else "10+ permutes")
    assert len(got) == len(set(got))  # each target once
    assert set(got) == want
    # every permute passes through exactly one of the state's hubs, the one permute_hub names
    through = collections.Counter()
    for hub, dims, _, _ in hubs:
        for y, _ in hub_members(ctx, hub):
            through[y] += 1
            assert Pr.permute_hub(x, y) == hub
            assert (y, dims) in want
    assert all(n == 1 for n in through.values())
    assert set(through) == {y for y, _ in want}


@st.composite
def merge_cases(draw):
    """A state on a small mesh, some of its mesh dims (at least two; sharding, or Partial
    for a reduce_scatter) and a state a merged all_gather / all_to_all / reduce_scatter
    over them might lead to: those dims leave their orders or join others anywhere. Short
    tensor dims and StridedShards, where the exact check decides, are common."""
    sizes = draw(
        st.lists(st.sampled_from([2, 2, 3, 4]), min_size=3, max_size=4).filter(
            lambda s: math.prod(s) <= 16
        ),
        label="mesh shape",
    )
    mesh = Mesh.create(tuple(sizes))
    shape = tuple(draw(st.lists(st.integers(0, 12), min_size=1, max_size=2), label="shape"))
    shards = [(d, 1) for d in range(len(shape))]
    shards += draw(
        st.lists(
            st.tuples(st.integers(0, len(shape) - 1), st.sampled_from([2, 3])),
            max_size=1,
            unique=True,
        ),
        label="strided",
    )
    shards = tuple(shards)
    ctx = default_planner().context(Problem(mesh, shape, "float64", MODEL, shards, (), None))
    dims = tuple(
        sorted(draw(st.sets(st.integers(0, len(sizes) - 1), min_size=2, max_size=2), label="dims"))
    )
    kind = draw(st.sampled_from(["all_gather", "all_to_all", "reduce_scatter"]), label="kind")
    codes = [
        1
        if m in dims and kind == "reduce_scatter"
        else draw(st.sampled_from(shards if m in dims else shards + (R,)), label=f"code of {m}")
        for m in range(len(sizes))
    ]
    chains = [[] for _ in shape]
    for m in draw(st.permutations(range(len(sizes))), label="joining order"):
        if type(codes[m]) is tuple:
            chains[codes[m][0]].append(m)
    a = (tuple(codes), tuple(tuple(c) for c in chains))
    for m in dims:
        chains = [[x for x in c if x != m] for c in chains]
        codes[m] = R
    if kind != "all_gather":
        for m in draw(st.permutations(dims), label="joining order"):
            code = draw(st.sampled_from(shards), label=f"new code of {m}")
            codes[m] = code
            chain = chains[code[0]]
            chain.insert(draw(st.integers(0, len(chain)), label=f"position of {m}"), m)
    b = (tuple(codes), tuple(tuple(c) for c in chains))
    return ctx, mesh, a, b, dims, kind


@SLOW
@given(case=merge_cases())
def test_merged_step_exact_check_agrees_with_the_exchange(case):
    ctx, mesh, a, b, dims, kind = case
    template = Spec(mesh, [Replicate()] * mesh.ndim, ctx.shape, "float64")
    ref = M._valid_merge(N.decode(template, a), N.decode(template, b), dims, kind)
    structural = not _suffix_mask(a, b) & ~sum(1 << m for m in dims)
    event(f"{kind} {'valid' if ref else 'invalid'}{'' if structural else ', by the exact check'}")
    assert valid_moving_merge(ctx, a, b, dims, kind) == ref


@given(
    length=st.integers(0, 12),
    data=st.data(),
)
def test_the_exact_checks_canonical_form_keeps_its_answer(length, data):
    sizes = data.draw(st.lists(st.sampled_from([2, 3, 4]), min_size=1, max_size=4), "sizes")
    names = data.draw(st.permutations(range(10)), label="mesh dim names")[: len(sizes)]

    def chain(label):
        dims = data.draw(st.lists(st.sampled_from(range(len(sizes))), unique=True), label)
        return tuple((names[m], sizes[m], data.draw(st.sampled_from([1, 1, 2, 3]))) for m in dims)

    src, dst = chain("src"), chain("dst")
    group = tuple(
        sorted(data.draw(st.sets(st.sampled_from(names), min_size=1, max_size=3), "group"))
    )
    # also a length every link of both orders divides evenly (taken down to the least one)
    base = math.lcm(math.prod(n * sf for _, n, sf in src), math.prod(n * sf for _, n, sf in dst))
    for n in (length, base * data.draw(st.integers(1, 3), label="multiple of the even length")):
        direct = E._covers.__wrapped__(n, src, dst, group)
        assert E.exact_covers(n, src, dst, group) == direct
        if len(group) == 1:
            assert E.exact_covers(n, src, dst, group[0]) == direct


@given(data=st.data())
def test_the_exact_check_on_powers_of_two_reads_index_bits(data):
    # sizes and split factors that are powers of two, on a length they all divide: the
    # check compares which index bits each mesh dim's coordinate is (``_bits_cover``);
    # the interval check must agree
    sizes = data.draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5), "sizes")

    def chain(label):
        dims = data.draw(st.lists(st.sampled_from(range(len(sizes))), unique=True), label)
        return tuple((m, sizes[m], data.draw(st.sampled_from([1, 1, 2, 4]))) for m in dims)

    src, dst = chain("src"), chain("dst")
    group = tuple(sorted(data.draw(st.sets(st.sampled_from(range(len(sizes))), min_size=1))))
    base = math.lcm(math.prod(n * sf for _, n, sf in src), math.prod(n * sf for _, n, sf in dst))
    length = base * data.draw(st.sampled_from([1, 2, 3]), label="multiple")
    direct = E._covers.__wrapped__(length, src, dst, group)
    event("covered" if direct else "not covered")
    assert E._bits_cover(base.bit_length() - 1, src, dst, group) == direct
    assert E.exact_covers(length, src, dst, group) == direct


@settings(SLOW, max_examples=min(settings.default.max_examples, 100))
@given(
    pair=spec_pairs(max_ranks=8, max_dims=3, max_aliases=2),
    other=st.lists(st.integers(0, 9), min_size=3, max_size=3),
)
def test_merged_moves_shared_across_shapes_give_every_shape_its_own_plan(pair, other):
    # the merged moves out of a state are generated once per mesh shape, aliases' dims,
    # placement universe and tiny dims' lengths, and shared by every tensor shape:
    # planning another shape first, or the same pair on the mesh with other aliases, must
    # not change a plan
    from meshplan.redistribute import clear_plan_cache, plan

    src, dst = pair
    mesh = src.mesh
    assume(mesh.aliases)
    shape = tuple(other[: src.ndim])
    try:
        a = Spec(mesh, src.placements, shape, src.dtype, src.shard_order)
        b = Spec(mesh, dst.placements, shape, dst.dtype, dst.shard_order)
    except PlacementError:
        return
    bare = Mesh.create(mesh.shape, mesh.names, ranks=mesh.ranks)
    wide = bare.flatten(mesh.names, "all") if len(mesh.names) > 1 else bare
    clear_plan_cache()
    alone = plan(src, dst)
    clear_plan_cache()
    plan(a, b)
    plan(*(Spec(wide, s.placements, s.shape, s.dtype, s.shard_order) for s in (src, dst)))
    assert plan(src, dst) == alone

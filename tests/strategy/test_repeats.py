"""Repeated layers planned once: found in real model families, tied only where alike, and
bounded truly (the tied plan's bound never exceeds the untied exact minimum)."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from _model_families import batch, make, param_specs
from _program_cases import transformer, transformer_args
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.redistribute import Planner
from meshplan.strategy import plan_module, plan_program
from meshplan.strategy.programs._recompute import layer_groups, with_recompute
from meshplan.strategy.programs._repeats import find_repeats
from meshplan.strategy.programs._trace import trace


def _stack(layers: int):
    def fn(x, *ws):
        for w in ws:
            x = torch.relu(x @ w) + x
        return x.sum()

    return fn


def _graph(fn, specs):
    return trace(fn, specs, tuple(s.dtype == "float64" for s in specs))


def _fixed(graph, specs):
    return dict(zip(graph.args, specs, strict=True))


@pytest.mark.parametrize("layers", [1, 3, 4, 6])
def test_a_stack_of_four_or_more_equal_layers_ties_every_layer_to_the_first(layers):
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 8), "float64")
    w = Spec(mesh, [Replicate()], (8, 8), "float64")
    specs = (x, *[w] * layers)
    g = _graph(_stack(layers), specs)
    r = find_repeats(g, _fixed(g, specs))
    if layers < 4:  # too few to be worth the looser bound
        assert r is None
        return
    assert r.layers == layers
    for a, b in r.tie.items():
        assert g.nodes[a].call == g.nodes[b].call
        assert a not in r.tie.values()  # a representative is tied to nothing
    untied = [n for n in g.calls if n not in r.tie]
    # every layer past the first is tied, and the program keeps one layer's variables
    assert len(untied) <= len(g.calls) - (layers - 1) * len(r.blocks[0]) + layers


def test_a_layer_whose_weight_lies_otherwise_is_not_tied_where_it_differs():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 8), "float64")
    w = Spec(mesh, [Replicate()], (8, 8), "float64")
    odd = Spec(mesh, [Shard(1)], (8, 8), "float64")
    specs = (x, w, w, odd, w, w)
    g = _graph(_stack(5), specs)
    r = find_repeats(g, _fixed(g, specs))
    assert r is not None
    odd_node = g.args[3]
    readers = [n for n in g.calls if any(v.node == odd_node for v in g.nodes[n].inputs)]
    assert readers and not any(n in r.tie for n in readers)


def test_tie_layers_must_be_a_bool():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 8), "float64")
    with pytest.raises(StrategyError, match="tie_layers"):
        plan_program(lambda x: x.sum(), x, tie_layers="yes")


_PLACEMENTS = [Replicate(), Shard(0), Shard(1)]


def _tied_only(fn, *specs, **kw):
    """The tied plan alone (no untied solve past UNTIE_GAP): the tied path's own laws."""
    from meshplan.strategy.programs import _program

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_program, "UNTIE_LAYERS", 0)
        return plan_program(fn, *specs, **kw)


@settings(max_examples=8)
@given(
    layers=st.integers(4, 5),
    shape=st.just((2,)),
    data=st.data(),
)
def test_the_tied_plan_is_bounded_truly_and_costs_no_less_than_the_untied_minimum(
    layers, shape, data
):
    mesh = Mesh.create(shape)
    pick = st.lists(st.sampled_from(_PLACEMENTS), min_size=len(shape), max_size=len(shape))
    x = Spec(mesh, data.draw(pick), (8, 8), "float64")
    w = Spec(mesh, data.draw(pick), (8, 8), "float64")
    specs = (x, *[w] * layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        untied = plan_program(_stack(layers), *specs, tie_layers=False)
        # a small max_factor: the untied problem does not solve exactly, the layers tie
        tied = _tied_only(_stack(layers), *specs, max_factor=8)
    assume(untied.method == "exact")  # the untied minimum is known
    assert "planned as one" in tied.method
    lo = untied.cost.total
    eps = 1e-12 * max(lo, 1e-30)
    assert tied.lower_bound <= lo + eps
    assert tied.cost.total >= lo - eps
    assert tied.lower_bound <= tied.cost.total + eps


@settings(max_examples=10, deadline=None)
@given(layers=st.integers(4, 5), data=st.data())
def test_a_tied_plan_is_bound_no_looser_than_the_untied_plan_past_the_untie_gap(layers, data):
    # tying restricts the choice and the parts' bound may be far looser than the untied
    # solve's (a stack on (2, 2): 18% against an exact untied plan); past UNTIE_GAP the
    # untied problem is solved too and the tighter bound (and the cheaper plan) is kept
    from meshplan.strategy.programs._program import untie_gap

    gap = untie_gap(layers)

    mesh = Mesh.create((2, 2))
    pick = st.lists(st.sampled_from(_PLACEMENTS), min_size=2, max_size=2)
    x = Spec(mesh, data.draw(pick), (8, 8), "float64")
    w = Spec(mesh, data.draw(pick), (8, 8), "float64")
    specs = (x, *[w] * layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tied = plan_program(_stack(layers), *specs)
        untied = plan_program(_stack(layers), *specs, tie_layers=False)
    cost = tied.cost.total
    eps = 1e-12 * cost
    assert tied.lower_bound >= untied.lower_bound - gap * cost - eps
    assert tied.lower_bound <= untied.cost.total + eps  # a true bound of the untied minimum
    assert cost * (1 - gap) <= untied.cost.total + eps


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "nanogpt", "encoder"])
def test_a_four_layer_family_plans_its_layers_as_one_and_matches_one_process(name):
    from test_model_families import _check_against_one_process

    mesh = Mesh.create((2, 2))
    model = make(name, layers=4)
    ids, _ = batch()
    b = Spec(mesh, [Shard(0), Replicate()], ids.shape, "int64")
    from meshplan.strategy.programs import _program

    with pytest.MonkeyPatch.context() as patch:  # the tied plan alone (see _tied_only)
        patch.setattr(_program, "UNTIE_LAYERS", 0)
        mp = plan_module(model, b, b, specs=param_specs(model, 2), strict=True)
    assert "4 layers planned as one" in mp.program.method
    assert mp.program.lower_bound <= mp.program.cost.total
    r = find_repeats(mp.program.graph, {**_fixed(mp.program.graph, mp.program.arg_specs)})
    chosen = {op.node: (op.input_specs, op.output_specs) for op in mp.program.ops}
    for a, rep in r.tie.items():
        if a in chosen:  # tied calls take one option
            assert chosen[a] == chosen[rep]
    _check_against_one_process(model, mp)


def test_free_weights_of_tied_layers_share_one_layout_and_the_bound_holds():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 8), "float64")
    w = Spec(mesh, [Replicate()], (8, 8), "float64")
    specs = (x, *[w] * 4)
    g = _graph(_stack(4), specs)
    r = find_repeats(g, {g.args[0]: x}, g.args[1:])
    assert r is not None
    assert len({r.tie.get(a, a) for a in g.args[1:]}) == 1  # one variable for all four
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        untied = plan_program(_stack(4), *specs, choose=(1, 2, 3, 4), tie_layers=False)
        tied = _tied_only(_stack(4), *specs, choose=(1, 2, 3, 4), max_factor=8)
    assert "planned as one" in tied.method
    assert len(set(tied.arg_specs[1:])) == 1
    eps = 1e-12 * untied.cost.total
    if untied.method == "exact":
        assert tied.lower_bound <= untied.cost.total + eps
    assert tied.cost.total >= untied.lower_bound - eps


@pytest.mark.parametrize("share", [0.3, 0.6])
def test_under_a_memory_budget_the_tied_bound_holds_and_the_budget_is_kept(share):
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 8), "float64")
    w = Spec(mesh, [Replicate()], (8, 8), "float64")
    specs = (x, *[w] * 4)
    free = (1, 2, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ws = Spec(mesh, [Shard(0)], (8, 8), "float64")
        hi = plan_program(_stack(4), *specs).memory.total  # every weight whole
        lo = plan_program(_stack(4), x, *[ws] * 4).memory.total  # every weight sharded
        budget = lo + share * (hi - lo)
        untied = plan_program(_stack(4), *specs, choose=free, state_budget=budget, tie_layers=False)
        tied = _tied_only(_stack(4), *specs, choose=free, state_budget=budget, max_factor=8)
    assert "planned as one" in tied.method
    assert tied.memory.total <= budget
    eps = 1e-12 * untied.cost.total
    if untied.method == "exact":
        assert tied.lower_bound <= untied.cost.total + eps
        assert tied.cost.total >= untied.cost.total - eps


@pytest.mark.parametrize("share", [0.3, 0.6])
def test_a_tied_programs_bound_alone_skips_the_settled_round_and_stays_true(share, monkeypatch):
    # the bound over every recompute choice (recompute="auto") reads only the plan's
    # bound, and a tied program's is its parts': no settled round (a final solve and a
    # budget's branch and bound) tightens the tied problem's own
    from meshplan.strategy.programs import _program, _program_solve

    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 8), "float64")
    w = Spec(mesh, [Replicate()], (8, 8), "float64")
    ws = Spec(mesh, [Shard(0)], (8, 8), "float64")
    specs, free = (x, *[w] * 4), (1, 2, 3, 4)
    graph = _graph(_stack(4), specs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hi = _program._plan_graph(graph, specs).memory.total
        lo = _program._plan_graph(graph, (x, *[ws] * 4)).memory.total
        budget = lo + share * (hi - lo)
        untied = _program._plan_graph(
            graph, specs, choose=free, state_budget=budget, tie_layers=False
        )
        settled = []
        real = _program.solve_lazily

        def spy(*a, **kw):
            settled.append(kw.get("settle", True))
            return real(*a, **kw)

        drafts = []
        real_round = _program_solve._solve_round

        def round_spy(obj, prices, planning, options, *rest):
            drafts.append(options.draft)
            return real_round(obj, prices, planning, options, *rest)

        monkeypatch.setattr(_program, "solve_lazily", spy)
        monkeypatch.setattr(_program_solve, "_solve_round", round_spy)
        monkeypatch.setattr(_program, "UNTIE_LAYERS", 0)
        # a planner of its own: the default one may keep this answer from an earlier test,
        # and a kept answer is recalled without any round
        bound = _program._plan_graph(
            graph,
            specs,
            choose=free,
            state_budget=budget,
            max_factor=8,
            bound_only=True,
            planner=Planner(),
        )
    assert "planned as one" in bound.method
    assert settled == [False]
    assert drafts and all(drafts)  # every round a draft: no final solve, no branching
    # a true bound is at most any plan's cost within the budget (the minimum where the
    # untied plan is exact)
    assert bound.lower_bound <= untied.cost.total * (1 + 1e-12)


def test_a_draft_answer_is_kept_apart_from_a_settled_one(monkeypatch):
    # the planner keeps each whole-program answer under its objective's content and the
    # solve's settings: the bound's draft (no settled round) is not the answer a plan that
    # keeps its choice recalls
    from meshplan.strategy.programs import _program, _program_solve

    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 8), "float64")
    w = Spec(mesh, [Replicate()], (8, 8), "float64")
    specs, free = (x, *[w] * 4), (1, 2, 3, 4)
    graph = _graph(_stack(4), specs)
    solved = []  # per solve_lazily call: (settle, whether its rounds ran)
    real, real_rounds = _program.solve_lazily, _program_solve._solve_rounds
    ran = []

    def spy(*a, **kw):
        ran.clear()
        sol = real(*a, **kw)
        solved.append((kw.get("settle", True), bool(ran)))
        return sol

    def rounds_spy(*a, **kw):
        ran.append(1)
        return real_rounds(*a, **kw)

    monkeypatch.setattr(_program, "solve_lazily", spy)
    monkeypatch.setattr(_program_solve, "_solve_rounds", rounds_spy)
    monkeypatch.setattr(_program, "UNTIE_LAYERS", 0)
    planner = Planner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = dict(choose=free, max_factor=8, planner=planner)
        _program._plan_graph(graph, specs, bound_only=True, **args)
        _program._plan_graph(graph, specs, bound_only=True, **args)
        _program._plan_graph(graph, specs, **args)
    # the draft solved, recalled the second time; the settled plan's solve ran its rounds
    assert solved[:3] == [(False, True), (False, False), (True, True)]


def test_every_layer_recomputed_ties_as_much_of_the_program_as_none_recomputed():
    # a recomputed layer's forward feeds only the next layer and its copies (its repeat
    # was placed one layer off, the free weights it reads then paired crosswise); and the
    # copies broke the backward's period where the last layer lacks a residual sum (at
    # real depth half the backward went untied and was planned layer by layer)
    from meshplan.strategy.programs._program import _ties

    layers = 4
    mesh = Mesh.create((2, 2))
    _, specs = transformer_args(mesh, layers=layers)
    grad = [s.dtype == "float64" for s in specs]
    free = [i for i, r in enumerate(grad) if r]
    fn = functools.partial(transformer, layers=layers)
    g = trace(fn, specs, grad)

    def fixed(graph):
        out = {
            k: s for i, (k, s) in enumerate(zip(graph.args, specs, strict=True)) if i not in free
        }
        return out | dict.fromkeys(graph.cotangents)

    plain = find_repeats(g, fixed(g), [g.args[i] for i in free])
    rc = with_recompute(g, layer_groups(g, plain.blocks))
    tied = find_repeats(rc, fixed(rc), [rc.args[i] for i in free])
    assert tied.layers == plain.layers == layers
    copies = dict(rc.recomputes)
    # the same calls of every layer past the first; each copy in its original's layer
    assert len([c for c in tied.tie if c not in copies]) == len(plain.tie)
    home = {n: k for k, b in enumerate(tied.blocks) for n in b}
    assert all(home[c] == home[o] for c, o in copies.items() if o in home)
    # the planner's ties: each copy shares its original's variable, so the copies of
    # every layer share the first layer's, as their originals do
    ties = _ties(rc, tied)
    for c, o in rc.recomputes:
        assert ties[c] == ties.get(o, o)
    assert len(set(ties.values())) == len(set(_ties(g, plain).values()))


@pytest.mark.slow
def test_a_hugging_face_llama_recomputed_ties_every_layer_as_without_recompute(monkeypatch):
    # its last layer's backward lacks the residual gradient's sum the others have; the
    # copies fell before that point and cut the backward's run to three of four layers
    transformers = pytest.importorskip("transformers")
    import meshplan.strategy.programs._program as program_module

    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=4, max_position_embeddings=32,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    mesh = Mesh.create((2, 2))
    ids = Spec(mesh, [Shard(0), Replicate()], (4, 8), "int64")
    seen = {}

    class Captured(Exception):
        pass

    def capture(fn, *specs, requires_grad, **_):
        seen.update(fn=fn, specs=specs, grad=requires_grad)
        raise Captured  # traced below instead

    monkeypatch.setattr(program_module, "plan_program", capture)
    with pytest.raises(Captured):
        plan_module(model, ids, forward=lambda m, x: m(input_ids=x, labels=x).loss)
    g = trace(seen["fn"], seen["specs"], seen["grad"])
    free = [g.args[i] for i, r in enumerate(seen["grad"]) if r]
    fixed = {k: s for k, s, r in zip(g.args, seen["specs"], seen["grad"], strict=True) if not r}
    plain = find_repeats(g, fixed | dict.fromkeys(g.cotangents), free)
    rc = with_recompute(g, layer_groups(g, plain.blocks))
    fixed_rc = {k: s for k, s, r in zip(rc.args, seen["specs"], seen["grad"], strict=True) if not r}
    tied = find_repeats(rc, fixed_rc | dict.fromkeys(rc.cotangents), free)
    assert plain.layers == tied.layers == 4
    copies = dict(rc.recomputes)
    assert len([c for c in tied.tie if c not in copies]) == len(plain.tie)
    # each copy tied as its original: the layers' parts of the bound are alike
    assert all(tied.tie.get(c) == tied.tie.get(o, o) for c, o in copies.items())


def test_the_rounds_answer_the_cheapest_choice_priced_exactly(monkeypatch):
    # a settled round's choice at prices it then raises may cost more than the draft
    # priced exactly before it (Llama-3 70B: a draft at 1.0803 s, the settled answer at
    # 1.0966 s): the rounds answer the draft, with the best bound of every round
    from meshplan.strategy.programs import _program_solve
    from meshplan.strategy.solver import Method, Solution

    # per round: the solve's answer (at the prices it saw) and the new pairs it priced
    script = [
        (Solution((0,), 1.00, 0.50, Method.RELAXATION), 3),
        (Solution((1,), 1.10, 0.90, Method.RELAXATION), 0),  # exact: settle
        (Solution((2,), 1.05, 0.95, Method.RELAXATION), 2),  # cheaper until priced
        (Solution((3,), 1.20, 0.97, Method.RELAXATION), 0),
    ]
    exact_cost = {0: 1.3, 1: 1.10, 2: 1.25, 3: 1.20}
    rounds = iter(script)
    learned = {}

    class Obj:
        node_weights: dict = {}  # no whole-step budget

        def at(self, prices):
            return self

        def evaluate(self, choice):
            return exact_cost[choice[0]]

    class Prices:
        def learn_used(self, problem, choice):
            return learned[choice]

    def scripted(obj, prices, planning, options, *rest):
        sol, new = next(rounds)
        learned[sol.choice] = new
        return sol

    monkeypatch.setattr(_program_solve, "_solve_round", scripted)
    planning = _program_solve.Planning.WHOLE
    sol = _program_solve._solve_rounds(Obj(), Prices(), planning, 8, 50, None, (), True, None)
    assert (sol.choice, sol.cost, sol.bound) == ((1,), 1.10, 0.97)
    # out of rounds: the last answer's cost at the prices it raised decides
    rounds, learned = iter(script[:3]), {}
    sol = _program_solve._solve_rounds(Obj(), Prices(), planning, 8, 3, None, (), True, None)
    assert (sol.choice, sol.cost) == ((1,), 1.10)


def test_the_linked_layer_is_bounded_again_while_its_choice_learns_prices(monkeypatch):
    # the tied bound's linked layer: each time pricing its choice's moves exactly gives
    # new prices the layer is bounded again at them, and the loop ends where it gives none
    from meshplan.strategy.programs import _program_parts, _program_solve
    from meshplan.strategy.solver import has_lp

    if not has_lp():
        pytest.skip("the linked layer's choice is its transportation LP's")
    calls = []  # per tied bound, what its linked layer went through
    real = _program_parts.parts_bound

    def spy(*args):
        *head, reprice, target = args
        solve_part = head[5]
        events = []
        calls.append(events)

        def solve_spy(problem, n, links=(), choice=(), lp=True):
            out = solve_part(problem, n, links=links, choice=choice, lp=lp)
            if links:
                events.append("solve")
            return out

        def reprice_spy(problem, choice):
            new = reprice(problem, choice)
            events.append("new prices" if new is not None else "exact")
            return new

        head[5] = solve_spy
        return real(*head, reprice_spy, target)

    monkeypatch.setattr(_program_solve, "parts_bound", spy)
    mesh = Mesh.create((2, 2))
    x = Spec(mesh, [Shard(0), Replicate()], (8, 8), "float64")
    w = Spec(mesh, [Replicate(), Replicate()], (8, 8), "float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tied = _tied_only(_stack(6), x, *[w] * 6, choose=range(1, 7), planner=Planner())
    assert "planned as one" in tied.method
    assert calls and all(events and events[0] == "solve" for events in calls)
    for events in calls:
        solves = events.count("solve")
        assert 1 <= solves <= 1 + _program_parts.REPRICE_ROUNDS
        # solve, then reprice; a solve again only after new prices; the end: exact, or the
        # rounds ran out
        for a, b in zip(events, events[1:], strict=False):
            assert (a, b) in {("solve", "new prices"), ("solve", "exact"), ("new prices", "solve")}
        assert events[-1] == "exact" or solves == 1 + _program_parts.REPRICE_ROUNDS


@pytest.mark.slow
def test_the_parts_alone_beside_the_run_bounded_as_one_tighten_the_bound_and_keep_it_true():
    # a 4-layer encoder on (2, 2): its first and last layers and the calls around them,
    # bounded apart, left the bound 4.9% under the tied plan (the moves between those
    # parts split between them unpriced); bounded as one part, the bound meets the plan.
    # Either way it stays below the untied program's cost (a true bound of its minimum)
    from meshplan.strategy.programs import _program, _program_solve

    mesh = Mesh.create((2, 2))
    model = make("encoder", layers=4)
    ids, _ = batch()
    b = Spec(mesh, [Shard(0), Replicate()], ids.shape, "int64")
    specs = param_specs(model, 2)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for merge_gap in (2.0, -1.0):  # never merged, merged whatever the gap
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(_program_solve, "MERGE_GAP", merge_gap)
                patch.setattr(_program, "UNTIE_LAYERS", 0)  # the tied plan alone
                program = plan_module(model, b, b, specs=specs, planner=Planner()).program
            assert "4 layers planned as one" in program.method
            out[merge_gap] = program
        untied = plan_module(model, b, b, specs=specs, tie_layers=False).program
    apart, merged = out[2.0], out[-1.0]
    cost = merged.cost.total
    eps = 1e-12 * cost
    assert apart.cost.total == pytest.approx(cost, rel=1e-12)
    assert apart.lower_bound < cost * (1 - 0.02)
    assert merged.lower_bound >= apart.lower_bound - eps
    assert merged.lower_bound >= cost * (1 - 0.005)
    assert merged.lower_bound <= untied.cost.total + eps

"""Plans stay what they were: a stored sample of 1,020 pairs (4-D tensors on (2,2,2,2)
with StridedShards and Partials, 3-D and 4-D activations, 2-D weights on 1-D to 4-D
meshes; ``_stored_plans.py``) planned again within the default budget gives each pair
the stored plan, or a cheaper one."""

from __future__ import annotations

import time
import warnings

import pytest
from _stored_plans import pairs, plan_text, read, spec_text

from meshplan.errors import BudgetWarning, MeshplanError
from meshplan.redistribute import Planner, cost, plan

SAMPLE = read()


def _check(rows, planner: Planner) -> list[str]:
    bad = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetWarning)
        warnings.simplefilter("ignore", UserWarning)
        for src, dst, stored_cost, stored in rows:
            try:
                p = plan(src, dst, planner=planner)
            except MeshplanError as e:
                if stored != f"error:{type(e).__name__}":
                    bad.append(f"{src} -> {dst}: raised {e!r}, stored {stored}")
                continue
            text = plan_text(p)
            if text == stored:
                continue
            total = cost(p).total
            if stored_cost is None or total >= stored_cost * (1 - 1e-9):
                bad.append(f"{src} -> {dst}: {text} ({total}), stored {stored} ({stored_cost})")
    return bad


def test_the_sample_is_the_one_drawn():
    # the stored pairs are the generator's (so regenerating the file plans the same pairs)
    drawn = pairs()
    assert len(SAMPLE) == len(drawn) >= 1000
    for (src, dst, _, _), (a, b) in zip(SAMPLE, drawn, strict=True):
        assert (src, dst) == (a, b), (spec_text(src), spec_text(a))


def test_stored_plans_quick_sample():
    # every 10th of the cheap kinds (4-D activations on (2,2,2), 2-D weights on 1-D to
    # 4-D meshes, 1-D tensors on (2,)*5); the slow test below plans them all
    # (no time budget: the stored plans are proven minima, whatever the machine's load)
    bad = _check(SAMPLE[590::10], Planner(max_seconds=None))
    assert not bad, "\n".join(bad[:10])


@pytest.mark.slow
def test_stored_plans_identical_or_cheaper():
    t = time.perf_counter()
    bad = _check(SAMPLE, Planner(max_seconds=None))
    assert not bad, f"{len(bad)} of {len(SAMPLE)} pairs changed:\n" + "\n".join(bad[:10])
    print(f"{len(SAMPLE)} pairs in {time.perf_counter() - t:.1f} s")

"""The planner's plan tables stay built while they fit a byte budget: a count of tables
kept thrashed where a program has many contexts (Llama-3 70B's 105 contexts rebuilt
their tables 783 times under a 32-table limit)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

from meshplan.redistribute._engine import _table
from meshplan.redistribute._engine._table import Table, Tables, table_bytes


def _fake_build(ctx) -> Table:
    n = ctx.n
    return Table(list(range(n)), [()] * n, np.zeros((n, n)), np.zeros((n, n), dtype=np.int32))


class _Ctx(SimpleNamespace):
    __hash__ = object.__hash__  # a context is its own key, as a planner's are


def _ctx(n: int) -> _Ctx:
    return _Ctx(n=n, tabled=True, planned=0, lazy=0)


def test_many_small_tables_stay_built(monkeypatch):
    monkeypatch.setattr(_table, "_build", _fake_build)
    tables = Tables(threading.Lock(), "eager")
    ctxs = [_ctx(100) for _ in range(200)]
    for c in ctxs:
        assert tables.table(c) is not None
    assert all(tables.built(c) is not None for c in ctxs)


def test_the_least_recently_used_go_once_the_bytes_are_spent(monkeypatch):
    monkeypatch.setattr(_table, "_build", _fake_build)
    one = table_bytes(_fake_build(_ctx(100)))
    monkeypatch.setattr(_table, "KEEP_BYTES", 3 * one)
    tables = Tables(threading.Lock(), "eager")
    a, b, c, d = (_ctx(100) for _ in range(4))
    for x in (a, b, c):
        tables.table(x)
    tables.table(a)  # used again: b is now the least recent
    tables.table(d)
    assert tables.built(b) is None
    assert all(tables.built(x) is not None for x in (a, c, d))
    # one table larger than the whole budget is still kept (alone)
    big = _ctx(200)
    tables.table(big)
    assert tables.built(big) is not None
    assert [tables.built(x) for x in (a, c, d)] == [None] * 3
    tables.clear()
    assert tables.built(big) is None

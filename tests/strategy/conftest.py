"""Settings shared by the strategy tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _short_fit_mips(monkeypatch):
    """The MIP within a whole-step fit's rows (``_program_fit._by_limits``) gets 2 s a
    round here, not the planner's 20: the tests check what its plans and bounds satisfy,
    which holds at any time limit (on the 3-layer MLP of ``test_peak_rows`` it used 8-10 s
    of each round without closing its gap, three rounds a plan)."""
    from meshplan.strategy.programs import _program_fit

    monkeypatch.setattr(_program_fit, "LIMIT_MIP_SECONDS", 2.0)

"""The transportation LP's restricted model in HiGHS (:class:`_Restricted`): the ``x`` and
the columns added so far of a :class:`._transport._Model`, its memory rows after the
model's own, solved round by round from the last basis (highspy, when installed)."""

from __future__ import annotations

import functools
import math
import os
import sys

__all__: list[str] = []


@functools.cache
def _quiet_banner() -> None:
    """HiGHS prints its banner to the process's standard output (file descriptor 1, below
    Python's ``sys.stdout``) when its first instance in the process is made: make that
    one here, once, with the descriptor pointed at the null device, so a plan's output
    is the caller's own."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _Restricted:
    """The LP over the ``x`` and the units added so far, in one HiGHS model (each round
    warm-starts from the last)."""

    def __init__(self, model) -> None:  # (a ._transport._Model)
        import highspy
        import numpy as np

        self.m = model
        self.inf = highspy.kHighsInf
        _quiet_banner()
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        lp = highspy.HighsLp()
        # under a budget, its memory rows follow the model's own rows
        budgeted = 0 if model.mem is None else len(model.mem)
        xr, xc, xv = [model.xr], [model.xc], [model.xv]
        for k in range(budgeted):
            at = np.flatnonzero(model.mem[k])
            xr.append(np.full(len(at), model.rows + k))
            xc.append(at)
            xv.append(model.mem[k][at])
        xr, xc, xv = (np.concatenate(z) for z in (xr, xc, xv))
        lp.num_col_, lp.num_row_ = model.nx, model.rows + budgeted
        lp.col_cost_ = model.xcost
        lp.col_lower_ = np.zeros(model.nx)
        lp.col_upper_ = np.where(model.out, 0.0, self.inf)
        lp.row_lower_ = np.concatenate([model.rhs, [-self.inf] * budgeted])
        lp.row_upper_ = np.concatenate([model.rhs, np.maximum(model.room, 0.0)])
        order = np.argsort(xc, kind="stable")
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(xc[order], np.arange(model.nx + 1)).astype(np.int32)
        lp.a_matrix_.index_ = xr[order].astype(np.int32)
        lp.a_matrix_.value_ = xv[order]
        h.passModel(lp)
        self.h = h
        self.cols = model.nx
        self.added = np.zeros(len(model.ucost), dtype=bool)
        self.col_unit: list = []  # per column past the x: its unit, and whether its y
        self.col_y: list = []

    def reprice(self, model) -> None:
        """The same columns at ``model``'s costs (a model of the same terms), the basis
        kept: the next run starts from the last one's optimum."""
        import numpy as np

        model.rescale(self.m.scale)
        self.m = model
        unit = np.concatenate(self.col_unit) if self.col_unit else np.zeros(0, dtype=np.int64)
        is_y = np.concatenate(self.col_y) if self.col_y else np.zeros(0, dtype=bool)
        cost = np.where(is_y | ~model.ushared[unit], model.ucost[unit], 0.0)
        cost = np.concatenate([model.xcost, cost])
        self.h.changeColsCost(len(cost), np.arange(len(cost), dtype=np.int32), cost)
        if model.mem is not None:  # the budget's room, and the options out of it
            xs = np.arange(model.nx, dtype=np.int32)
            upper = np.where(model.out, 0.0, self.inf)
            self.h.changeColsBounds(model.nx, xs, np.zeros(model.nx), upper)
            for k, room in enumerate(model.room):
                self.h.changeRowBounds(model.rows + k, -self.inf, max(float(room), 0.0))

    def add(self, units) -> None:
        """Add ``units`` (those not added yet): their entries' columns, each shared
        unit's ``y`` and its rows ``y - mu_r >= 0``."""
        import numpy as np

        m = self.m
        units = units[~self.added[units]]
        if not len(units):
            return
        self.added[units] = True
        counts = m.unit_start[units + 1] - m.unit_start[units]
        ents = m.by_unit[
            np.concatenate(
                [np.arange(s, s + c) for s, c in zip(m.unit_start[units], counts, strict=True)]
            )
        ]
        owner = np.repeat(units, counts)
        # entry columns: cost on the entry itself unless its unit is shared
        ecost = np.where(m.ushared[owner], 0.0, m.ucost[owner])
        ne = len(ents)
        idx = np.empty(2 * ne, dtype=np.int32)
        idx[0::2], idx[1::2] = m.P[ents], m.Q[ents]
        self.h.addCols(
            ne,
            ecost,
            np.zeros(ne),
            np.full(ne, self.inf),
            2 * ne,
            np.arange(0, 2 * ne, 2, dtype=np.int32),
            idx,
            np.ones(2 * ne),
        )
        ecol = self.cols + np.arange(ne)
        self.cols += ne
        self.col_unit.append(owner)
        self.col_y.append(np.zeros(ne, dtype=bool))
        sh = m.ushared[units]
        if sh.any():
            ys = units[sh]
            ny = len(ys)
            self.h.addCols(
                ny,
                m.ucost[ys],
                np.zeros(ny),
                np.full(ny, self.inf),
                0,
                np.zeros(ny, dtype=np.int32),
                np.zeros(0, dtype=np.int32),
                np.zeros(0),
            )
            ycol = np.full(len(m.ucost), -1, dtype=np.int64)
            ycol[ys] = self.cols + np.arange(ny)
            self.cols += ny
            self.col_unit.append(ys)
            self.col_y.append(np.ones(ny, dtype=bool))
            mine = m.ushared[owner]
            nr = int(mine.sum())
            idx = np.empty(2 * nr, dtype=np.int32)
            idx[0::2], idx[1::2] = ycol[owner[mine]], ecol[mine]
            val = np.tile([1.0, -1.0], nr)
            self.h.addRows(
                nr,
                np.zeros(nr),
                np.full(nr, self.inf),
                2 * nr,
                np.arange(0, 2 * nr, 2, dtype=np.int32),
                idx,
                val,
            )

    def run(self, seconds: float = math.inf):
        """Solve within ``seconds`` (wall); the duals of the model's own rows and the memory
        rows' multipliers (each >= 0; none without a budget), or None unless optimal."""
        import highspy
        import numpy as np

        # HiGHS's time limit counts every run of its instance (this LP's rounds, and the
        # solves that warm-start from it): this run gets ``seconds`` of its own
        spent = self.h.getRunTime() if hasattr(self.h, "getRunTime") else 0.0
        self.h.setOptionValue("time_limit", spent + float(seconds))
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        dual = np.asarray(self.h.getSolution().row_dual)
        lam = np.maximum(0.0, -dual[self.m.rows : self.m.rows + len(self.m.room)])
        return dual[: self.m.rows], lam

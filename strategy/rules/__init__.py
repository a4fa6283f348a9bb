"""meshplan.strategy.rules — what each op may do on one mesh dim.

Holds the :class:`~meshplan.strategy.RuleSet` and its :class:`~meshplan.strategy.OpRule`
entries (``_ruleset``, ``_oprule``), the single-mesh-dim vocabulary (``_rule``:
:class:`~meshplan.strategy.Placeholder`, :class:`~meshplan.strategy.DimStrategy`, filling),
the built-in op rules by family (``_rules_matrix``, ``_rules_pointwise``, ``_rules_shape``),
the rules of traced aten calls (``_aten``, ``_aten_pieces``, ``_aten_nets``,
``_aten_writes``), placeholder constraints (``_constraints``), dtype promotion
(``_dtypes``), argument reading (``_args``) and random draws (``_random``).

The bottom layer of the strategy package: imports nothing of ``selection`` or
``programs`` (nor of the solver), and never imports torch. The public names are
re-exported by :mod:`meshplan.strategy`; this package's ``__init__`` imports nothing.
"""

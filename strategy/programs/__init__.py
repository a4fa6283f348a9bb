"""meshplan.strategy.programs — whole programs: trace, price, solve, assemble a ``Program``.

Holds the tracer and its graph (``_trace``, ``_graph``), the module entry
(``_module``: :func:`~meshplan.strategy.plan_module`), each op's candidate strategies
(``_candidates``) and free arguments (``_auto``), the prices and terms handed to the solver
(``_program_prices``, ``_program_terms``, ``_program_parts``), the solve
(``_program_solve``), repeated layers (``_repeats``), recompute (``_recompute``), memory
(``_memory``), assembly and explanation of the planned
:class:`~meshplan.strategy.Program` (``_program``, ``_program_assemble``,
``_program_value``, ``_program_explain``) and progress reports (``_progress``).

The top layer: builds on :mod:`meshplan.strategy.rules`,
:mod:`meshplan.strategy.selection` (prices) and :mod:`meshplan.strategy.solver`, to which
it hands a typed :class:`~meshplan.strategy.solver.Problem`. Only the tracer
(``_trace``) and the module entry import torch; this package's ``__init__`` imports
nothing.
"""

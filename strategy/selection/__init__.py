"""meshplan.strategy.selection — one op's layouts: expand its rule over the mesh, price, choose.

Holds the op-level problem (``_problem``: one call's inputs checked and its rule filled
per mesh dim), expansion over the mesh (``_expand``: :func:`~meshplan.strategy.expand`),
the redistribution prices and their lower bounds (``_price``), the best-first search
(``_select``: :func:`~meshplan.strategy.select`), running one op on sharded tensors
(``_propagate``), the torch reference of the built-in ops (``_reference``) and the rule
checker (``_check``: :func:`~meshplan.strategy.check_rule`).

Layered on :mod:`meshplan.strategy.rules`; imports nothing of ``programs``. Only
``_reference``, ``_propagate`` and ``_check`` import torch (they run tensors); this
package's ``__init__`` imports nothing.
"""

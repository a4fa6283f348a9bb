"""The planner's engine: the search behind ``plan`` (no torch; nothing here is public).

A reader of :mod:`meshplan.redistribute` can skip this package: ``plan``, ``plan_cost``
and :class:`~meshplan.redistribute.Planner` are its only callers' entry points, and
``Plan``, ``Step`` and the cost model are defined outside it. Importing the package
loads none of its modules; ``plan`` imports them when it is first asked for.

One concept per module:

* states and moves: ``_encoding`` (specs as states; moves and edges), ``_problem``
  (what a search context depends on) and ``_context`` (a context: interned states,
  local bytes, prices);
* the moves out of a state, shape-free: ``_moves`` (single-dim steps, with ``_exact``'s
  checks on index intervals), ``_permutes`` (all_permutes through hubs),
  ``_merged_moves`` (steps merged onto aliases) and ``_general`` (general all_permutes);
  ``_edges`` prices them on a context and ``_price`` is the one formula they use;
* where a search ends: ``_goals`` (goal classes and patterns);
* the search's lower bound: ``_bounds`` with ``_dim_bound``, ``_bound_parts``,
  ``_sequence`` and ``_general_bound``;
* the search: ``_search`` (A*), ``_table`` (all-pairs tables of small contexts) and
  ``_family`` (plans shared across the tensor sizes of a family).
"""

"""Differentially private aggregates: specifications, contribution bounding, continual counters, the budget ledger
and the engine-independent :class:`DPAggregator`.

The walk of one DP value, from a closed window to a row; each module once, in this order (``aggregator.py``'s
``DPAggregator._window`` is the table of contents: it calls the steps one after the other):

1. :mod:`~stream_anon.dp.columns`: the window's events as columns, each field factorized once for every aggregate
   (``WindowColumns``).
2. :mod:`~stream_anon.dp.cells`: the events the aggregate's ``where`` keeps and each one's cell of the configured
   domain, or none (``out_of_domain``), and its value (``CellKeys.of_window``); the cells' labels
   (``CellLabels``, once per aggregate).
3. :mod:`~stream_anon.dp.contribution`: contribution bounding (``Bounding.bound``): each unit's first
   ``max_contributions`` events of the window and, in period mode, its first ``W`` windows of the period (the unit
   window table, keyed by keyed unit ids or hashes); values clamped; the kept contributions summed per cell: the
   bounded true values. (:mod:`~stream_anon.dp.per_event` applies the same rules event by event to the windows
   steps 2-3 decline.)
4. :mod:`~stream_anon.dp.ledger`: every release due in the window is reserved in the budget ledger at once
   (``BudgetLedger.reserve_many``), keyed by a keyed digest of its bounded values, before any is released; a
   stopped aggregate yields a ``budget_exhausted`` event instead.
5. :mod:`~stream_anon.dp.release`: the noisy release (``Releaser.release``): the aggregate's plan (its epsilon
   split over components and outputs, its running mechanism), each component through its counters in
   :mod:`~stream_anon.dp.continual` (per-window noise, binary tree, hybrid), whose noise is drawn by
   :mod:`~stream_anon.dp.diffprivlib_adapter` (the only module touching diffprivlib's internals); the result is a
   ``ReleasedCells`` block: the fields the rows share and each cell's numbers (value, intervals). Its ``rows()``
   (or, in the worker, ``stream_anon.worker.aggregates`` serializing it) gives the rows.

Which windows are released is the schedule's, not the data's: every window from the start of ``dp.start``'s period
(:attr:`~stream_anon.dp.specs.DPConfig.start_window`), skipped ones released empty, and
:meth:`DPAggregator.advance_through` releases empty windows the stream's clock has passed.

What persists between windows is :mod:`~stream_anon.dp.state` (the aggregator's counters, partial releases and
unit window table) and the ledger: both :class:`~stream_anon.checkpoint.Checkpointable`. Beside the walk:
:mod:`~stream_anon.dp.specs` (the configuration), :mod:`~stream_anon.dp.merge` and
:mod:`~stream_anon.dp.consistency` (post-processing of published rows), :mod:`~stream_anon.dp.report` (error and
attack figures), :mod:`~stream_anon.dp.outlook` (where a partition's budget stands, for the worker's gauges).

>>> from stream_anon.dp import DPAggregator, BudgetLedger, parse_dp_config   # doctest: +SKIP
"""
from stream_anon.dp.aggregator import DPAggregator, split_outputs
from stream_anon.dp.continual import (BinaryTreeCounter, HybridCounter, PerWindowCounter, choose_mechanism,
                                      theoretical_running_mse)
from stream_anon.dp.contribution import bound_contributions, clamp
from stream_anon.dp.diffprivlib_adapter import draw_noise, make_mechanism
from stream_anon.dp.ledger import BudgetExhausted, BudgetExhaustedError, BudgetLedger, Reservation
from stream_anon.dp.release import plan_aggregate
from stream_anon.dp.specs import AggregateSpec, DPConfig, GroupKey, load_dp_config, parse_dp_config

__all__ = ["DPAggregator", "plan_aggregate", "split_outputs", "BinaryTreeCounter", "HybridCounter",
           "PerWindowCounter", "choose_mechanism", "draw_noise", "make_mechanism", "theoretical_running_mse",
           "bound_contributions", "clamp", "BudgetExhausted", "BudgetExhaustedError", "BudgetLedger",
           "Reservation", "AggregateSpec", "DPConfig", "GroupKey", "load_dp_config", "parse_dp_config"]

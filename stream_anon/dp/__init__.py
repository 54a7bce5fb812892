"""Differentially private aggregates (issue 4): specifications, contribution bounding, continual counters,
the budget ledger and the engine-independent :class:`DPAggregator`.

>>> from stream_anon.dp import DPAggregator, BudgetLedger, parse_dp_config   # doctest: +SKIP
"""
from stream_anon.dp.aggregator import DPAggregator, plan_aggregate, split_outputs
from stream_anon.dp.continual import (BinaryTreeCounter, HybridCounter, PerWindowCounter, choose_mechanism,
                                      draw_noise, make_mechanism, theoretical_running_mse)
from stream_anon.dp.contribution import bound_contributions, clamp
from stream_anon.dp.ledger import BudgetExhausted, BudgetExhaustedError, BudgetLedger, Reservation
from stream_anon.dp.specs import AggregateSpec, DPConfig, GroupKey, load_dp_config, parse_dp_config

__all__ = ["DPAggregator", "plan_aggregate", "split_outputs", "BinaryTreeCounter", "HybridCounter",
           "PerWindowCounter", "choose_mechanism", "draw_noise", "make_mechanism", "theoretical_running_mse",
           "bound_contributions", "clamp", "BudgetExhausted", "BudgetExhaustedError", "BudgetLedger",
           "Reservation", "AggregateSpec", "DPConfig", "GroupKey", "load_dp_config", "parse_dp_config"]

"""Contract checks shipped with the package, in the style of river's ``check_estimator``: every registered
strategy, criterion, former and DP aggregate kind is found in the registries (:mod:`.registry`) and checked on
real data, its output judged by the independent audit (:mod:`.parts`); every stateful part keeps the state
contract (:mod:`.checkpointable`); every bundled stream's dead letters hold no more than its output
(:mod:`.deadletters`). The tests call them (tests/cli/test_contract_checks.py,
tests/state/test_checkpoint_contract.py); a part of your own registered in ``stream_anon.strategies.STRATEGIES`` is
checked with ``check_strategy(name)``.

>>> from stream_anon.contract_checks import registered
>>> sorted(registered())
['aggregate', 'criterion', 'former', 'strategy']
>>> "mondrian" in registered()["strategy"] and "MInvariantFormer" in registered()["former"]
True
"""
from .checkpointable import CHECKS as CHECKPOINT_CHECKS
from .checkpointable import Factory, check_checkpointable, factories
from .deadletters import check_deadletters
from .parts import check_aggregate_kind, check_all, check_criterion, check_former, check_strategy
from .registry import registered

__all__ = ["CHECKPOINT_CHECKS", "Factory", "check_aggregate_kind", "check_all", "check_checkpointable",
           "check_criterion", "check_deadletters", "check_former", "check_strategy", "factories", "registered"]

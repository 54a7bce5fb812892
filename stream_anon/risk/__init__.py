"""Re-identification risk of a release, from its class sizes (and a declared population): the prosecutor,
journalist and marketer figures of :mod:`.classes`, and population uniqueness by the Pitman, Zayatz and SNB
models with Dankar et al.'s rule (:mod:`.population`).

Pure arithmetic on numbers (standard library, numpy, scipy): the worker renders these figures with each release
and the independent audit recomputes them from what it counts itself, so this package imports nothing of the
engine, the strategies, the formers, the criteria, the configuration, Kafka, the audit or the evaluation
(tests/cli/test_architecture.py).
"""
from .classes import DEFAULT_THRESHOLD, RiskSettings, journalist_class_risk, release_risk
from .population import PopulationUniqueness, pitman, population_uniqueness, snb, zayatz

__all__ = ["DEFAULT_THRESHOLD", "RiskSettings", "journalist_class_risk", "release_risk", "PopulationUniqueness",
           "pitman", "population_uniqueness", "snb", "zayatz"]

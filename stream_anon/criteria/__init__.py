"""Privacy criteria: what every published class must meet, apart from how classes are searched for (ARX's split).

- :mod:`.base`: :class:`Classes` (candidate classes, vectorized), :class:`Criterion` (the protocol);
- :mod:`.k_individuals`: k in distinct individuals (``anonymization.k``) and the class loss limit;
- :mod:`.l_diversity`: distinct, entropy and frequency l-diversity of a sensitive field;
- :mod:`.severity`: seed 003's severity rule;
- :mod:`.parse`: ``[[anonymization.criteria]]``.

The k-anonymous former (:mod:`stream_anon.formers.kanon`) checks every criterion before a class is published, the
``grouping`` and ``severity`` strategies search with them, and the audit checks the same list with its own code
(:mod:`stream_anon.audit.checks.l_diversity`, :mod:`stream_anon.audit.checks.severity`). This package imports
nothing of config, engine, formers, strategies, kafka or audit.
"""
from stream_anon.criteria.base import Classes, Column, Criterion, distinct_per_group
from stream_anon.criteria.k_individuals import KIndividuals, MaxClassNCP
from stream_anon.criteria.l_diversity import DistinctLDiversity, EntropyLDiversity, FrequencyLDiversity
from stream_anon.criteria.parse import KINDS, parse_criteria
from stream_anon.criteria.severity import SeverityRule

__all__ = ["Classes", "Column", "Criterion", "distinct_per_group", "KIndividuals", "MaxClassNCP",
           "DistinctLDiversity", "EntropyLDiversity", "FrequencyLDiversity", "SeverityRule", "KINDS",
           "parse_criteria"]

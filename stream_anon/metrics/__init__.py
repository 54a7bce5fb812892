"""Privacy and utility metrics of the source papers, on plain pandas DataFrames.

**Input convention.** Every metric takes an :class:`AnonymizedTable`: the original table (one row per record), the
anonymized table with the same index (generalized QI values: hierarchy node labels, numeric ``(lo, hi)``
intervals or numbers, station sets), the QI columns, and optionally the sensitive column, the individual
column (k is counted in distinct individuals), a class-id column (default: classes are the distinct released
QI tuples), a suppressed mask (default: rows whose released QIs are all missing), hierarchies,
numeric bounds and station graphs. Metrics are functions ``metric(release, ...) -> float``.

>>> import pandas as pd
>>> from stream_anon.hierarchy import Hierarchy
>>> h = Hierarchy.from_nested({"*": ["a", "b"]})
>>> orig = pd.DataFrame({"q": ["a", "b", "a"], "who": [1, 2, 3], "s": ["x", "y", "x"]})
>>> rel = pd.DataFrame({"q": ["*", "*", None]})
>>> r = AnonymizedTable(orig, rel, ["q"], sensitive="s", individual="who", hierarchies={"q": h})
>>> round(suppression_ratio(r), 3), min_k(r), min_l(r), ncp(r)
(0.333, 2, 2, 1.0)

Modules (one per family, each function cites its source):
- ``syntactic``: suppression ratio, minimum k (individuals), minimum l, average class size, discernibility
  (Singer 2023, seed 004);
- ``precision``: NCP (Xu et al. 2006), in-data / cross-data precision loss (seed 004), Prec (seed 001),
  distortion ratio and utility (seed 002), weighted information loss (seed 003);
- ``distribution``: earth mover's distance (equal, ordered, hierarchical), g-balance, h-affiliation,
  adversarial knowledge gain (seed 004);
- ``distortion``: utility-factor weights, Gamma_g, Gamma_s, Gamma_tot, per attribute (seed 000);
- ``queries``: COUNT-query relative error (seed 002);
- ``severity``: k_min, severity penalty, average severity, l_e and the AS_e > l_e rule (seed 003);
- ``thesis``: the eleven thesis metrics with min-max scaling.
"""
from stream_anon.metrics.base import AnonymizedTable, min_max
from stream_anon.metrics.distortion import distortion, entropy_factor, utility_weights
from stream_anon.metrics.distribution import emd, g_balance, h_affiliation, knowledge_gain
from stream_anon.metrics.precision import (cross_data_precision_loss, distortion_ratio, in_data_precision_loss, ncp,
                                           prec, utility_percent, weighted_information_loss)
from stream_anon.metrics.queries import count_query_error, random_count_queries
from stream_anon.metrics.syntactic import (average_class_size, discernibility, min_k, min_l,
                                           suppression_ratio)
from stream_anon.metrics.thesis import thesis_metrics

__all__ = ["AnonymizedTable", "min_max", "distortion", "entropy_factor", "utility_weights", "emd", "g_balance",
           "h_affiliation", "knowledge_gain", "cross_data_precision_loss", "distortion_ratio",
           "in_data_precision_loss", "ncp", "prec", "utility_percent", "weighted_information_loss",
           "count_query_error", "random_count_queries", "average_class_size", "discernibility", "min_k",
           "min_l", "suppression_ratio", "thesis_metrics"]

"""``stream-anon evaluate``: every registered strategy, side by side, on one dataset (batch mode).

For each strategy of ``stream_anon.strategies.STRATEGIES`` and each k, the whole table is one buffer: the
strategy forms classes (k counted in distinct individuals) with the engine's QI space, each class is published
as the snapped generalization of its box (``QISpace.snap``), and rows in no class are suppressed. Then:

- privacy and utility metrics of :mod:`stream_anon.metrics` (NCP, the thesis's eleven, Prec, distortion ratio,
  COUNT-query relative error) on an :class:`~stream_anon.metrics.AnonymizedTable`;
- the thesis's Utility Demonstrator (KPI relative error, :mod:`stream_anon.metrics.kpi`);
- the thesis's Privacy Demonstrator (AOI homogeneity attack, :mod:`stream_anon.attacks.aoi`) on data with
  positions (Citi Bike stations, Oyster stations, OBD-II GPS).

Two naive baselines run beside the strategies: ``raw`` (the input with identifiers dropped: classes are exact QI
tuples) and ``mondrian-records`` (Mondrian with k counted in records, CASTLE's defect), so the attack is seen to
succeed against a naive release and is measured against ours.

Datasets: ``adult`` (UCI Adult with ARX hierarchies; ``encoding="codes"`` reproduces the public Mondrian
reference's protocol, see :func:`adult_table`) and the stream datasets with the QIs of ``configs/<name>.toml``.
Outputs (``write_outputs``): ``results.json`` (one row per dataset, strategy and k), ``results.md``, PNG plots.

Modules, by job: :mod:`.tables` (datasets as :class:`EvalTable`), :mod:`.batch` (anonymize, measure, the rows),
:mod:`.report` (Markdown, plots, JSON), :mod:`.own_stream` (the streaming engine on a user's file against offline
Mondrian), :mod:`.commands` (the bodies of ``stream-anon evaluate``), :mod:`.throughput` (input formats' events/s),
:mod:`.stream_figures` (the demo report's attack figures), :mod:`.workload` (the analyst's range-count
queries answered from published boxes). This package and :mod:`stream_anon.attacks` are the only
ones that import an attack.
"""
from stream_anon.evaluate.batch import (BASELINES, Anonymized, anonymize, aoi_result, evaluate, make, make_release,
                                        measure, raw_release, release_frame, search_criteria)
from stream_anon.evaluate.commands import run, run_own
from stream_anon.evaluate.own_stream import offline_mondrian, read_own_events, streaming_ncp
from stream_anon.evaluate.report import TABLE_COLUMNS, comparison_table, markdown_table, plot, write_outputs
from stream_anon.evaluate.tables import (EDUCATION_NUM, EVAL_DATASETS, EvalTable, KPISpec, PositionSpec, adult_table,
                                         load_table, stream_table, table_from_events)
from stream_anon.evaluate.throughput import format_throughput

__all__ = ["BASELINES", "Anonymized", "anonymize", "aoi_result", "evaluate", "make", "make_release", "measure",
           "raw_release", "release_frame", "search_criteria", "run", "run_own", "offline_mondrian", "read_own_events",
           "streaming_ncp", "TABLE_COLUMNS", "comparison_table", "markdown_table", "plot", "write_outputs",
           "EDUCATION_NUM", "EVAL_DATASETS", "EvalTable", "KPISpec", "PositionSpec", "adult_table", "load_table",
           "stream_table", "table_from_events", "format_throughput"]

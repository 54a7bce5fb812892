"""The thesis's eleven metrics in one call, with its min-max scaling (Singer 2023, seed 004, Sec. 4.4.5).

Scaling references (m_min, m_max): minimum k and average class size: (value on the raw data, individuals in
the output); minimum l: (raw value, distinct sensitive values in the output); discernibility: (raw value,
|T|^2). Suppression ratio, precision losses, EMD, g-balance, h-affiliation and knowledge gain are already
in [0, 1] and are reported as they are.
"""
from __future__ import annotations

from stream_anon.metrics.base import AnonymizedTable, min_max
from stream_anon.metrics.distribution import emd, g_balance, h_affiliation, knowledge_gain
from stream_anon.metrics.precision import cross_data_precision_loss, in_data_precision_loss
from stream_anon.metrics.syntactic import (average_class_size, discernibility, min_k, min_l,
                                           suppression_ratio)


def thesis_metrics(r: AnonymizedTable, raw: AnonymizedTable | None = None, h_ignore=()) -> dict:
    """Raw values of the eleven metrics, plus ``<name>_scaled`` for the four the thesis scales (needs ``raw``,
    the identity release of the input: ``AnonymizedTable.identity(original, qis, ...)``)."""
    k, l_div, size, disc = min_k(r), min_l(r) if r.sensitive else None, average_class_size(r), discernibility(r)
    out: dict[str, float | None] = {
        "suppression_ratio": suppression_ratio(r),
        "min_k": k,
        "min_l": l_div,
        "average_class_size": size,
        "discernibility": disc,
        "ipl": in_data_precision_loss(r),
        "cpl": cross_data_precision_loss(r),
        "emd": emd(r) if r.sensitive else None,
        "g_balance": g_balance(r),
        "h_affiliation": h_affiliation(r, ignore=h_ignore) if r.sensitive else None,
        "knowledge_gain": knowledge_gain(r) if r.sensitive else None,
    }
    if raw is not None:
        n_ind = int(r.individuals().nunique())
        out["min_k_scaled"] = min_max(k, min_k(raw), n_ind)
        out["average_class_size_scaled"] = min_max(size, average_class_size(raw), n_ind)
        out["discernibility_scaled"] = min_max(disc, discernibility(raw), r.n_records ** 2)
        if l_div is not None:                   # r.sensitive
            out["min_l_scaled"] = min_max(l_div, min_l(raw), int(r.sensitive_values().nunique()))
    return out

"""How the report and the audit write a number for a person: positional notation, never scientific (a DPO
reads ``2e-06`` as a typo), shares as percentages, risks as a probability with its "1 in N". The report's page, its
tables and its plots' tick labels and the audit's text use these, so one figure reads the same everywhere; the
exact value stays in the data (the page's data-value and report-data, the audit's JSON).
"""
from __future__ import annotations

import math

DIGITS = 3          # significant digits shown; the page's data (data-value, report-data) keeps every digit


def plain(x, digits: int = DIGITS) -> str:
    """``x`` to ``digits`` significant digits in positional notation; integers and text as they are.

    >>> plain(2e-06), plain(0.030199), plain(0.5), plain(1.0), plain(0.0), plain(123456.7), plain(12), plain(None)
    ('0.000002', '0.0302', '0.5', '1', '0', '123457', '12', '-')
    """
    if x is None:
        return "-"
    if isinstance(x, bool) or not isinstance(x, float):
        return str(x)
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{round(x, decimals):.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def share(x, digits: int = DIGITS) -> str:
    """A share as a percentage.

    >>> share(1.0), share(0.0), share(2e-06), share(0.074074), share(None)
    ('100%', '0%', '0.0002%', '7.41%', '-')
    """
    return "-" if x is None else plain(float(x) * 100, digits) + "%"


def risk(x, digits: int = DIGITS) -> str:
    """A re-identification risk (a probability) with the odds it stands for.

    >>> risk(0.1), risk(2e-06), risk(0.030199), risk(1.0), risk(0.0)
    ('0.1 (1 in 10)', '0.000002 (1 in 500,000)', '0.0302 (1 in 33)', '1 (certain)', '0 (none)')
    """
    if x is None:
        return "-"
    x = float(x)
    if x <= 0:
        return "0 (none)"
    if x >= 1:
        return "1 (certain)"
    return f"{plain(x, digits)} (1 in {round(1 / x):,})"

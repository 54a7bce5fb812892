"""``[[anonymization.criteria]]``: the privacy criteria of a stream beyond k (docs/privacy-criteria.md).

.. code-block:: toml

    [anonymization]
    k = 10                               # k in distinct individuals: always on, never a criteria entry
    strategy = "mondrian"                # any strategy; the former enforces every criterion below

    [[anonymization.criteria]]
    kind = "distinct_l_diversity"        # or entropy_l_diversity, frequency_l_diversity
    field = "fare_product"               # one of sensitive.fields
    l = 3

    [[anonymization.criteria]]
    kind = "severity"                    # seed 003
    field = "crime"
    severity = { Theft = 5, Murder = 25 }    # or "crime" (the paper's Table 1)
    # default_severity, cap, l_floor = 1, diversity = true

>>> parse_criteria([{"kind": "distinct_l_diversity", "field": "fare", "l": 3}], k=10, sensitive=("fare",))
(DistinctLDiversity(field='fare', l=3),)
>>> parse_criteria([{"kind": "distinct_l_diversity", "field": "fare", "ll": 3}], k=10, sensitive=("fare",))
Traceback (most recent call last):
...
stream_anon.errors.ConfigError: anonymization.criteria[0].ll: unknown key; did you mean l?
"""
from __future__ import annotations

import difflib

from stream_anon.criteria.l_diversity import DistinctLDiversity, EntropyLDiversity, FrequencyLDiversity
from stream_anon.criteria.severity import SeverityRule, k_min, severity_map
from stream_anon.errors import ConfigError

KINDS = {"distinct_l_diversity": DistinctLDiversity, "entropy_l_diversity": EntropyLDiversity,
         "frequency_l_diversity": FrequencyLDiversity, "severity": SeverityRule}
KEYS = {"distinct_l_diversity": ("kind", "field", "l"), "entropy_l_diversity": ("kind", "field", "l"),
        "frequency_l_diversity": ("kind", "field", "l"),
        "severity": ("kind", "field", "severity", "default_severity", "cap", "l_floor", "diversity")}
REQUIRED = {"distinct_l_diversity": ("field", "l"), "entropy_l_diversity": ("field", "l"),
            "frequency_l_diversity": ("field", "l"), "severity": ("field", "severity")}
WITH_M = ("not combinable with anonymization.m: m-invariance already makes every class m-diverse in "
          "sensitive.invariant (no value held by more than 1/m of its individuals, counterfeits included), and its "
          "classes come from a signature-aware search whose classes cannot be merged or suppressed for another "
          "criterion without changing the signatures it has bound")


def _unknown(key: str, known, path: str) -> ConfigError:
    near = difflib.get_close_matches(key, list(known), n=1)
    hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(known)}"
    return ConfigError(f"{path}.{key}: unknown key; {hint}")


def parse_criteria(raw, *, k: int, sensitive: tuple[str, ...], m: int | None = None,
                   path: str = "anonymization.criteria") -> tuple:
    """The criteria of ``[[anonymization.criteria]]`` (``raw``: the parsed list of tables, or None), validated against
    the stream's ``k`` (a severity rule's k_min), its sensitive fields and ``m``. Errors name the dotted key."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{path}: expected [[{path}]] tables, got {type(raw).__name__}")
    if raw and m is not None:
        raise ConfigError(f"{path}: {WITH_M}")
    out, seen = [], {}
    for i, table in enumerate(raw):
        at = f"{path}[{i}]"
        kind = table.get("kind")
        if kind == "k":
            raise ConfigError(f"{at}.kind: k is anonymization.k (always enforced), not a criteria entry")
        if kind not in KINDS:
            near = difflib.get_close_matches(str(kind), list(KINDS), n=1)
            raise ConfigError(f"{at}.kind: one of {', '.join(KINDS)}, got {kind!r}"
                              + (f"; did you mean {near[0]}?" if near else ""))
        for key in table:
            if key not in KEYS[kind]:
                raise _unknown(key, KEYS[kind], at)
        for key in REQUIRED[kind]:
            if key not in table:
                raise ConfigError(f"{at}.{key}: missing")
        if table["field"] not in sensitive:
            raise ConfigError(f"{at}.field: {table['field']!r} is not listed in sensitive.fields")
        params = {key: v for key, v in table.items() if key != "kind"}
        try:
            if kind == "severity":
                params["k_min"] = k_min(k, severity_map(params["severity"]).values())
            criterion = KINDS[kind](**params)
        except ValueError as exc:
            raise ConfigError(f"{at}.{exc}") from None
        if (kind, criterion.field) in seen:
            raise ConfigError(f"{at}: a second {kind} on {criterion.field!r} (the first is {path}"
                              f"[{seen[(kind, criterion.field)]}])")
        seen[(kind, criterion.field)] = i
        out.append(criterion)
    return tuple(out)

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

from stream_anon.criteria.l_diversity import DistinctLDiversity, EntropyLDiversity, FrequencyLDiversity
from stream_anon.criteria.severity import PRESETS, SeverityRule, k_min, severity_map
from stream_anon.errors import ConfigError
from stream_anon.validation import MAX_COUNT, Table, check_choice, check_number

KINDS = {"distinct_l_diversity": DistinctLDiversity, "entropy_l_diversity": EntropyLDiversity,
         "frequency_l_diversity": FrequencyLDiversity, "severity": SeverityRule}
L_KEYS = ("kind", "field", "l")
KEYS = {"distinct_l_diversity": L_KEYS, "entropy_l_diversity": L_KEYS, "frequency_l_diversity": L_KEYS,
        "severity": ("kind", "field", "severity", "default_severity", "cap", "l_floor", "diversity")}
WITH_M = ("not combinable with anonymization.m: m-invariance already makes every class m-diverse in "
          "sensitive.invariant (no value held by more than 1/m of its individuals, counterfeits included), and its "
          "classes come from a signature-aware search whose classes cannot be merged or suppressed for another "
          "criterion without changing the signatures it has bound")


def _criterion(t: Table, kind: str, k: int, sensitive: tuple[str, ...]):
    field = t.text("field")
    if field not in sensitive:
        raise ConfigError(f"{t.key('field')}: {field!r} is not listed in sensitive.fields")
    if kind != "severity":
        integer = kind == "distinct_l_diversity"       # the others take a real l (entropy: log l)
        l = t.integer("l", 1, MAX_COUNT) if integer else t.number("l", at_least=1, at_most=MAX_COUNT)
        return KINDS[kind](field=field, l=l)
    raw = t.get("severity")
    if isinstance(raw, str):
        check_choice(raw, t.key("severity"), PRESETS)
    elif isinstance(raw, dict) and raw:
        for value, s in raw.items():
            check_number(s, f"{t.key('severity')}.{value}", above=0, at_most=MAX_COUNT)
    else:
        raise ConfigError(f"{t.key('severity')}: a non-empty table sensitive value -> severity, or a preset "
                          f"({', '.join(PRESETS)})")
    severity = severity_map(raw)
    return SeverityRule(field=field, severity=severity, k_min=k_min(k, severity.values()),
                        default_severity=t.number("default_severity", None, above=0, at_most=MAX_COUNT),
                        cap=t.integer("cap", 1, MAX_COUNT, None), l_floor=t.integer("l_floor", 1, MAX_COUNT, 1),
                        diversity=t.boolean("diversity", True))


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
    out = []
    seen: dict[tuple[str, str], int] = {}           # (kind, field) -> index of its entry
    for i, table in enumerate(raw):
        at = f"{path}[{i}]"
        if table.get("kind") == "k":
            raise ConfigError(f"{at}.kind: k is anonymization.k (always enforced), not a criteria entry")
        kind = check_choice(table.get("kind"), f"{at}.kind", tuple(KINDS))
        t = Table(table, at, KEYS[kind])
        t.get("kind")
        criterion = _criterion(t, kind, k, sensitive)
        t.done(f"not a key of a {kind} criterion")
        if (kind, criterion.field) in seen:
            raise ConfigError(f"{at}: a second {kind} on {criterion.field!r} (the first is {path}"
                              f"[{seen[(kind, criterion.field)]}])")
        seen[(kind, criterion.field)] = i
        out.append(criterion)
    return tuple(out)

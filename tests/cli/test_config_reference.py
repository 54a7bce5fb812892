"""docs/configuration.md against the validation code: the keys it lists for each table are exactly the keys the
readers accept (both directions), every numeric key refuses NaN, +-inf, a boolean and a value outside the range
the document states, every table refuses a misspelled key naming the right one, and its examples load."""
from __future__ import annotations

import copy
import math
import re
import tomllib
from pathlib import Path

import pytest

from stream_anon.config import load_config, parse_config, table_keys, with_files_beside
from stream_anon.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
CONFIGS = ROOT / "configs"     # the examples name the bundled hierarchies as a file of configs/ would


def reference() -> dict[str, list[dict]]:
    """Table (as ``table_keys()`` names it) -> its rows: key, type, default, range."""
    tables: dict[str, list[dict]] = {}
    rows = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"^### (.+)$", line)
        if heading:
            name = heading.group(1).replace("`", "").strip("[] ")
            name = re.sub(r"\]+ of (\S+)$", r" (\1)", name).replace("<field>", "FIELD").strip("[]")
            rows = tables.setdefault("(top level)" if name == "Top level" else name, [])
        elif line.startswith("## "):
            rows = None
        elif rows is not None and line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows.append({"key": cells[0].strip("`"), "type": cells[1], "default": cells[2], "range": cells[3]})
    return tables


REFERENCE = reference()
EXAMPLES = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S)


def test_reference_lists_exactly_the_keys_each_table_accepts():
    code = {table: set(keys) for table, keys in table_keys().items()}
    doc = {table: {r["key"] for r in rows} for table, rows in REFERENCE.items()}
    assert set(doc) == set(code), (sorted(set(doc) ^ set(code)))
    for table in code:
        assert doc[table] == code[table], (table, "only in the doc:", sorted(doc[table] - code[table]),
                                           "only in the code:", sorted(code[table] - doc[table]))


def test_reference_reader_sees_every_table():
    """The comparison above can only fail when the reader finds the document's tables and rows."""
    assert len(REFERENCE) >= 20 and sum(len(r) for r in REFERENCE.values()) >= 120
    assert {r["key"] for r in REFERENCE["anonymization"]} >= {"k", "window_s", "max_suppression_ratio"}


# -- a valid configuration holding every table, and where each key of the reference goes in it -------------------
def example() -> dict:
    return tomllib.loads(EXAMPLES[0])


STRATEGY_REQUIRED = {"severity": {"field": "contract"}, "grouping": {"field": "contract"}}
QI_OF = {"grid_deg": "position", "hierarchy": "zone"}                     # else the numeric QI "speed"
DOMAIN_OF = {"lower": "fuel_pct", "upper": "fuel_pct", "integer": "fuel_pct", "max_length": "code",
             "charset": "code"}                                           # else the category "contract"
AGGREGATE_OF = {"lower": 1, "upper": 1, "resolution": 1, "value": 1, "max_windows_per_period": 1, "bins": 2,
                "numerator_values": 3}                                    # else "readings_per_hour"


def place(table: str, key: str, name: str, value) -> tuple[dict, str]:
    """The example configuration with ``name`` set to ``value`` where key ``key`` of ``table`` is read; and the
    full dotted key of ``name`` there."""
    raw = example()
    if table == "(top level)":
        raw[name] = value
        return raw, name
    if table in ("dp", "aggregates") and key in ("epsilon_budget", "horizon_windows"):
        raw = with_example(1)
    if table == "kafka":
        raw["kafka"] = {name: value}
        return raw, f"kafka.{name}"
    if table in ("stream", "anonymization", "sensitive", "identifiers", "limits", "dp", "input", "risk", "report"):
        if table == "risk" and key == "sampling_fraction":
            raw = with_example(1)         # population and sampling_fraction exclude each other
        raw[table][name] = value
        return raw, f"{table}.{name}"
    if table == "anonymization.m_params":
        raw["anonymization"]["m_params"][name] = value
        return raw, f"{table}.{name}"
    criterion = re.fullmatch(r"anonymization\.criteria \((.+)\)", table)
    if criterion:
        a = raw["anonymization"]
        for k in ("m", "m_horizon_s", "m_params"):
            del a[k]
        del raw["sensitive"]["invariant"]
        entry = {"kind": criterion.group(1), "field": "contract",
                 **({"severity": {"lease": 3}} if criterion.group(1) == "severity" else {"l": 2})}
        a["criteria"] = [{**entry, name: value}]
        return raw, f"anonymization.criteria[0].{name}"
    strategy = re.fullmatch(r"anonymization\.strategy_params \((.+)\)", table)
    if strategy:
        a = raw["anonymization"]
        for k in ("m", "m_horizon_s", "m_params"):
            del a[k]
        a["strategy"] = strategy.group(1)
        a["strategy_params"] = {**STRATEGY_REQUIRED.get(strategy.group(1), {}), name: value}
        return raw, f"anonymization.strategy_params.{name}"
    if table == "quasi_identifiers":
        if key == "resolutions":
            raw = with_example(2)
        qi = next(q for q in raw["quasi_identifiers"] if q["name"] == QI_OF.get(key, "speed")
                  or key == "resolutions")
        qi[name] = value
        return raw, f"quasi_identifiers.{qi['name']}.{name}"
    if table == "sensitive.domains.FIELD":
        field = DOMAIN_OF.get(key, "contract")
        raw["sensitive"]["domains"][field][name] = value
        return raw, f"sensitive.domains.{field}.{name}"
    if table == "aggregates":
        agg = raw["aggregates"][AGGREGATE_OF.get(key, 0) if key != "horizon_windows" else 0]
        agg[name] = value
        return raw, f"aggregates.{agg['name']}.{name}"
    if table == "aggregates.group_by":
        a, g = {"level": (0, 1), "hierarchy": (0, 1), "values": (1, 0)}.get(key, (0, 0))
        raw["aggregates"][a]["group_by"][g][name] = value
        return raw, f"aggregates.{raw['aggregates'][a]['name']}.group_by[{g}].{name}"
    if table == "input.fields.FIELD":
        raw["input"]["fields"]["latitude"][name] = value
        return raw, f"input.fields.latitude.{name}"
    raise AssertionError(f"no place for table {table}")


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, base_dir=CONFIGS)
    message = str(exc.value)
    assert "\n" not in message
    return message


def with_example(i: int) -> dict:
    """The complete example with the tables of example ``i`` in place of its own."""
    return {**example(), **tomllib.loads(EXAMPLES[i])}


def test_the_examples_load():
    assert len(EXAMPLES) == 5
    cfg = parse_config(example(), base_dir=CONFIGS)
    assert cfg.anonymization.m == 2 and cfg.dp.period == "day" and cfg.input.format == "csv"
    assert not parse_config(with_example(1), base_dir=CONFIGS).dp.period_mode
    assert parse_config(with_example(2), base_dir=CONFIGS).quasi_identifiers[0].h3 == (5, 12)
    assert parse_config(with_example(3), base_dir=CONFIGS).input.encoding == "auto"
    assert parse_config(with_example(4), base_dir=CONFIGS).anonymization.strategy_params["l"] == 2


def _keys_by_table(raw: dict) -> set[tuple[str, str]]:
    """(table as the reference names it, key) of every key set in a configuration document."""
    out = {("(top level)", k) for k in raw}
    for table in ("stream", "anonymization", "sensitive", "identifiers", "limits", "dp", "input", "risk", "report"):
        out |= {(table, k) for k in raw.get(table, {})}
    out |= {("anonymization.m_params", k) for k in raw.get("anonymization", {}).get("m_params", {})}
    out |= {(f"anonymization.criteria ({c['kind']})", k) for c in raw.get("anonymization", {}).get("criteria", [])
            for k in c}
    out |= {("quasi_identifiers", k) for q in raw.get("quasi_identifiers", []) for k in q}
    out |= {("sensitive.domains.FIELD", k) for d in raw.get("sensitive", {}).get("domains", {}).values() for k in d}
    out |= {("aggregates", k) for a in raw.get("aggregates", []) for k in a}
    out |= {("aggregates.group_by", k) for a in raw.get("aggregates", []) for g in a.get("group_by", []) for k in g}
    out |= {("input.fields.FIELD", k) for f in raw.get("input", {}).get("fields", {}).values()
            if isinstance(f, dict) for k in f}
    return out


def test_every_key_of_the_reference_is_accepted_in_an_example():
    """The other direction of the comparison with the code: a key the reference lists (and a table declares) is
    one its reader reads, shown by an example that loads with it. A strategy's parameters are its Params fields;
    the [kafka] settings are KafkaConnection's fields, read by stream_anon.connection
    (tests/kafka/test_connection.py)."""
    shown = set().union(*(_keys_by_table(tomllib.loads(text)) for text in EXAMPLES))
    listed = {(t, r["key"]) for t, rows in REFERENCE.items() if "strategy_params" not in t and t != "kafka"
              for r in rows}
    assert listed - shown == set()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.toml")), ids=lambda p: p.name)
def test_every_bundled_config_loads(path):
    assert load_config(path).anonymization.k >= 2


# -- numbers: finite, never a boolean, inside the documented range -------------------------------------------
def _bound(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None          # a bound that depends on the configuration ("windows in a period")


def out_of_range(rng: str, raw_table_value) -> list:
    """Values outside the documented range ``rng`` (interval notation, ``> x``, ``>= x``, then ``; >= key``)."""
    parts = [p.strip() for p in rng.split(";")]
    values = []
    m = re.fullmatch(r"([\[(])(\S+), (.+?)([\])])", parts[0])
    if m:
        lo, hi = _bound(m.group(2)), _bound(m.group(3))
        if lo is not None:
            values.append(lo if m.group(1) == "(" else lo - 1)
        if hi is not None:
            values.append(hi if m.group(4) == ")" else hi + 1)
    m = re.fullmatch(r"(>=?) (\S+)", parts[0])
    if m:
        values.append(_bound(m.group(2)) - (1 if m.group(1) == ">=" else 0))
    for relation in parts[1:]:                      # against a sibling key: take its value, one step outside
        m = re.fullmatch(r"(<|<=|>=) (\w+)", relation)
        if m:
            v = raw_table_value(m.group(2))
            values.append({"<": v, "<=": v + 1, ">=": v - 1}[m.group(1)])
    return values


NUMERIC = [(table, row) for table, rows in REFERENCE.items() for row in rows
           if row["type"].startswith(("integer", "number"))]


def test_numeric_keys_are_found():
    keys = {f"{t}.{r['key']}" for t, r in NUMERIC}
    assert len(NUMERIC) >= 40 and {"anonymization.k", "anonymization.window_s", "stream.max_future_s",
                                    "aggregates.epsilon", "input.fields.FIELD.integer_digits"} <= keys


@pytest.mark.parametrize("table, row", NUMERIC, ids=[f"{t}.{r['key']}" for t, r in NUMERIC])
def test_numeric_key_refuses_non_finite_boolean_and_out_of_range(table, row):
    key = row["key"]
    _, dotted = place(table, key, key, 0)

    def sibling(other):
        return _holder(table, key)[other]

    bad = [math.nan, math.inf, -math.inf, True] + out_of_range(row["range"], sibling)
    if row["type"].startswith("integer"):
        bad.append(2.5)
    assert len(bad) >= 5 or row["range"] == "finite", f"{dotted}: no out-of-range value in {row['range']!r}"
    for value in bad:
        raw, dotted = place(table, key, key, value)
        message = refusal(raw)
        assert message.startswith(f"{dotted}:") and "unknown" not in message, (value, message)


def _holder(table: str, key: str) -> dict:
    """The table (a dict of the example) in which ``place`` sets ``key`` of ``table``."""
    marker = object()
    stack = [place(table, key, "__probe__", marker)[0]]
    while stack:
        node = stack.pop()
        if isinstance(node, dict) and node.get("__probe__") is marker:
            return node
        stack += list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else []
    raise AssertionError(f"{table}.{key}: not placed")


# -- unknown keys: refused in every table, naming the nearest known key ------------------------------------------
def typo(key: str) -> str:
    middle = len(key) // 2
    return key[:middle] + key[middle + 1:]


TABLES = sorted(t for t, rows in REFERENCE.items() if rows)


@pytest.mark.parametrize("table", TABLES)
def test_misspelled_key_refused_with_the_key_meant(table):
    key = max((r["key"] for r in REFERENCE[table]), key=len)
    wrong = typo(key)
    assert wrong not in {r["key"] for r in REFERENCE[table]}
    raw, dotted = place(table, key, wrong, {} if table == "(top level)" else 1)
    noun = "table" if table == "(top level)" else "parameter" if "params" in table else "key"
    assert refusal(raw) == f"{dotted}: unknown {noun}; did you mean {key}?"


def test_every_table_with_keys_is_checked_for_misspellings():
    assert set(TABLES) == {t for t, keys in table_keys().items() if keys}


def test_a_strategy_without_parameters_refuses_any():
    raw, _ = place("anonymization.strategy_params (mondrian)", "", "bins", 4)
    assert refusal(raw) == "anonymization.strategy_params.bins: unknown parameter; known: none"


# -- the cases of issue 27, on a bundled configuration -----------------------------------------------------------
def oyster() -> dict:
    return tomllib.loads((ROOT / "configs" / "oyster.toml").read_text())


@pytest.mark.parametrize("table, key, value, message", [
    ("anonymization", "window_s", math.nan, "anonymization.window_s: expected a finite number, got nan"),
    ("anonymization", "max_delay_s", math.nan, "anonymization.max_delay_s: expected a finite number, got nan"),
    ("anonymization", "k", 2 ** 64, "anonymization.k: must be in [2, 1000000], got 18446744073709551616"),
    ("anonymization", "max_suppresion_ratio", 0.1,
     "anonymization.max_suppresion_ratio: unknown key; did you mean max_suppression_ratio?"),
    ("anonymization", "reuse_horizon", 600, "anonymization.reuse_horizon: unknown key; did you mean reuse_horizon_s?"),
    ("quasi_identifiers", "weigth", 2.0, "quasi_identifiers.time.weigth: unknown key; did you mean weight?"),
    ("stream", "partition", 4, "stream.partition: unknown key; did you mean partitions?"),
    ("", "anonymisation", {}, "anonymisation: unknown table; did you mean anonymization?"),
    ("sensitive", "invariants", "x", "sensitive.invariants: unknown key; did you mean invariant?"),
    ("identifiers", "pseudonymise", [], "identifiers.pseudonymise: unknown key; did you mean pseudonymize?"),
])
def test_issue_cases_are_refused_at_load(table, key, value, message):
    raw = oyster()
    (raw if not table else raw[table][0] if table == "quasi_identifiers" else raw[table])[key] = value
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, base_dir=ROOT / "configs")
    assert str(exc.value) == message


@pytest.mark.parametrize("change, key", [
    (lambda r: r["dp"].update(epsilon_per_period=2 ** 64), "dp.epsilon_per_period: must be in (0, 1000000000]"),
    (lambda r: r["dp"].update(epsilon_per_period=1e308), "dp.epsilon_per_period: must be in (0, 1000000000]"),
    (lambda r: r["aggregates"][0].update(epsilon=1e308),
     "aggregates.taps_per_zone.epsilon: must be in (0, 1000000000]"),
    (lambda r: r["aggregates"][2].update(upper=2 ** 64), "aggregates.mean_fare_by_category.upper: must be in"),
    (lambda r: r["aggregates"][2].update(lower=-1e308), "aggregates.mean_fare_by_category.lower: must be in"),
    (lambda r: r["aggregates"][3].update(bins=[0, 1, 1e308]), "aggregates.fare_histogram.bins[2]: must be in"),
])
def test_absurd_budgets_and_bounds_are_refused_naming_the_key(change, key):
    """Issue 43 item 13: an epsilon of 2^64 or 1e308 and aggregate bounds of 2^64 or 1e308 loaded in the worker."""
    raw = copy.deepcopy(oyster())
    change(raw)
    assert refusal(raw).startswith(key)


@pytest.mark.parametrize("change, message", [
    (lambda r: r["quasi_identifiers"][1].update(lower=0),
     "quasi_identifiers.location.lower: not a key of a station quasi-identifier"),
    (lambda r: r["aggregates"][0].update(lower=0), "aggregates.taps_per_zone.lower: not a key of a count aggregate"),
    (lambda r: r["dp"].update(period=None, unit=None, epsilon_per_period=None, epsilon_budget=1.0),
     "dp.timezone: only meaningful in period mode (with dp.period)"),
    (lambda r: r["aggregates"][0]["group_by"][1].update(level=1),
     "aggregates.taps_per_zone.group_by[1].level: not a key of a group of kind 'values'"),
    (lambda r: r["sensitive"]["domains"]["daily_capping"].update(values=["x"]),
     "sensitive.domains.daily_capping.values: not a key of a boolean domain"),
    (lambda r: r["dp"].update(unit="event", unit_field="card_id", max_windows_per_period=None),
     "dp.unit_field: not with dp.unit = 'event' (every event is its own unit)"),
])
def test_a_key_without_meaning_next_to_the_others_is_refused(change, message):
    raw = copy.deepcopy(oyster())
    change(raw)
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, base_dir=ROOT / "configs")
    assert str(exc.value) == message


@pytest.mark.parametrize("mutate, key", [
    (lambda r: r["quasi_identifiers"].append({"name": "pos", "field": ["lat", "lon"], "kind": "geopoint",
                                              "lower": [math.nan, 0], "upper": [1, 1]}),
     "quasi_identifiers.pos.lower[0]"),
    (lambda r: r["aggregates"][3].update(bins=[0, math.inf]), "aggregates.fare_histogram.bins[1]"),
    (lambda r: r["aggregates"][0]["group_by"][1].update(values=["tap_in", math.nan]),
     "aggregates.taps_per_zone.group_by[1].values"),
    (lambda r: r["quasi_identifiers"][0].update(lower=math.nan), "quasi_identifiers.time.lower"),
])
def test_numbers_inside_lists_are_finite(mutate, key):
    raw = oyster()
    mutate(raw)
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, base_dir=ROOT / "configs")
    assert str(exc.value).startswith(f"{key}: expected a finite number"), str(exc.value)


def test_files_are_found_next_to_the_config(tmp_path):
    """Every file a configuration names is relative to its directory and checked at load, utility-clustering's
    station graphs too; a copy written elsewhere with its files beside it (with_files_beside) loads there, H3
    positions included."""
    (tmp_path / "graph.csv").write_text("source,target\nBank,Aldgate\n")
    assert parse_config(with_files_beside(with_example(2), CONFIGS, tmp_path), base_dir=tmp_path).quasi_identifiers[0].h3
    raw = with_files_beside(example(), CONFIGS, tmp_path)
    assert raw["quasi_identifiers"][-1]["hierarchy"] == "files/oyster_location.json"
    anonymization = raw["anonymization"]
    for key in ("m", "m_horizon_s", "m_params"):
        del anonymization[key]
    anonymization.update(strategy="utility-clustering", strategy_params={"graphs": {"zone": "graph.csv"}})
    cfg = parse_config(copy.deepcopy(raw), base_dir=tmp_path)
    assert cfg.anonymization.strategy_params["graphs"] == {"zone": str((tmp_path / "graph.csv").resolve())}
    anonymization["strategy_params"] = {"graphs": {"zone": "missing.csv"}}
    with pytest.raises(ConfigError, match=r"^anonymization\.strategy_params\.graphs\.zone: file not found: "):
        parse_config(raw, base_dir=tmp_path)




# -- the audit refuses what the worker refuses (issue 43 item 13) --------------------------------------------------
def _worker_refusal_cases() -> list[tuple[dict, str]]:
    """(raw config, dotted key) of every numeric-key refusal above (the reference's keys: NaN, +-inf, a boolean, out
    of range) and the issue's cases on the bundled oyster config (k = 0, negative, 2^64; max_future_s, window_s =
    NaN; an epsilon per period of 2^64)."""
    cases = []
    for table, row in NUMERIC:
        if table == "kafka":               # connection settings: not the stream config's validation
            continue
        key = row["key"]
        bad = [math.nan, math.inf, True] + out_of_range(row["range"], lambda other: _holder(table, key)[other])
        cases += [place(table, key, key, value) for value in bad]
    for table, key, value in (("anonymization", "k", 0), ("anonymization", "k", -3), ("anonymization", "k", 2 ** 64),
                              ("stream", "max_future_s", math.nan), ("anonymization", "window_s", math.nan),
                              ("dp", "epsilon_per_period", 2 ** 64)):
        raw = oyster()
        raw[table][key] = value
        cases.append((raw, f"{table}.{key}"))
    return cases


@pytest.mark.parametrize("command", ["audit", "report"])
def test_the_audit_and_the_report_refuse_every_config_the_worker_refuses(command, tmp_path, monkeypatch, capsys):
    """The audit's own config reader accepted what the worker refuses (k = 0, negative or 2^64, a NaN window): an
    audit with such a config judged nothing. Each refusal case of the worker, written as a file, goes through the
    command: exit 2 and one line, the worker's message for that file, before any broker is asked (none listens)."""
    import socket

    from stream_anon.calibrate import toml_text
    from stream_anon.cli import main

    monkeypatch.setenv("STREAM_ANON_SECRET", "0123456789abcdef0123456789abcdef")
    with socket.socket() as s:               # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    cases = _worker_refusal_cases()
    assert len(cases) >= 200
    path = tmp_path / "stream.toml"
    for raw, dotted in cases:
        path.write_text(toml_text(with_files_beside(raw, CONFIGS, tmp_path)))
        with pytest.raises(ConfigError) as worker:
            load_config(path)
        assert str(worker.value).startswith(f"{dotted}:"), (dotted, str(worker.value))
        extra = ["--out", str(tmp_path / "r.html")] if command == "report" else []
        rc = main([command, "--config", str(path), "--broker", closed, "--timeout", "0.5", *extra])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert rc == 2 and lines == [f"stream-anon {command}: {path}: {worker.value}"], (dotted, lines)

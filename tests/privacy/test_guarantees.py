"""The settings fingerprint covers the whole config (stream_anon/guarantees.py): every dataclass field of
``StreamConfig`` and its sections, recursively, changes the recorded settings when its value changes, unless it is
declared not guarantee-bearing with a reason, and then it changes nothing. A field added to the config without a
decision fails here; so does a config shape no bundled config exercises (add an example below)."""
from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import copy_hierarchies  # noqa: E402

from stream_anon import contract, guarantees  # noqa: E402
from stream_anon.config import load_config  # noqa: E402

CRITERIA = """
[[anonymization.criteria]]
kind = "distinct_l_diversity"
field = "product_category"
l = 2

[[anonymization.criteria]]
kind = "entropy_l_diversity"
field = "full_fare_pence"
l = 1.5

[[anonymization.criteria]]
kind = "frequency_l_diversity"
field = "daily_capping"
l = 1.5

[[anonymization.criteria]]
kind = "severity"
field = "fare_product"
severity = { PAYG = 2, Other = 3 }
"""


class _Changed:
    """A value no setting has: what a field is set to, to see whether the settings record it."""

    def __repr__(self) -> str:
        return "<changed>"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list:
    """Every bundled config, every bundled [input] example and oyster with a criterion of each kind."""
    tmp = tmp_path_factory.mktemp("criteria")
    copy_hierarchies(tmp)
    with_criteria = tmp / "criteria.toml"
    with_criteria.write_text(contract.config_path("oyster").read_text() + CRITERIA)
    paths = [contract.config_path(n) for n in contract.config_names()]
    paths += sorted((contract.configs_dir() / "inputs").glob("*.toml")) + [with_criteria]
    return [load_config(p) for p in paths]


def instances(obj, cls) -> list:
    """Every instance of dataclass ``cls`` in the config tree below ``obj`` (dataclass fields, tuples, lists)."""
    out = []
    if isinstance(obj, cls):
        out.append(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out += instances(getattr(obj, f.name), cls)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            out += instances(item, cls)
    return out


def changed_settings(config, name: str, cls) -> dict | None:
    """The settings of a copy of ``config`` with field ``name`` of its first ``cls`` changed (an entry field: its
    last entry removed); None when the config has no such field to change."""
    field = name.split(".", 1)[1]
    config = copy.deepcopy(config)
    found = instances(config, cls)
    if not found:
        return None
    obj = found[0]
    if name in guarantees.ENTRIES:
        if not getattr(obj, field):
            return None
        object.__setattr__(obj, field, tuple(getattr(obj, field))[:-1])
    else:
        object.__setattr__(obj, field, _Changed())
    return guarantees.settings(config)


def test_every_field_of_the_config_is_a_setting_or_declared_not_guarantee_bearing(corpus):
    schema = guarantees.schema()
    assert len(schema) > 100
    uncovered, untrue, unexercised = [], [], []
    for name, cls in schema.items():
        if name in guarantees.SECTIONS:          # a section's own fields are the settings
            continue
        config, changed = next(((c, s) for c in corpus if (s := changed_settings(c, name, cls)) is not None),
                               (None, None))
        if config is None:
            unexercised.append(name)
            continue
        differs = changed != guarantees.settings(config)
        if name in guarantees.NOT_GUARANTEES:
            if differs:
                untrue.append(name)
        elif not differs:
            uncovered.append(name)
    assert uncovered == [], f"settings no fingerprint covers (record them or declare why not): {uncovered}"
    assert untrue == [], f"declared not guarantee-bearing, yet recorded: {untrue}"
    assert unexercised == [], f"no config of the corpus has a value of: {unexercised}"


def test_every_declaration_names_a_field_of_the_config_and_says_why():
    schema = guarantees.schema()
    for name, why in guarantees.NOT_GUARANTEES.items():
        assert name in schema, name
        assert isinstance(why, str) and len(why) > 10, name
    for name in (*guarantees.DIGESTED, *guarantees.SECTIONS, *guarantees.ENTRIES, *guarantees.KEY_OF):
        assert name in schema, name


def test_the_settings_of_the_issue_and_of_the_change_table_are_recorded(corpus):
    """Changing one of them on a bundled config changes the fingerprint the manifests carry."""
    citibike = next(c for c in corpus if c.stream.name == "citibike" and c.source.parent == contract.configs_dir())
    base = guarantees.fingerprint(guarantees.settings(citibike))
    qi = citibike.quasi_identifiers[-1]
    edits = {"stream.privacy_unit": lambda c: dataclasses.replace(c, stream=dataclasses.replace(
                 c.stream, privacy_unit="trip_id")),
             "quasi_identifiers.birth_year.lower": lambda c: dataclasses.replace(c, quasi_identifiers=(
                 *c.quasi_identifiers[:-1], dataclasses.replace(qi, lower=(1920.0,)))),
             "identifiers.drop": lambda c: dataclasses.replace(c, drop=c.drop[:-1]),
             "sensitive.fields": lambda c: dataclasses.replace(c, sensitive=c.sensitive[:-1])}
    for key, edit in edits.items():
        changed = guarantees.settings(edit(citibike))
        assert guarantees.fingerprint(changed) != base, key
        assert [line.split(" ")[0] for line in guarantees.changes(guarantees.settings(citibike), changed)] == [key]


def test_a_set_is_recorded_in_one_order_whatever_the_hash_seed():
    """A frozenset's iteration order follows the string hash seed of the process: recorded sorted, a restarted
    worker finds the same settings."""
    values = frozenset(f"v{i}" for i in range(50))
    assert guarantees._plain(values) == sorted(values)


def test_the_settings_are_the_same_for_a_copy_of_the_config(corpus):
    """No setting is recorded by something of the process (an object's address): a restarted worker, or another one,
    records the same settings from the same file."""
    for config in corpus:
        assert guarantees.settings(copy.deepcopy(config)) == guarantees.settings(config), config.source

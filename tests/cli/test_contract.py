"""stream_anon.contract: topic names from topics.toml, bundled configs by name, resources of the package."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from stream_anon import contract
from stream_anon.cli import _bundled_config_resolved
from stream_anon.config import load_config
from stream_anon.contract import ContractError, Topics

ROOT = Path(__file__).resolve().parents[2]
DEFINED = {t["name"] for t in tomllib.loads((ROOT / "topics" / "topics.toml").read_text())["topic"]}


def test_topic_names_come_from_topics_toml_and_are_defined():
    t = contract.topics()
    shared = {t.releases, t.deadletter, t.metrics, t.aggregates}
    assert len(shared) == 4 and shared <= DEFINED
    for name in contract.config_names():    # every bundled stream's input and records topics are defined
        cfg = load_config(contract.config_path(name))
        assert {Topics.raw(cfg), t.records(cfg.stream.name)} <= DEFINED, name
        assert t.of_stream(cfg)[:2] == [cfg.stream.input_topic, t.records(cfg.stream.name)]
        assert (t.aggregates in t.of_stream(cfg)) == (cfg.dp is not None)


SHARED = 'releases = "r"\ndeadletter = "d"\nmetrics = "m"\naggregates = "a"\n'


@pytest.mark.parametrize("names, error", [
    ('records = "anon.records"\n' + SHARED, "records must contain '{stream}'"),
    ('records = "anon.{stream}.records"\nreleases = "r"\n', "lacks ['deadletter', 'metrics', 'aggregates']"),
])
def test_names_table_is_checked(tmp_path, names, error):
    path = tmp_path / "topics.toml"
    path.write_text(f"[names]\n{names}")
    with pytest.raises(ContractError, match=re.escape(error)):
        Topics.from_toml(path)


def test_names_must_be_defined_topics(tmp_path):
    text = (contract.topics_dir() / contract.TOPICS_FILE).read_text()
    path = tmp_path / "topics.toml"
    path.write_text(text.replace('metrics = "anon.metrics"', 'metrics = "anon.metricz"'))
    with pytest.raises(ContractError, match="anon.metricz"):
        Topics.from_toml(path)


def test_bundled_config_loads_with_its_hierarchies():
    cfg = load_config(contract.config_path("oyster"))
    location = next(q for q in cfg.quasi_identifiers if q.name == "location")
    assert location.hierarchy is not None and location.hierarchy.n_leaves > 100
    with pytest.raises(ContractError, match="bundled: citibike, citibike-h3, obd2, obd2-h3, oyster, oyster-cards"):
        contract.config_path("taxi")


def test_config_names_resolve_unless_a_file_of_that_name_exists(tmp_path, monkeypatch):
    assert contract.resolve_config("oyster") == contract.config_path("oyster")
    assert contract.resolve_config("my.toml") == Path("my.toml")      # loading it reports the missing file
    assert _bundled_config_resolved(["--broker", "b", "--config", "citibike"]) == \
        ["--broker", "b", "--config", str(contract.config_path("citibike"))]
    assert _bundled_config_resolved(["--config=obd2"]) == [f"--config={contract.config_path('obd2')}"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "oyster").write_text("")
    assert contract.resolve_config("oyster") == Path("oyster")


def test_schemas_and_data_files():
    assert contract.schema("vehicle")["title"] == "vehicle event"
    with pytest.raises(ContractError, match="taxi"):
        contract.schema("taxi")
    assert contract.data_path("adult_hierarchies").is_dir()
    with pytest.raises(ContractError):
        contract.data_path("nope.csv")

"""The files a config names lie in its directory tree (issue 28): a hierarchy, lookup table or aggregate group
file outside it is refused with one line naming the key and the path, by the worker's config reader and by the
audit's, unless the operator allows it (``--allow-outside-paths``); the bundled configs load as they are, and a
calibrated copy written elsewhere carries its files with it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stream_anon import contract
from stream_anon.audit import AuditConfig
from stream_anon.audit.inputs import raw_decoder
from stream_anon.calibrate import calibrate, toml_text
from stream_anon.config import ConfigError, load_config, with_files_beside
from stream_anon.datasets import load_events

ROOT = Path(__file__).resolve().parents[2]
SECRET = "config-paths-secret-0123456789abcdef-Zq"
ZONES = {"name": "zones", "levels": ["value", "*"], "tree": {"*": ["Bank", "Aldgate", "Holborn"]}}


def oyster_copy(directory: Path, **zone_path) -> Path:
    """configs/oyster.toml (without its DP tables) in ``directory``, its hierarchies beside it; ``zone_path``
    (``hierarchy=...``) replaces the location hierarchy's path as written in the file."""
    src = contract.config_path("oyster")
    raw = tomllib.loads(src.read_text())
    raw.pop("dp", None)
    raw.pop("aggregates", None)
    with_files_beside(raw, src.parent, directory)
    location = next(q for q in raw["quasi_identifiers"] if q["name"] == "location")
    location.update(zone_path)
    path = directory / "stream.toml"
    path.write_text(toml_text(raw))
    return path


@pytest.fixture
def outside(tmp_path) -> Path:
    """A readable hierarchy file outside the config's directory ``tmp_path/cfg``."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "elsewhere").mkdir()
    src = contract.configs_dir() / "hierarchies" / "oyster_location.json"
    (tmp_path / "elsewhere" / "zones.json").write_text(src.read_text())
    return tmp_path / "elsewhere" / "zones.json"


@pytest.mark.parametrize("written", ["relative", "absolute", "missing"])
def test_a_hierarchy_outside_the_config_directory_is_refused_naming_the_key_and_the_path(tmp_path, outside, written):
    cfg_dir = tmp_path / "cfg"
    value = {"relative": "../elsewhere/zones.json", "absolute": str(outside),
             "missing": "../elsewhere/none.json"}[written]       # refused as outside before it is looked for
    path = oyster_copy(cfg_dir, hierarchy=value)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    expect = outside if written != "missing" else outside.with_name("none.json")
    assert msg == (f"quasi_identifiers.location.hierarchy: {expect} is outside {cfg_dir.resolve()}, the config's "
                   "directory (a file elsewhere needs --allow-outside-paths)"), msg
    if written != "missing":
        assert load_config(path, allow_outside_paths=True).quasi_identifiers[1].hierarchy.n_leaves > 2
        # the audit reads the config on its own, by the same rule
        with pytest.raises(ConfigError, match=r"^quasi_identifiers\.location\.hierarchy: .* is outside "):
            AuditConfig.from_toml(path)
        assert AuditConfig.from_toml(path, allow_outside_paths=True).quasi_identifiers[1].hierarchy is not None


def test_files_inside_the_tree_load_by_any_path_and_a_link_leading_out_is_refused(tmp_path, outside):
    cfg_dir = tmp_path / "cfg"
    (cfg_dir / "deep" / "er").mkdir(parents=True)
    (cfg_dir / "deep" / "er" / "zones.json").write_text(outside.read_text())
    for value in ("deep/er/zones.json", "deep/../deep/er/zones.json", str(cfg_dir / "deep" / "er" / "zones.json")):
        assert load_config(oyster_copy(cfg_dir, hierarchy=value)).quasi_identifiers[1].hierarchy.n_leaves > 2
    (cfg_dir / "link.json").symlink_to(outside)      # the path is judged with links followed
    with pytest.raises(ConfigError, match=r"^quasi_identifiers\.location\.hierarchy: .*elsewhere/zones\.json is "
                                          r"outside "):
        load_config(oyster_copy(cfg_dir, hierarchy="link.json"))


def test_lookup_tables_and_aggregate_groups_follow_the_same_rule(tmp_path):
    # a CSV lookup of a mapped [input], for the worker's reader and for the audit's decoder
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (tmp_path / "aliases.csv").write_text("source,result\nBank (Central),Bank\n")
    src = contract.configs_dir() / "inputs" / "oyster-csv.toml"
    raw = with_files_beside(tomllib.loads(src.read_text()), src.parent, cfg_dir)
    raw["input"]["fields"]["station"]["lookup"] = "../aliases.csv"
    path = cfg_dir / "mapped.toml"
    path.write_text(toml_text(raw))
    with pytest.raises(ConfigError, match=r"^input\.fields\.station\.lookup: .*/aliases\.csv is outside "):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^input\.fields\.station\.lookup: .*/aliases\.csv is outside "):
        raw_decoder(path, SECRET.encode())
    assert load_config(path, allow_outside_paths=True).input.fields
    assert raw_decoder(path, SECRET.encode(), allow_outside_paths=True) is not None
    # a hierarchy of a DP aggregate's group
    src = contract.config_path("oyster")
    raw = with_files_beside(tomllib.loads(src.read_text()), src.parent, cfg_dir)
    group = next(g for a in raw["aggregates"] for g in a.get("group_by", []) if "hierarchy" in g)
    (tmp_path / "zones.json").write_text((cfg_dir / group["hierarchy"]).read_text())
    group["hierarchy"] = str(tmp_path / "zones.json")
    path = cfg_dir / "dp.toml"
    path.write_text(toml_text(raw))
    with pytest.raises(ConfigError, match=r"^aggregates\..*\.hierarchy: .*/zones\.json is outside "):
        load_config(path)
    assert load_config(path, allow_outside_paths=True).dp is not None


def test_every_bundled_config_loads_by_the_rule_and_a_calibrated_copy_carries_its_files(tmp_path):
    root = contract.configs_dir()
    bundled = sorted(root.glob("*.toml")) + sorted((root / "inputs").glob("*.toml"))
    assert len(bundled) >= 11
    for path in bundled:        # configs/inputs/*.toml name ../hierarchies: the bundled configs are one tree
        load_config(path)
    out = tmp_path / "deploy" / "oyster-csv.toml"
    out.parent.mkdir()
    calibrate(root / "inputs" / "oyster-csv.toml", load_events("oyster", limit=200), out)
    text = out.read_text()
    assert 'hierarchy = "files/oyster_location.json"' in text and 'lookup = "files/oyster_station_aliases.csv"' in text
    load_config(out)            # without --allow-outside-paths
    # a config whose files lie outside is not copied from without the flag
    (tmp_path / "cfg").mkdir()
    (tmp_path / "zones.json").write_text((root / "hierarchies" / "oyster_location.json").read_text())
    src = oyster_copy(tmp_path / "cfg", hierarchy="../zones.json")
    with pytest.raises(ConfigError, match="is outside"):
        calibrate(src, load_events("oyster", limit=200), tmp_path / "deploy" / "copy.toml")
    assert not (tmp_path / "deploy" / "copy.toml").exists()


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STREAM_ANON_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "stream_anon.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)


def test_worker_audit_and_evaluate_refuse_in_one_line_and_take_the_flag(tmp_path, outside):
    path = oyster_copy(tmp_path / "cfg", hierarchy="../elsewhere/zones.json")
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in load_events("oyster", limit=50)))
    runs = {"worker": ("worker", "--config", str(path), "--broker", "127.0.0.1:9", "--broker-wait", "1"),
            "audit": ("audit", "--config", str(path), "--broker", "127.0.0.1:9"),
            "evaluate": ("evaluate", "--config", str(path), "--file", str(events), "--k", "5", "--strategies",
                         "mondrian", "--no-baselines", "--out", str(tmp_path / "eval"))}
    for name, args in runs.items():
        done = _cli(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (name, done.stderr)
        assert "quasi_identifiers.location.hierarchy:" in lines[0] and str(outside) in lines[0]
        assert "--allow-outside-paths" in lines[0], lines[0]
    # with the flag the worker gets past its config: to the broker, which is not there
    done = _cli(*runs["worker"], "--allow-outside-paths")
    assert done.returncode == 2 and "unreachable" in done.stderr and "outside" not in done.stderr, done.stderr

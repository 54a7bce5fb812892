"""Command line, configuration validation and the deployment description (no broker needed)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from stream_anon.cli import build_parser, main
from stream_anon.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.anonymization.k >= 2
    assert cfg.stream.privacy_unit in cfg.identifiers


def _raw(path="oyster.toml"):
    return tomllib.loads((ROOT / "configs" / path).read_text())


@pytest.mark.parametrize("mutate, key", [
    (lambda r: r["anonymization"].update(k=1), "anonymization.k"),
    (lambda r: r["anonymization"].update(k="ten"), "anonymization.k"),
    (lambda r: r["anonymization"].update(max_delay_s=10), "anonymization.max_delay_s"),
    (lambda r: r["anonymization"].update(strategy="magic"), "anonymization.strategy"),
    (lambda r: r["anonymization"].update(reuse="sometimes"), "anonymization.reuse"),
    (lambda r: r["stream"].pop("privacy_unit"), "stream.privacy_unit"),
    (lambda r: r["quasi_identifiers"][0].pop("lower"), "quasi_identifiers.time.lower"),
    (lambda r: r["quasi_identifiers"][0].update(kind="colour"), "quasi_identifiers.time.kind"),
    (lambda r: r["quasi_identifiers"][1].update(hierarchy="missing.json"), "quasi_identifiers.location.hierarchy"),
    (lambda r: r["sensitive"]["fields"].append("journey_id"), "sensitive.fields"),
])
def test_bad_config_names_the_key(mutate, key):
    raw = _raw()
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        parse_config(raw, base_dir=ROOT / "configs")
    assert str(err.value).startswith(key), str(err.value)


def test_cli_refuses_bad_requests_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """What argparse cannot check: the CLI's own refusals exit 2 with one line naming the command and the
    problem, and do nothing (no output directory, no traceback)."""
    monkeypatch.setenv("STREAM_ANON_SECRET", "cli-test-secret-0123456789abcdef0123")
    out = tmp_path / "eval"
    cases = [
        (["evaluate", "--dataset", "adult", "--strategies", "mondrian,magic", "--out", str(out)],
         ["stream-anon evaluate:", "'magic'", "mondrian"]),
        (["evaluate", "--dataset", "adult", "--k", "2,five", "--out", str(out)],
         ["stream-anon evaluate:", "--k", "'2,five'"]),
        (["replay", "--topic", "raw.x", "--broker", "127.0.0.1:1"],
         ["stream-anon replay:", "JSONL FILE or --dataset"]),
        (["calibrate", "--config", str(tmp_path / "missing.toml"), "--file", str(tmp_path / "none.jsonl"),
          "--out", str(tmp_path / "c.toml")], ["stream-anon calibrate:", "none.jsonl"]),
        (["audit", "--config", str(tmp_path / "missing.toml"), "--broker", "127.0.0.1:1"],
         ["stream-anon audit:", "missing.toml"]),
    ]
    for argv, needles in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert all(n in err for n in needles), (argv, err)
    assert not out.exists() and not (tmp_path / "c.toml").exists()
    # without the secret the commands that need one refuse before touching a broker or a file
    monkeypatch.delenv("STREAM_ANON_SECRET")
    assert main(["replay", str(tmp_path / "none.jsonl"), "--topic", "raw.x", "--broker", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stream-anon replay:") and "STREAM_ANON_SECRET" in err


def test_worker_command_is_the_worker_parser():
    # `stream-anon worker ...` hands its arguments to the worker's own parser (the main parser has no
    # options for it): its help lists the worker's flags
    from stream_anon.kafka.app import build_parser as worker_parser
    out = subprocess.run([sys.executable, "-m", "stream_anon.cli", "worker", "--help"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    flags = {a for action in worker_parser()._actions for a in action.option_strings if a.startswith("--")}
    assert "--config" in flags and all(f in out.stdout for f in flags)


def test_worker_refuses_to_start_without_secret(monkeypatch, capsys):
    monkeypatch.delenv("STREAM_ANON_SECRET", raising=False)
    assert main(["worker", "--config", str(ROOT / "configs" / "oyster.toml"), "--broker", "127.0.0.1:1"]) == 2
    assert "STREAM_ANON_SECRET" in capsys.readouterr().err


def test_calibrate_writes_fixed_bounds(tmp_path):
    from stream_anon.datasets import load_events
    out = tmp_path / "obd2.toml"
    # hierarchy-free config: calibrated copy validates wherever it is written
    assert main(["calibrate", "--config", str(ROOT / "configs" / "obd2.toml"), "--dataset", "obd2",
                 "--out", str(out)]) == 0
    cfg = load_config(out)
    speeds = [e["speed_kmh"] for e in load_events("obd2") if e["speed_kmh"] is not None]
    speed = next(q for q in cfg.quasi_identifiers if q.name == "speed")
    assert speed.lower[0] <= min(speeds) and speed.upper[0] >= max(speeds)
    assert speed.upper[0] - max(speeds) < 1


def test_calibrate_keeps_the_configs_comments_and_inline_tables(tmp_path):
    """The calibrated copy is the user's file with its bounds written in (issue 43 item 11): its comments, inline
    tables and key order stay; a calibration of a calibrated file has one header; --apply-suggestions keeps them
    too."""
    src = (ROOT / "configs" / "obd2.toml").read_text()
    out, again = tmp_path / "obd2.toml", tmp_path / "again.toml"
    assert main(["calibrate", "--config", str(ROOT / "configs" / "obd2.toml"), "--dataset", "obd2",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Calibrated by `stream-anon calibrate` from ") and text.count("# Calibrated by") == 1
    for line in src.splitlines():
        if line.lstrip().startswith("#") or "= {" in line:
            assert line in text, line                  # every comment and inline table, as written
    assert "grid_deg = 0.001          # published boxes snap outward to a ~110 m grid" in text
    speed = next(q for q in load_config(out).quasi_identifiers if q.name == "speed")
    assert (speed.lower[0], speed.upper[0]) != (0, 200)            # the bounds are the sample's
    assert main(["calibrate", "--config", str(out), "--dataset", "obd2", "--out", str(again)]) == 0
    assert again.read_text().count("# Calibrated by") == 1 and again.read_text().splitlines()[1:] == \
        text.splitlines()[1:]

    from stream_anon.calibrate import write_suggestions

    def edit(doc):
        doc["anonymization"]["k"] = 4
        return doc
    write_suggestions(out, edit)
    lines = out.read_text().splitlines()
    assert lines[1] == "# Settings suggested from the sample (stream-anon calibrate --apply-suggestions)."
    assert lines[0] == text.splitlines()[0] and lines[2:] == [x.replace("k = 3", "k = 4") if x == "k = 3" else x
                                                            for x in text.splitlines()[1:]]
    assert load_config(out).anonymization.k == 4

def test_docker_compose_uses_existing_commands_and_topics():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"   # KRaft
    topics = {t["name"] for t in tomllib.loads((ROOT / "topics" / "topics.toml").read_text())["topic"]}
    parser = build_parser()
    workers = [s for s in services.values() if s.get("command", [None])[0] == "worker"]
    assert len(workers) >= 2
    for name, service in services.items():
        command = service.get("command")
        if not command:
            continue
        if command[0] == "worker":
            from stream_anon.kafka.app import build_parser as worker_parser
            args = worker_parser().parse_args(command[1:])
            from stream_anon.contract import resolve_config
            cfg = load_config(resolve_config(args.config))      # a bundled config by name (the image has no checkout)
            assert cfg.stream.input_topic in topics and f"anon.{cfg.stream.name}.records" in topics
        else:
            parser.parse_args(command)   # raises SystemExit on an unknown command or flag
    for name in ("anon.releases", "anon.deadletter", "anon.metrics"):
        assert name in topics


def test_readme_shows_the_two_commands_first():
    text = (ROOT / "README.md").read_text()
    first_code = re.search(r"```(?:sh|bash)?\n(.*?)```", text, re.S).group(1)
    assert "make demo" in first_code and "make test" in first_code


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.toml")), ids=lambda p: p.name)
def test_toml_writer_roundtrips_every_shipped_config(path):
    # demo and calibrate rewrite configs with this writer: nested arrays of tables ([[aggregates.group_by]])
    # and inline tables must survive, or a derived config silently loses its aggregates
    from stream_anon.calibrate import toml_text
    raw = tomllib.loads(path.read_text())
    assert tomllib.loads(toml_text(raw)) == raw


# ------------------------------------------------------------------------------------------- partitions (issue 12)
@pytest.mark.parametrize("value, message", [(0, r"must be in \[1, 1024\], got 0"), (2.5, "expected an integer"),
                                            ("4", "expected an integer"), (5000, r"must be in \[1, 1024\]")])
def test_stream_partitions_validated(value, message):
    raw = _raw()
    raw["stream"]["partitions"] = value
    with pytest.raises(ConfigError, match=rf"stream.partitions: .*{message}"):
        parse_config(raw, base_dir=ROOT / "configs")


def test_input_partitions_decided_by_stream_then_definition_then_default():
    from stream_anon.kafka.topics import DEFAULT_INPUT_PARTITIONS, input_partitions, load_topic_definitions, \
        stream_topic_defs

    defs = load_topic_definitions()
    raw = _raw()
    assert input_partitions(parse_config(raw, base_dir=ROOT / "configs"), defs) == (4, "topic definition")
    raw["stream"]["partitions"] = 2
    declared = parse_config(raw, base_dir=ROOT / "configs")
    assert declared.stream.partitions == 2
    assert input_partitions(declared, defs) == (2, "[stream] partitions")
    got = stream_topic_defs(declared, defs)
    assert got["raw.fare.oyster"].partitions == 2 and got["raw.fare.oyster"].value_schema is not None
    assert set(got) == {"raw.fare.oyster", "anon.oyster.records", "anon.releases", "anon.deadletter",
                        "anon.metrics", "anon.aggregates"}          # oyster has DP aggregates
    raw = _raw()
    raw["stream"].update(name="taxi", input_topic="raw.vehicle.taxi")
    new = parse_config(raw, base_dir=ROOT / "configs")
    n, why = input_partitions(new, defs)
    assert n == DEFAULT_INPUT_PARTITIONS == 1 and why.startswith("default")
    got = stream_topic_defs(new, defs)
    assert (got["raw.vehicle.taxi"].partitions, got["anon.taxi.records"].partitions) == (1, 1)


def test_topics_apply_takes_stream_configs(monkeypatch, tmp_path, capsys):
    from stream_anon import connection
    from stream_anon.kafka import topics as topics_mod

    applied = {}
    monkeypatch.setattr(topics_mod, "apply_topics",
                        lambda conn, defs: applied.update(conn=conn, defs=defs) or {n: "created" for n in defs})
    monkeypatch.setattr(connection, "broker_unreachable", lambda conn, timeout_s: None)    # the plan is the subject
    raw = (ROOT / "configs" / "obd2.toml").read_text().replace('input_topic = "raw.vehicle.obd2"',
                                                              'input_topic = "raw.vehicle.fleet"\npartitions = 2')
    assert "raw.vehicle.fleet" in raw
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(raw)
    assert main(["topics", "apply", "--broker", "127.0.0.1:1", "--config", str(cfg)]) == 0
    assert applied["defs"]["raw.vehicle.fleet"].partitions == 2
    # the shared topics and this stream's, no other stream's
    assert set(applied["defs"]) == {"raw.vehicle.fleet", "anon.obd2.records", "anon.releases", "anon.deadletter",
                                    "anon.metrics", "anon.aggregates"}
    assert applied["conn"].bootstrap == "127.0.0.1:1"
    assert "raw.vehicle.fleet: created" in capsys.readouterr().out


def test_worker_creates_the_input_topic_with_the_declared_partitions(monkeypatch, tmp_path):
    """The worker's topic creation uses the stream's decision (it used a hard-coded 4)."""
    from stream_anon.kafka import app as app_mod
    from stream_anon.kafka import topics as topics_mod

    monkeypatch.setenv("STREAM_ANON_SECRET", "cli-test-secret-0123456789abcdef0123")
    seen = {}
    monkeypatch.setattr(topics_mod, "apply_topics", lambda conn, defs: seen.update(conn=conn, defs=defs) or {})
    monkeypatch.setattr(app_mod, "run_worker", lambda config, conn, *a, **kw: seen.update(run=conn))
    monkeypatch.setattr(app_mod, "broker_unreachable", lambda conn, timeout_s: None)   # the topic plan is the subject
    raw = (ROOT / "configs" / "obd2.toml").read_text().replace('input_topic = "raw.vehicle.obd2"',
                                                              'input_topic = "raw.vehicle.fleet"\npartitions = 3')
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(raw)
    assert app_mod.worker_main(["--config", str(cfg), "--broker", "127.0.0.1:1", "--state-dir",
                                str(tmp_path / "s")]) == 0
    assert seen["defs"]["raw.vehicle.fleet"].partitions == 3
    assert seen["run"].bootstrap == "127.0.0.1:1"
    monkeypatch.setenv("STREAM_ANON_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    assert app_mod.worker_main(["--config", str(cfg), "--broker", "127.0.0.1:1"]) == 2    # refused at start


# ------------------------------------------------------------------------------------------- container (issue 12)
def _dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Dockerfile -> stages, each a list of (INSTRUCTION, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if op.upper() == "FROM":
            stages.append([])
        stages[-1].append((op.upper(), rest.strip()))
    return stages


def test_dockerfile_builds_the_wheel_like_the_wheel_test_and_runs_it_as_non_root():
    """No Docker engine here: the image's steps are checked against what tests/cli/test_wheel_install.py runs (build
    the wheel from these files with ``pip wheel --no-deps``, install it, run ``stream-anon``)."""
    import json as _json

    from test_wheel_install import PACKAGE_DIRS

    build, runtime = _dockerfile_stages()
    assert build[0] == ("FROM", "python:3.11-slim AS build") and runtime[0][1].startswith("python:3.11-slim ")
    copied = {src for op, args in build if op == "COPY" for src in args.split()[:-1]}
    assert copied == {"pyproject.toml", "README.md", "stream_anon", *PACKAGE_DIRS.values()}
    runs = " ".join(args for op, args in build if op == "RUN")
    assert "pip wheel" in runs and "--no-deps" in runs
    assert all(not (op == "COPY" and "--from=build" not in args) for op, args in runtime)   # only the wheel
    setup = " ".join(args for op, args in runtime if op == "RUN")
    # the wheel with the extras of the service and its report, as the wheel test's ``installed`` fixture
    assert re.search(r'pip install --no-cache-dir "\$\(ls /tmp/dist/stream_anon-\*\.whl\)\[service,report\]"',
                     setup)
    user = [args for op, args in runtime if op == "USER"][-1]
    assert user not in ("root", "0") and f"useradd --create-home --uid 10001 --user-group {user}" in setup
    volumes = [v for op, args in runtime if op == "VOLUME" for v in _json.loads(args)]
    for v in volumes:           # the non-root user can write the state directory
        assert f"chown {user}:{user} {v}" in setup
    entry = _json.loads([args for op, args in runtime if op == "ENTRYPOINT"][-1])
    assert entry == ["stream-anon"] and "stream-anon" in tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["scripts"]
    # the compose workers keep their state in that volume
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    from stream_anon.kafka.app import build_parser as worker_parser
    workers = {n: s for n, s in compose["services"].items() if s.get("command", [None])[0] == "worker"}
    for name, service in workers.items():
        state_dir = worker_parser().parse_args(service["command"][1:]).state_dir
        assert state_dir in volumes, name
        assert any(m.split(":")[1] == state_dir for m in service["volumes"]), name


def test_compose_env_commands_and_services_agree_with_the_cli():
    from stream_anon import connection, crypto
    from stream_anon.contract import resolve_config
    from stream_anon.kafka.app import build_parser as worker_parser

    text = (ROOT / "docker-compose.yml").read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    kafka = services["kafka"]["environment"]
    advertised = kafka["KAFKA_ADVERTISED_LISTENERS"].split("//", 1)[1]           # kafka:9092
    built = [n for n, s in services.items() if "build" in s]
    assert built == ["topics"] and all(s.get("image") == services["topics"]["image"] for n, s in services.items()
                                       if n != "kafka")
    topics_args = build_parser().parse_args(services["topics"]["command"])
    assert topics_args.broker == advertised and topics_args.config
    workers = [s for s in services.values() if s.get("command", [None])[0] == "worker"]
    app_ids = set()
    for w in workers:
        args = worker_parser().parse_args(w["command"][1:])
        assert args.broker == advertised and args.config in topics_args.config     # its topics were provisioned
        resolve_config(args.config)                                                 # a bundled config
        app_ids.add(args.app_id)
        assert crypto.SECRET_ENV in w["environment"] and ":?" in w["environment"][crypto.SECRET_ENV]
        assert "topics" in w["depends_on"] and w["depends_on"]["topics"]["condition"] == \
            "service_completed_successfully"
    assert len(workers) == 2 and len(app_ids) == 1             # one consumer group
    # every connection variable named (even in comments) is one the CLI reads
    named = set(re.findall(r"STREAM_ANON_KAFKA_([A-Z_]+)", text))
    assert named and {n.lower() for n in named} <= set(connection.SETTINGS)


def test_an_unreachable_broker_at_start_is_one_line_and_exit_2(tmp_path):
    """No traceback after a long wait: one line naming the broker, exit status 2."""
    import subprocess
    import sys

    env = {**os.environ, "STREAM_ANON_SECRET": "0123456789abcdef0123456789abcdef"}
    out = subprocess.run([sys.executable, "-m", "stream_anon.cli", "worker", "--config", "oyster", "--broker",
                          "127.0.0.1:9", "--state-dir", str(tmp_path), "--broker-wait", "2", "--loglevel", "warning"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stream-anon worker: broker 127.0.0.1:9 (PLAINTEXT) unreachable: "
                                                   "no answer to a metadata request within 2 s"), out.stderr
    assert "Traceback" not in out.stderr


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): a real broker address that refuses."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KAFKA_COMMANDS = {   # every command that talks to Kafka, with what it needs besides the broker
    "topics apply": ("topics", "apply", "--config", "oyster"),
    "replay": ("replay", "--dataset", "oyster", "--events", "10", "--topic", "raw.fare.oyster", "--config", "oyster",
               "--quiet"),
    "audit": ("audit", "--config", "oyster"),
    "aggregates": ("aggregates", "--config", "oyster-cards"),
    "report": ("report", "--config", "oyster", "--out", "report.html"),
    "worker": ("worker", "--config", "oyster", "--loglevel", "warning"),   # its INFO lines are its lifecycle
}


@pytest.mark.parametrize("command,timeout", [(c, 2.0) for c in sorted(KAFKA_COMMANDS)] + [("audit", None)])
def test_an_unreachable_broker_is_one_line_and_exit_2_within_the_timeout(command, timeout, tmp_path):
    """A refusing broker address: one line naming it, what a TCP connection met and what to check, exit 2,
    within --timeout (default at most 15 s) and a few seconds of start-up, for every command that talks to Kafka."""
    import time

    address = f"127.0.0.1:{_closed_port()}"
    argv = [*KAFKA_COMMANDS[command], "--broker", address] + ([] if timeout is None else ["--timeout", str(timeout)])
    env = {**os.environ, "STREAM_ANON_SECRET": "0123456789abcdef0123456789abcdef"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "stream_anon.cli", *argv], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    elapsed = time.monotonic() - started
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    said = re.match(rf"stream-anon {command}: broker {re.escape(address)} \(PLAINTEXT\) unreachable: no "
                    r"answer to a metadata request within ([0-9.]+) s", lines[0])
    assert said, lines[0]
    waited = float(said.group(1))
    assert waited == timeout if timeout is not None else 0 < waited <= 15
    assert f"{address}: connection refused" in lines[0] and f"check that a Kafka broker runs at {address} " \
        "(from --broker)" in lines[0], lines[0]
    # start-up: imports (the report's plotting ones), the config; 10.4 s for report at --timeout 2 on a loaded CI
    assert waited <= elapsed < waited + 15, elapsed
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("command", sorted(set(KAFKA_COMMANDS) - {"worker"}))   # the worker's: "config: file not found"
def test_a_missing_config_file_is_named_as_the_config_before_any_broker(command, tmp_path, monkeypatch, capsys):
    """``--config typo.toml``: one line saying the config file is not found (not a Kafka connection file), exit 2,
    and no broker asked (none listens at the address given); a bare name that is no bundled config lists those."""
    from stream_anon import connection

    monkeypatch.setenv("STREAM_ANON_SECRET", "0123456789abcdef0123456789abcdef")
    monkeypatch.chdir(tmp_path)
    asked = []
    monkeypatch.setattr(connection, "broker_unreachable", lambda conn, timeout_s: asked.append(conn) or "asked",
                        raising=False)
    base = list(KAFKA_COMMANDS[command])
    for typo, needles in (("typo.toml", ["config file not found: typo.toml"]),
                          ("oyter", ["config file not found: oyter", "bundled config", "oyster, "])):
        argv = [typo if a in ("oyster", "oyster-cards") and base[i - 1] == "--config" else a
                for i, a in enumerate(base)]
        assert main([*argv, "--broker", f"127.0.0.1:{_closed_port()}"]) == 2, argv
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"stream-anon {command}: "), lines
        assert all(n in lines[0] for n in needles) and "kafka" not in lines[0].lower(), lines[0]
    assert asked == []


def test_worker_session_timeout_from_flag_or_environment_and_refused_out_of_range(monkeypatch, capsys):
    """--session-timeout (or STREAM_ANON_SESSION_TIMEOUT_S) sets the consumer's session and heartbeat; outside
    1-300 s it is one argparse line and exit 2."""
    from stream_anon.kafka.app import build_parser as worker_parser
    from stream_anon.kafka.loop import group_timeouts

    base = ["--config", "c.toml", "--broker", "127.0.0.1:9092"]
    monkeypatch.delenv("STREAM_ANON_SESSION_TIMEOUT_S", raising=False)
    assert worker_parser().parse_args(base).session_timeout == 6.0
    assert group_timeouts(6.0) == {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    monkeypatch.setenv("STREAM_ANON_SESSION_TIMEOUT_S", "2")
    assert worker_parser().parse_args(base).session_timeout == 2.0
    assert worker_parser().parse_args(base + ["--session-timeout", "10"]).session_timeout == 10.0
    assert group_timeouts(2.0) == {"session.timeout.ms": 2000, "heartbeat.interval.ms": 333}
    for bad in ("0.5", "nan", "301", "soon"):
        with pytest.raises(SystemExit) as exc:
            worker_parser().parse_args(base + ["--session-timeout", bad])
        assert exc.value.code == 2
        assert "--session-timeout" in capsys.readouterr().err

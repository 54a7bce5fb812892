"""docker-compose.yml as the tests run it without Docker: its services, compose's variable substitution, a service's
command mapped to this machine (broker address, state volume, web port), and the TLS/SASL variables its comment
block shows."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _metrics_helpers import get  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SERVICES = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
# "      # STREAM_ANON_KAFKA_SASL_MECHANISM: SCRAM-SHA-512" in the worker's environment
_COMMENTED_KAFKA_VARIABLE = re.compile(r"^\s*#\s*(STREAM_ANON_KAFKA_\w+):\s*(.+?)\s*$")


def substituted(value: str, env: dict) -> str:
    """Compose's ``${NAME}`` and ``${NAME:?message}`` from ``env`` (a missing one fails, as compose does)."""
    def one(m):
        if m.group(1) not in env:
            raise AssertionError(f"compose needs {m.group(1)}: {m.group(2) or ''}")
        return env[m.group(1)]
    return re.sub(r"\$\{(\w+)(?::\?([^}]*))?\}", one, value)


def service_environment(service: str, env: dict) -> dict[str, str]:
    """``env`` with the service's ``environment`` added, substituted from ``env``."""
    spec = SERVICES[service].get("environment") or {}
    return {**env, **{k: substituted(str(v), env) for k, v in spec.items()}}


def command(service: str, bootstrap: str, state: Path, web_port: int) -> list[str]:
    """The service's command as this machine runs it: ``kafka:9092`` -> ``bootstrap``, ``/state`` -> ``state``,
    the web port 6066 -> ``web_port``."""
    argv = [a.replace("kafka:9092", bootstrap) for a in SERVICES[service]["command"]]
    argv = [str(state) if a == "/state" else a for a in argv]
    argv = [str(web_port) if a == "6066" else a for a in argv]
    return [sys.executable, "-m", "stream_anon.cli", *argv]


def commented_kafka_environment() -> dict[str, str]:
    """The ``STREAM_ANON_KAFKA_*`` variables of the commented TLS/SASL block, as a user who uncomments them gets
    them (values unsubstituted)."""
    found = {}
    for line in COMPOSE_FILE.read_text().splitlines():
        m = _COMMENTED_KAFKA_VARIABLE.match(line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def ready(port: int) -> bool:
    """The compose healthcheck: the worker's ``/readyz`` on ``port`` answers 200."""
    return get(port, "/readyz")[0] == 200

"""What ships for monitoring the workers: a Grafana dashboard (``dashboard.json``, a ``datasource`` and a
``stream`` variable) and Prometheus alert rules (``alerts.yml``). ``stream-anon monitoring`` prints their paths.

>>> sorted(p.name for p in paths().values())
['alerts.yml', 'dashboard.json']
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def paths() -> dict[str, Path]:
    """Name -> absolute path of each shipped file."""
    return {"grafana_dashboard": HERE / "dashboard.json", "prometheus_rules": HERE / "alerts.yml"}

"""docs/inputs.md: every worked config loads as a stream config, and each format's config maps the format the
section is about (the edge-case lines: tests/inputs/test_format_edges.py)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from stream_anon.config import parse_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "inputs.md"
SECTIONS = re.split(r"\n## ", DOC.read_text())


def _configs():
    for section in SECTIONS[1:]:
        fmt = re.match(r"`([a-z-]+)`", section)
        for block in re.findall(r"```toml\n(.*?)```", section, re.S):
            yield (fmt.group(1) if fmt else None), block


CONFIGS = list(_configs())


def test_a_worked_config_per_format():
    assert {fmt for fmt, _ in CONFIGS} == {"json", "tesla-fleet-telemetry", "gtfs-realtime"}   # csv: the guide


@pytest.mark.parametrize("fmt,block", CONFIGS, ids=[f for f, _ in CONFIGS])
def test_worked_configs_load(fmt, block):
    cfg = parse_config(tomllib.loads(block), base_dir=DOC.parent)
    assert cfg.input.format == fmt and cfg.input.event_key

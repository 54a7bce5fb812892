"""ruff, with the rule set of pyproject.toml ([tool.ruff]: syntax errors and pyflakes), finds nothing in the package,
the tests or the benchmarks; and it does find a planted unused import (the check is live)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_ruff_finds_nothing():
    out = ruff("stream_anon", "tests", "bench")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_finds_an_unused_import_with_the_projects_rules(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "planted.py").write_text("import os\n")
    out = ruff("planted.py", cwd=tmp_path)
    assert out.returncode == 1 and "F401" in out.stdout, out.stdout + out.stderr

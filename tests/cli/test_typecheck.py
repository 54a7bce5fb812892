"""mypy, with the configuration of pyproject.toml ([tool.mypy]: the whole package), finds no error; and it does find
a planted one with the project's configuration (the check is live)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_mypy_finds_no_error_in_the_package():
    out = mypy()
    assert out.returncode == 0, out.stdout[-20000:] + out.stderr


def test_mypy_finds_a_planted_error_with_the_projects_configuration(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "stream_anon").mkdir()
    (tmp_path / "stream_anon" / "__init__.py").write_text("")
    (tmp_path / "stream_anon" / "planted.py").write_text("def half(x: int) -> int:\n    return x / 2\n")
    out = mypy(cwd=tmp_path)
    assert out.returncode == 1 and "planted.py:2: error" in out.stdout, out.stdout + out.stderr

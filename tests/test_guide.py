"""docs/your-own-stream.md, executed: its fenced ``sh`` blocks run as written, in order, in one bash shell in an
empty directory, on the bundled Citi Bike slice (the guide cuts its own trips.csv from it). ``stream-anon`` and
``python`` are this interpreter (shims on PATH), the package is the checkout (PYTHONPATH). Starts a real broker
(the guide's own ``python -m stream_anon.broker``) and a worker: slow."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "your-own-stream.md"

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def guide_commands() -> str:
    blocks = re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 7, "the guide lost its commands"
    return "\n".join(blocks)


def _kill_left_behind(work: Path) -> None:
    """Processes the guide started and did not stop (worker, broker, its Tansu on the guide's port): found by their
    command line and killed by pid. With job control (``set -m``) every job has its own process group."""
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            cmd = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "tcp://127.0.0.1:39092" in cmd or "stream_anon.broker 39092" in cmd or \
                ("--broker 127.0.0.1:39092" in cmd and "worker" in cmd):
            try:
                os.kill(int(proc_dir.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_guide_has_every_step():
    script = guide_commands()
    for step in ("stream-anon calibrate", "python -m stream_anon.broker", "stream-anon topics apply",
                 "stream-anon worker", "stream-anon replay --file trips.csv", "stream-anon audit",
                 "stream-anon evaluate --config"):
        assert step in script, step


def test_guide_runs_as_written(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("stream-anon", f'exec "{sys.executable}" -m stream_anon.cli "$@"'),
                       ("python", f'exec "{sys.executable}" "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "guide.sh").write_text(guide_commands())
    env = os.environ.copy()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("STREAM_ANON_SECRET", None)
    proc = subprocess.Popen(["bash", "guide.sh"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_left_behind(work)
    assert proc.returncode == 0, out[-4000:]
    report = json.loads((work / "audit.json").read_text())
    assert report["passed"], json.dumps(report["summary"])
    s = report["summary"]
    assert s["events_in"] == 3000 and s["lost"] == 0 and s["duplicated"] == 0
    assert s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"] == 3000
    assert s["published"] > 2000 and s["min_individuals"] >= 5
    comparison = json.loads((work / "eval" / "comparison.json").read_text())
    assert comparison[0]["n"] == 3000 and 0 < comparison[0]["streaming_ncp"] < 1
    assert "Calibrated by `stream-anon calibrate`" in (work / "trips.calibrated.toml").read_text()

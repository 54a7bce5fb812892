"""The built wheel runs outside the repository: topic definitions, schemas, bundled configs (with their
hierarchies) and data slices are found inside the installed package (issue 12 item 1).

The ``installed`` fixture copies the sources the build reads to a temporary directory (the build leaves nothing
in the checkout), builds the wheel, installs it into a fresh virtual environment and runs commands from an empty
working directory with a clean environment. The dependencies are not downloaded and unpacked again (that took two
minutes of every test run): the fresh environment sees, through a ``.pth`` line, a directory of links to exactly
the distributions the wheel's own ``Requires-Dist`` needs under the extras installed (``service`` and ``report``,
as the container image; none for the core install of ``core_installed``), followed recursively, as installed in
the test environment; pip installs the wheel with ``--no-index``, so it must find every declared requirement there
at a version its specifier allows, and the package itself comes only from the wheel (the test environment's editable stream-anon is not linked). Further commands on the installed package
(broker, topics apply, worker, replay, audit, report) are one more test on the same fixture.
"""
from __future__ import annotations

import email.parser
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS = PYPROJECT["tool"]["setuptools"]["package-dir"]     # {"stream_anon.topics": "topics", ...}
PACKAGES = PYPROJECT["tool"]["setuptools"]["packages"]


def _packages_on_disk() -> set[str]:
    """Every package and data directory the wheel must hold: stream_anon's subpackages and the mapped
    directories with their subdirectories."""
    found = {".".join(p.relative_to(ROOT).parts[:-1]) for p in (ROOT / "stream_anon").rglob("__init__.py")}
    for package, directory in PACKAGE_DIRS.items():
        base = ROOT / directory
        found |= {".".join((package, *d.relative_to(base).parts)) for d in [base, *base.rglob("*")]
                  if d.is_dir() and d.name != "__pycache__"}
    return found


def test_pyproject_lists_every_package():
    """``packages`` is listed by hand (discovery cannot see mapped directories): a new subpackage or data folder
    must be added there, or the wheel silently lacks it."""
    assert set(PACKAGES) == _packages_on_disk()
    for directory in PACKAGE_DIRS.values():
        assert (ROOT / directory / "__init__.py").is_file()


@dataclass
class Installed:
    venv: Path
    workdir: Path

    def run(self, *args: str, timeout: float = 120.0, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """``stream-anon ARGS`` of the installed package, from the empty working directory."""
        return self._run([str(self.venv / "bin" / "stream-anon"), *args], timeout, env, check)

    def start(self, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
        """``stream-anon ARGS`` in the background."""
        return subprocess.Popen([str(self.venv / "bin" / "stream-anon"), *args], cwd=self.workdir,
                                env=self.env(env), text=True, **kw)

    def python(self, code: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return self._run([str(self.venv / "bin" / "python"), "-c", code], timeout)

    @staticmethod
    def env(extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
               and not k.startswith("STREAM_ANON_")}
        return {**env, **(extra or {})}

    def _run(self, cmd: list[str], timeout: float, env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, cwd=self.workdir, env=self.env(env), capture_output=True, text=True,
                              timeout=timeout)
        if check:
            assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc


def _wheel_requirements(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of the built wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        name, = (n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def _dependency_closure(requires: list[str], extras: set[str]) -> dict:
    """Canonical name -> installed distribution (of the test environment) for every requirement of ``requires``
    under ``extras`` and, recursively, theirs; each installed version must satisfy its specifier."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, seen = {}, set()
    todo = [(text, frozenset(extras)) for text in requires]
    while todo:
        text, active = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (active or {""})):
            continue
        name = canonicalize_name(req.name)
        dist = found.get(name) or metadata.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), f"{text}: {dist.version} installed"
        found[name] = dist
        if (name, frozenset(req.extras)) not in seen:
            seen.add((name, frozenset(req.extras)))
            todo += [(r, frozenset(req.extras)) for r in dist.requires or []]
    return found


def _link_dependencies(wheel: Path, extras: set[str], target: Path) -> Path:
    """A directory of links to every top-level file or package (and the ``.dist-info``) of the wheel's dependency
    closure in the test environment: a fresh environment with it on its path imports the dependencies and nothing
    else of the test environment (not pytest, not the editable stream-anon)."""
    target.mkdir()
    for dist in _dependency_closure(_wheel_requirements(wheel), extras).values():
        assert dist.files, f"{dist.metadata['Name']}: no RECORD"
        site = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}:
            if not (target / top).exists():
                (target / top).symlink_to(site / top)
    assert not (target / "stream_anon").exists()
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources the build reads."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("stream_anon", *PACKAGE_DIRS.values()):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp / "dist"),
                    str(src)], check=True, timeout=300, cwd=tmp)
    built, = (tmp / "dist").glob("stream_anon-*.whl")
    return built


def install(wheel: Path, extras: set[str], tmp: Path) -> Installed:
    """A fresh virtual environment under ``tmp`` with ``wheel[extras]`` installed from nothing but the wheel and
    links to its dependencies under those extras."""
    venv.create(tmp / "venv")
    python = tmp / "venv" / "bin" / "python"
    site, = (tmp / "venv" / "lib").glob("python3*/site-packages")
    (site / "dependencies.pth").write_text(f"{_link_dependencies(wheel, extras, tmp / 'dependencies')}\n")
    # neither the checkout nor PYTHONPATH (tests/conftest.py puts the checkout there for worker subprocesses) may
    # be on pip's path: it would take the checkout's stream_anon.egg-info for an installed stream-anon and skip
    # the wheel. pip runs under the fresh environment's python (--python), which has no pip of its own.
    target = f"{wheel}[{','.join(sorted(extras))}]" if extras else str(wheel)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index",
                    target], check=True, timeout=600, cwd=tmp, env=Installed.env())
    # (a clean environment and a working directory outside the checkout: with the checkout or any PYTHONPATH on
    # its path, pip would count packages found there (the editable stream_anon.egg-info) as installed)
    workdir = tmp / "work"
    workdir.mkdir()
    return Installed(tmp / "venv", workdir)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    """The wheel with the extras a service and its report need (what the container image installs)."""
    return install(wheel, {"service", "report"}, tmp_path_factory.mktemp("service"))


@pytest.fixture(scope="module")
def core_installed(wheel, tmp_path_factory) -> Installed:
    """The wheel without extras: ``pip install stream-anon``."""
    return install(wheel, set(), tmp_path_factory.mktemp("core"))


@pytest.mark.slow
def test_installed_package_finds_its_resources_inside_itself(installed):
    code = """
import json
from stream_anon import contract
from stream_anon.config import load_config
from stream_anon.datasets import DATASETS, load_events
from stream_anon.events import validate_event
from stream_anon.kafka.topics import load_topic_definitions
import stream_anon

config = load_config(contract.config_path("oyster"))
events = load_events("oyster", limit=200)
from stream_anon.inputs import decode_file
mapped = load_config(contract.configs_dir() / "inputs" / "oyster-csv.toml")   # lookups and hierarchies beside it
mapped_events, mapped_rejected = decode_file(contract.data_path("oyster_slice.csv.gz"), mapped.input)
print(json.dumps({
    "package": str(stream_anon.__file__),
    "roots": [str(contract.topics_dir()), str(contract.configs_dir()), str(contract.data_dir())],
    "topics": sorted(load_topic_definitions()),
    "records": contract.topics().records("oyster"),
    "fare_schema": contract.schema("fare")["title"],
    "configs": contract.config_names(),
    "hierarchies": {q.name: q.hierarchy.n_leaves for q in config.quasi_identifiers if q.hierarchy is not None},
    "slice": str(DATASETS["oyster"].slice_path),
    "events": len(events),
    "invalid": sum(validate_event(e, "fare") is not None for e in events),
    "mapped": [len(mapped_events), len(mapped_rejected)],
}))
"""
    got = json.loads(installed.python(code).stdout)
    site = Path(got["package"]).parent
    assert installed.venv in site.parents and ROOT not in site.parents
    assert [Path(r) for r in got["roots"]] == [site / "topics", site / "configs", site / "data"]
    defined = {t["name"] for t in tomllib.loads((ROOT / "topics" / "topics.toml").read_text())["topic"]}
    assert set(got["topics"]) == defined and got["records"] in defined
    assert got["fare_schema"] == "fare event"
    assert got["configs"] == sorted(p.stem for p in (ROOT / "configs").glob("*.toml"))
    assert got["hierarchies"]["location"] > 100          # oyster_location.json: every station and bus route
    assert Path(got["slice"]) == site / "data" / "oyster_slice.csv.gz"
    assert (got["events"], got["invalid"]) == (200, 0)
    assert got["mapped"] == [33536, 0]          # configs/inputs/oyster-csv.toml found its configs/lookups table


@pytest.mark.slow
def test_the_core_install_serves_the_api_without_a_kafka_client(core_installed):
    """``pip install stream-anon`` without extras: the examples of docs/api.md run (anonymize, the DataFrame, the
    audit), no module of the service extra is importable, let alone imported, and a command of the service extra
    says in one line which extra it needs."""
    from test_api import python_blocks

    from stream_anon.extras import EXTRAS

    script = python_blocks(ROOT / "docs" / "api.md") + f"""
import importlib.util, sys
service = {EXTRAS["service"]!r}
print("IMPORTED", sorted({{m.split(".")[0] for m in sys.modules}} & set(service)))
print("FINDABLE", [m for m in service if importlib.util.find_spec(m) is not None])
"""
    lines = core_installed.python(script, timeout=600).stdout.splitlines()
    assert "IMPORTED []" in lines and "FINDABLE []" in lines, lines[-2:]
    nowhere = ["--broker", "127.0.0.1:9"]          # the message comes before any connection
    for command in (["worker", "--config", "oyster"], ["broker"], ["replay", "--dataset", "oyster", "--topic", "t",
                                                                   *nowhere], ["audit", "--config", "oyster", *nowhere]):
        proc = core_installed.run(*command, check=False,
                                  env={"STREAM_ANON_SECRET": "core-" + "0123456789abcdef" * 2})
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (command, proc.stderr[-2000:])
        assert proc.stderr.startswith(f"stream-anon {command[0]}: ") and "pip install 'stream-anon[service]'" \
            in proc.stderr, proc.stderr


def test_each_extra_brings_the_modules_the_one_line_message_names():
    """stream_anon.extras.EXTRAS (the modules behind a command's one-line message) against pyproject.toml: every
    distribution of an extra provides one of its modules, and the core dependencies provide none."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from stream_anon.extras import EXTRAS

    optional = PYPROJECT["project"]["optional-dependencies"]
    provides: dict[str, set] = {}
    for top, dists in metadata.packages_distributions().items():
        for d in dists:
            provides.setdefault(canonicalize_name(d), set()).add(top)
    assert set(EXTRAS) <= set(optional)
    for extra, modules in EXTRAS.items():
        for text in optional[extra]:
            name = canonicalize_name(Requirement(text).name)
            assert provides[name] & set(modules), f"[{extra}] {name}: provides {provides[name]}, none in EXTRAS"
    for text in PYPROJECT["project"]["dependencies"]:
        name = canonicalize_name(Requirement(text).name)
        assert not provides.get(name, set()) & {m for ms in EXTRAS.values() for m in ms}, name
    assert {canonicalize_name(Requirement(t).name) for t in optional["test"]} >= {"stream-anon"}
    assert "stream-anon[service,report]" in optional["test"]      # make demo / make test install everything


@pytest.mark.slow
def test_the_wheel_states_its_licence_as_an_spdx_expression(installed):
    """pyproject.toml's ``license = "Apache-2.0"`` (PEP 639): setuptools writes License-Expression and prints no
    deprecation box, where the table form ``{ text = ... }`` wrote License and did (issue 43 item 10)."""
    meta = installed.python("from importlib.metadata import metadata; m = metadata('stream-anon'); "
                            "print(m['License-Expression'], m['License'])").stdout.split()
    assert meta == ["Apache-2.0", "None"]


@pytest.mark.slow
def test_installed_cli_lists_topics_calibrates_and_evaluates(installed):
    listed = installed.run("topics", "list").stdout.splitlines()
    defined = {t["name"] for t in tomllib.loads((ROOT / "topics" / "topics.toml").read_text())["topic"]}
    assert {line.split("\t")[0] for line in listed} == defined

    installed.run("calibrate", "--config", "oyster", "--dataset", "oyster", "--events", "2000",
                  "--out", "oyster-calibrated.toml")
    calibrated = tomllib.loads((installed.workdir / "oyster-calibrated.toml").read_text())
    time_qi, = (q for q in calibrated["quasi_identifiers"] if q["kind"] == "timestamp")
    assert time_qi["lower"].startswith("2009-11-09")
    # the files it names are copied beside it (a config's files lie in its directory tree)
    named = [q["hierarchy"] for q in calibrated["quasi_identifiers"] if "hierarchy" in q]
    assert named and all(h.startswith("files/") and (installed.workdir / h).is_file() for h in named), named

    installed.run("evaluate", "--dataset", "oyster", "--strategies", "mondrian", "--k", "5", "--limit", "2000",
                  "--no-baselines", "--out", "eval", timeout=300)
    rows = json.loads((installed.workdir / "eval" / "results.json").read_text())
    assert [(r["strategy"], r["k"]) for r in rows] == [("mondrian", 5)]
    assert 0 < rows[0]["ncp"] < 1


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


EVENTS = 3000          # of the bundled Oyster slice: enough for several releases in every partition


@dataclass
class Image:
    """What the Dockerfile's runtime stage runs: its environment, ENTRYPOINT + CMD and HEALTHCHECK command."""
    env: dict
    command: list
    healthcheck: list


def _image() -> Image:
    import re

    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    runtime = text[text.index(" AS runtime"):]
    env = dict(re.findall(r"^ENV (\w+)=(\S+)$", runtime, re.M))
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", runtime, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", runtime, re.M).group(1))
    check = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", runtime, re.M).group(1)
    return Image(env, entry + cmd, json.loads(check))


def _healthcheck(installed: Installed, image: Image, port: int) -> subprocess.CompletedProcess:
    """The image's HEALTHCHECK, its ``python`` the installed one, with the image's environment (the port: a free
    one, as tests run side by side)."""
    argv = [str(installed.venv / "bin" / "python") if a == "python" else a for a in image.healthcheck]
    return subprocess.run(argv, cwd=installed.workdir, capture_output=True, text=True, timeout=30,
                          env=installed.env({**image.env, "STREAM_ANON_WEB_PORT": str(port)}))


@pytest.mark.slow
def test_the_images_cmd_runs_on_the_installed_wheel(installed):
    image = _image()
    assert image.env["STREAM_ANON_WEB_PORT"] and image.command[0] == "stream-anon"
    proc = installed._run([str(installed.venv / "bin" / image.command[0]), *image.command[1:]], 120, image.env)
    assert proc.stdout.startswith("usage: stream-anon")


@pytest.mark.slow
def test_installed_package_runs_broker_topics_worker_replay_audit_and_report(installed, broker_of_its_own):
    """What a new user does after ``pip install``, from an empty directory: ``stream-anon broker``, ``topics
    apply``, ``replay`` of a bundled slice, ``worker`` with the bundled oyster config by name, ``audit`` passing
    with its health figures, ``report`` with its plots (the service and report extras installed); the same steps as the container image
    (Dockerfile) and docker-compose.yml."""
    from stream_anon.kafka.supervise import OutputReader     # the test's own reader, to know when to stop the worker

    secret = {"STREAM_ANON_SECRET": "wheel-test-secret-" + "0123456789abcdef" * 2}
    broker = installed.start("broker", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    worker = None
    try:
        line = broker.stdout.readline().strip()
        assert line.startswith("bootstrap=127.0.0.1:"), line
        bootstrap = line.split("=", 1)[1]
        tansu = _children(broker.pid)
        assert len(tansu) == 1

        applied = installed.run("topics", "apply", "--broker", bootstrap, "--config", "oyster").stdout
        assert "raw.fare.oyster: created" in applied and "anon.releases: created" in applied

        counts = json.loads(installed.run("replay", "--dataset", "oyster", "--events", str(EVENTS), "--topic",
                                          "raw.fare.oyster", "--config", "oyster", "--broker", bootstrap,
                                          env=secret).stdout.strip().splitlines()[-1])
        assert counts["events"] == EVENTS and counts["errors"] == 0 and len(counts["partitions"]) == 4

        log_path = installed.workdir / "worker.log"
        # with the image's environment and no --web-port: the worker serves the port the image's HEALTHCHECK asks
        from stream_anon.broker import free_port
        image, port = _image(), free_port()
        with open(log_path, "w") as log:
            worker = installed.start("worker", "--config", "oyster", "--broker", bootstrap, "--state-dir", "state",
                                     "--flush-when-idle", "2", "--loglevel", "info", "--log-format", "json",
                                     env={**image.env, **secret, "STREAM_ANON_WEB_PORT": str(port)}, stdout=log,
                                     stderr=subprocess.STDOUT)
        reader = OutputReader(bootstrap, "oyster")
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                reader.poll(500)
                acc = reader.accounting()
                if acc["accounted"] >= EVENTS and acc["deferred"] == 0:
                    break
                assert worker.poll() is None, log_path.read_text()[-3000:]
            else:
                pytest.fail(f"not accounted within 120 s: {acc}\n{log_path.read_text()[-3000:]}")
        finally:
            reader.close()
        health = _healthcheck(installed, image, port)
        assert health.returncode == 0, health.stderr[-2000:]
        assert _stop(worker) in (0, -signal.SIGTERM)
        assert _healthcheck(installed, image, port).returncode != 0        # it fails without a live worker
        logged = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        assert logged and all({"levelname", "name", "message"} <= set(d) for d in logged)
        assert any("Kafka connection: 127.0.0.1:" in d["message"] for d in logged)
        assert (installed.workdir / "state" / "stream-anon-oyster").is_dir()      # checkpoints under the cwd

        audit = installed.run("audit", "--config", "oyster", "--broker", bootstrap, "--idle", "1.0",
                              "--report", "audit.json", env=secret, timeout=180)
        assert audit.stdout.startswith("AUDIT PASSED"), audit.stdout
        assert "health: NCP of published records mean=" in audit.stdout
        report = json.loads((installed.workdir / "audit.json").read_text())
        s, h = report["summary"], report["health"]
        assert report["passed"] and s["events_in"] == EVENTS and s["lost"] == 0
        assert s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"] == EVENTS
        assert 0 < h["ncp"]["mean"] <= h["ncp"]["p95"] <= 1 and h["ncp"]["records"] == s["published"]
        assert h["class_individuals"]["min"] >= s["k"] and h["alerts"] is not None

        written = installed.run("report", "--config", "oyster", "--broker", bootstrap, "--idle", "1.0", "--out",
                                "report.html", env=secret, timeout=180)
        assert "audit PASSED" in written.stdout, written.stdout
        assert (installed.workdir / "report.html").read_text().count("<svg") >= 4
    finally:
        if worker is not None:
            _stop(worker)
        assert _stop(broker) == 0
        assert "SIGTERM received" in broker.stderr.read()
    assert not any(_alive(pid) for pid in tansu), "orphan tansu process"

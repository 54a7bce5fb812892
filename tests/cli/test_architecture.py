"""The package's import graph, read with ``ast`` (no module is imported to build it): no circles, and no import
that runs back up a floor.

Every ``import`` / ``from ... import`` anywhere in a module counts (module level, inside functions, methods and
``if`` blocks: a function-level import still makes the dependency, and is the usual way to hide a cycle), as do
``importlib.import_module("literal")`` calls. ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module of the package, else to ``pkg``; relative imports are resolved against the importing module's package.

**Floors** (:data:`FLOORS`, from the bottom): every part of the package (a subpackage, or a top-level module) is on
one floor, and may import its own floor's parts and lower floors' parts, never a higher floor's. Checked on every
edge and along every chain of imports (each module's transitive imports stay on its floor or below), with no
circle between modules nor between parts. A part missing from :data:`FLOORS` fails the test: a new part is placed
on purpose. A throw-away copy of the package with one back-up import added shows the check fails on it.

Rules the floors do not say (:data:`LAYERS`):
- the Kafka-free parts (``stream_anon.worker``, ``stream_anon.engine``, ``stream_anon.config``, the strategies,
  formers, DP and criteria) import no Kafka client and no faust: not their own modules at any level, and nothing
  they load at import time through any chain;
- ``stream_anon.audit`` imports nothing from engine, strategies, formers, criteria, config, kafka, guarantees (its
  checks of the criteria are its own code, and so are the settings it compares across configuration changes);
- ``stream_anon.risk`` (re-identification risk from class sizes, issue 29: the worker renders it and the audit
  recomputes it) imports nothing from engine, strategies, formers, criteria, config, kafka, audit, evaluate,
  attacks, report: the audit may import it and stay independent of the engine;
- ``stream_anon.validation`` (used by every part's parameter checks) is at the very bottom: of the package it
  imports only ``stream_anon.errors``, and besides that the standard library alone.
Checked on the direct imports, and at run time (a fresh interpreter imports every module of the part and must not
have loaded a forbidden module through any chain).

Evaluation code stays off production paths (issue 27): no module outside ``stream_anon.attacks`` and
``stream_anon.evaluate`` imports an attack, and no module of the package imports the test and benchmark harness
(the modules of ``tests/`` and ``bench/``).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "stream_anon"
KAFKA_CLIENTS = ("faust", "aiokafka", "kafka", "confluent_kafka")

# part -> forbidden internal prefixes and forbidden third-party top-level packages
LAYERS = {
    "stream_anon.worker": (("stream_anon.kafka",), KAFKA_CLIENTS),
    "stream_anon.engine": (("stream_anon.kafka",), KAFKA_CLIENTS),
    "stream_anon.config": (("stream_anon.engine", "stream_anon.kafka", "stream_anon.audit"), KAFKA_CLIENTS),
    "stream_anon.strategies": (("stream_anon.config", "stream_anon.engine", "stream_anon.kafka",
                                "stream_anon.formers"), KAFKA_CLIENTS),
    "stream_anon.formers": (("stream_anon.config", "stream_anon.engine", "stream_anon.kafka"), KAFKA_CLIENTS),
    "stream_anon.dp": (("stream_anon.config", "stream_anon.engine", "stream_anon.kafka"), KAFKA_CLIENTS),
    "stream_anon.criteria": (("stream_anon.config", "stream_anon.engine", "stream_anon.kafka", "stream_anon.audit",
                              "stream_anon.strategies", "stream_anon.formers"), KAFKA_CLIENTS),
    "stream_anon.risk": (("stream_anon.engine", "stream_anon.strategies", "stream_anon.formers", "stream_anon.criteria",
                          "stream_anon.config", "stream_anon.kafka", "stream_anon.audit", "stream_anon.evaluate",
                          "stream_anon.attacks", "stream_anon.report"), KAFKA_CLIENTS),
    "stream_anon.audit": (("stream_anon.engine", "stream_anon.strategies", "stream_anon.formers", "stream_anon.criteria",
                           "stream_anon.config", "stream_anon.kafka", "stream_anon.guarantees"), ()),
}
ATTACKS = "stream_anon.attacks"
MAY_IMPORT_ATTACKS = (ATTACKS, "stream_anon.evaluate")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str          # a module of the package, or a third-party top-level name
    internal: bool
    line: int
    function_level: bool

    def where(self) -> str:
        return f"{self.source}:{self.line}{' (function-level)' if self.function_level else ''}"


def package_modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _resolve_relative(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _in_function(parents: dict, node: ast.AST) -> bool:
    node = parents.get(node)
    while node is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
        node = parents.get(node)
    return False


def module_edges(module: str, path: Path, is_pkg: bool, modules) -> list[Edge]:
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    edges = []

    def add(target: str, node: ast.AST):
        top = target.split(".")[0]
        internal = top == PACKAGE
        if internal:
            # the longest prefix that is a module of the package (``import stream_anon.x.Name`` never occurs,
            # but ``from stream_anon.x import Name`` resolves here to stream_anon.x)
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if not parts:
                raise AssertionError(f"{module}:{node.lineno}: import of unknown module {target}")
            target = ".".join(parts)
        else:
            target = top
        if target != module:
            edges.append(Edge(module, target, internal, node.lineno, _in_function(parents, node)))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, is_pkg, node.level, node.module) if node.level else node.module
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                add(candidate if candidate in modules else base, node)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            name = node.args[0].value
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                name = _resolve_relative(module, is_pkg, level, name.lstrip(".") or None)
            add(name, node)
    return edges


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> tuple[nx.MultiDiGraph, list[Edge]]:
    modules = package_modules(root, package)
    edges = [e for m, (path, is_pkg) in modules.items() for e in module_edges(m, path, is_pkg, modules)]
    g = nx.MultiDiGraph()
    g.add_nodes_from(modules)
    for e in edges:
        if e.internal:
            g.add_edge(e.source, e.target, edge=e)
    return g, edges


def cycles_of(g) -> list[tuple[str, ...]]:
    """Every elementary cycle, each rotated to start at its smallest module name, sorted."""
    out = []
    for c in nx.simple_cycles(nx.DiGraph(g)):
        i = c.index(min(c))
        out.append(tuple(c[i:] + c[:i]))
    return sorted(out)


def in_layer(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


# The floors, from the bottom: (name, the parts on it). A part is a subpackage or a top-level module of the package,
# named without the package's prefix; "" is the package itself (its __init__: the public face, on the top floor).
FLOORS = (
    ("base", ("errors", "validation", "version", "crypto", "hierarchy", "keyed_table", "checkpoint", "logsetup",
              "numbers", "progress", "schema_decoder", "helptext", "risk", "pipeline", "monitoring", "contract",
              "domains", "events", "connection", "h3cells", "extras", "metric_rows")),
    ("inputs", ("datasets", "inputs")),
    ("audit", ("audit",)),                   # independent of everything above it (LAYERS says more)
    ("criteria", ("criteria",)),             # what must hold of a class
    ("metrics", ("metrics",)),               # information loss and utility of a table
    ("strategies", ("strategies",)),         # how records are grouped
    ("formers and DP", ("formers", "dp")),   # a window's classes (with a strategy, under the criteria); DP aggregates
    ("config", ("config",)),                 # reads each part's parameter declarations
    ("engine", ("engine",)),
    ("guarantees and rendering", ("guarantees", "render")),
    ("worker", ("worker",)),                 # the worker without Kafka
    ("kafka", ("kafka", "broker")),
    ("commands", ("attacks", "evaluate", "calibrate", "suggest", "suggest_search", "cli_kafka", "cli_replay",
                  "preflight", "report", "demo", "cli", "api", "contract_checks")),
    ("package", ("",)),
)


def part_of(module: str, package: str = PACKAGE) -> str:
    """The part a module belongs to: ``stream_anon.engine.space`` -> ``engine``, ``stream_anon`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor_index(floors=FLOORS) -> dict[str, int]:
    out = {}
    for i, (_, parts) in enumerate(floors):
        for part in parts:
            assert part not in out, f"{part!r} is on two floors"
            out[part] = i
    return out


@dataclass
class FloorCheck:
    """What the floors' check found in one import graph."""
    unplaced: list[str]                      # parts on no floor
    upward: list[Edge]                       # edges to a higher floor
    chains: list[list[str]]                  # per module reaching a higher floor: the shortest such chain
    module_circles: list[tuple[str, ...]]    # strongly connected components of more than one module
    part_circles: list[tuple[str, ...]]      # the same between parts

    @property
    def failures(self) -> int:
        return (len(self.unplaced) + len(self.upward) + len(self.chains) + len(self.module_circles)
                + len(self.part_circles))

    def report(self, floors=FLOORS) -> str:
        names = [name for name, _ in floors]
        level = floor_index(floors)
        lines = [f"part on no floor: {p!r}" for p in self.unplaced]
        lines += [f"{e.where()} imports {e.target}: floor {names[level[part_of(e.source)]]!r} -> "
                  f"{names[level[part_of(e.target)]]!r}" for e in self.upward]
        lines += ["chain up a floor: " + " -> ".join(c) for c in self.chains]
        lines += ["circle of modules: " + ", ".join(c) for c in self.module_circles]
        lines += ["circle of parts: " + ", ".join(c) for c in self.part_circles]
        return "\n".join(lines)


def check_floors(g: nx.MultiDiGraph, edges: list[Edge], floors=FLOORS) -> FloorCheck:
    level = floor_index(floors)
    unplaced = sorted({part_of(m) for m in g} - set(level))
    on = {m: level.get(part_of(m), -1) for m in g}
    upward = sorted({(e.source, e.line, e.target): e for e in edges
                     if e.internal and on[e.target] > on[e.source] >= 0}.values(),
                    key=lambda e: (e.source, e.line, e.target))     # one per statement and target
    simple = nx.DiGraph(g)
    chains = []
    for m in sorted(simple):      # transitive: every module a module reaches, through any chain, is on its floor or below
        above = sorted(t for t in nx.descendants(simple, m) if on[t] > on[m] >= 0)
        if above:
            paths = nx.single_source_shortest_path(simple, m)
            chains.append(min((paths[t] for t in above), key=lambda p: (len(p), p)))
    module_circles = sorted(tuple(sorted(c)) for c in nx.strongly_connected_components(simple) if len(c) > 1)
    parts = nx.DiGraph()
    parts.add_nodes_from(part_of(m) for m in simple)
    parts.add_edges_from((part_of(a), part_of(b)) for a, b in simple.edges if part_of(a) != part_of(b))
    part_circles = sorted(tuple(sorted(c)) for c in nx.strongly_connected_components(parts) if len(c) > 1)
    return FloorCheck(unplaced, upward, chains, module_circles, part_circles)


# ------------------------------------------------------------------------------------------------ the checker
def test_graph_builder_resolves_relative_function_level_and_from_imports(tmp_path):
    """The reader itself, on a throw-away package: the architecture tests below can only fail if it sees edges."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import X\n")
    (pkg / "sub" / "a.py").write_text("X = 1\ndef f():\n    from ..b import Y\n    import kafka.admin\n")
    (pkg / "b.py").write_text("from stream_anon.sub import a\nfrom stream_anon import sub\nY = 2\n"
                              "import importlib\nM = importlib.import_module('stream_anon.sub.a')\n")
    g, edges = import_graph(tmp_path)
    got = {(e.source, e.target, e.function_level) for e in edges}
    assert got == {("stream_anon.sub", "stream_anon.sub.a", False),
                   ("stream_anon.sub.a", "stream_anon.b", True),
                   ("stream_anon.sub.a", "kafka", True),
                   ("stream_anon.b", "stream_anon.sub.a", False),
                   ("stream_anon.b", "stream_anon.sub", False),
                   ("stream_anon.b", "importlib", False)}
    assert cycles_of(g) == [("stream_anon.b", "stream_anon.sub", "stream_anon.sub.a"),
                            ("stream_anon.b", "stream_anon.sub.a")]


# ------------------------------------------------------------------------------------------------ the package
def _cycle_report(g: nx.MultiDiGraph, cycle: list[str]) -> str:
    hops = []
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        where = ", ".join(sorted({d["edge"].where() for d in g.get_edge_data(a, b).values()}))
        hops.append(f"{a} -> {b} [{where}]")
    return "cycle: " + "; ".join(hops)


def test_import_graph_has_no_cycles():
    g, _ = import_graph()
    cycles = cycles_of(g)
    report = [_cycle_report(g, list(c)) for c in cycles]
    print("\n".join(report))
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(report)


def test_every_import_stays_on_its_floor_or_goes_down():
    """Every part is on a floor; no edge and no chain of edges runs up a floor; no circle of modules or parts."""
    g, edges = import_graph()
    found = check_floors(g, edges)
    print(found.report())
    assert found.failures == 0, found.report()


def test_floor_check_fails_on_a_back_up_import_direct_or_through_a_chain(tmp_path):
    """The checker on a throw-away package of three floors: clean, then with one function-level import from the
    bottom floor to the middle one (an upward edge, and a chain from a bottom module that only imports its floor)."""
    floors = (("low", ("low", "low2")), ("mid", ("mid",)), ("top", ("top", "")))
    pkg = tmp_path / PACKAGE
    (pkg / "top").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from stream_anon.top import x\n")
    (pkg / "low.py").write_text("def f():\n    return 1\n")
    (pkg / "low2.py").write_text("from stream_anon import low\n")
    (pkg / "mid.py").write_text("from stream_anon import low\n")
    (pkg / "top" / "__init__.py").write_text("")
    (pkg / "top" / "x.py").write_text("from stream_anon import mid, low2\n")
    clean = check_floors(*import_graph(tmp_path), floors=floors)
    assert clean.failures == 0, clean.report()

    (pkg / "low.py").write_text("def f():\n    from stream_anon import mid\n    return mid\n")
    found = check_floors(*import_graph(tmp_path), floors=floors)
    assert [(e.source, e.target, e.function_level) for e in found.upward] == [
        ("stream_anon.low", "stream_anon.mid", True)]
    assert found.chains == [["stream_anon.low", "stream_anon.mid"],
                            ["stream_anon.low2", "stream_anon.low", "stream_anon.mid"]]
    assert found.module_circles == [("stream_anon.low", "stream_anon.mid")]
    assert found.part_circles == [("low", "mid")]
    assert "stream_anon.low:2 (function-level) imports stream_anon.mid: floor 'low' -> 'mid'" in found.report(floors)

    (pkg / "new.py").write_text("")
    assert check_floors(*import_graph(tmp_path), floors=floors).unplaced == ["new"]


def test_floor_check_fails_on_the_package_with_one_back_up_import_added(tmp_path):
    """A copy of the package with one import from the criteria up to the Kafka loop, hidden in a function: the
    check names that edge, the chains it opens and the circle it makes."""
    for path in (ROOT / PACKAGE).rglob("*.py"):
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text())
    assert check_floors(*import_graph(tmp_path)).failures == 0
    base = tmp_path / PACKAGE / "criteria" / "base.py"
    base.write_text(base.read_text() + "\n\ndef _loop():\n    from stream_anon.kafka import loop\n    return loop\n")
    found = check_floors(*import_graph(tmp_path))
    assert [(e.source, e.target) for e in found.upward] == [("stream_anon.criteria.base", "stream_anon.kafka.loop")]
    assert ["stream_anon.criteria.base", "stream_anon.kafka.loop"] in found.chains
    assert ["stream_anon.strategies.grouping", "stream_anon.criteria", "stream_anon.criteria.base",
            "stream_anon.kafka.loop"] in found.chains            # a module that imports only lower floors itself
    assert any({"criteria", "kafka"} <= set(c) for c in found.part_circles)


KAFKA_FREE = ("stream_anon.worker", "stream_anon.engine", "stream_anon.config", "stream_anon.dp",
              "stream_anon.formers", "stream_anon.strategies", "stream_anon.criteria")


def kafka_client_imports(part: str, edges: list[Edge]) -> list[str]:
    """Where ``part`` reaches a Kafka client or faust: its own modules' imports of one at any level, and the
    module-level imports of one by any module that importing ``part`` loads (a chain of module-level imports)."""
    loads = nx.DiGraph((e.source, e.target) for e in edges if e.internal and not e.function_level)
    own = sorted({e.source for e in edges if in_layer(e.source, part)})
    found = [f"{e.where()} imports {e.target}" for e in edges
             if in_layer(e.source, part) and not e.internal and e.target in KAFKA_CLIENTS]
    paths = {}
    for m in own:
        if m in loads:
            for target, path in nx.single_source_shortest_path(loads, m).items():
                paths.setdefault(target, path)
    found += [f"{' -> '.join(paths[e.source])} imports {e.target} (line {e.line})" for e in edges
              if e.source in paths and not e.internal and e.target in KAFKA_CLIENTS and not e.function_level
              and not in_layer(e.source, part)]
    return sorted(set(found))


@pytest.mark.parametrize("part", KAFKA_FREE)
def test_kafka_free_part_reaches_no_kafka_client(part):
    _, edges = import_graph()
    found = kafka_client_imports(part, edges)
    assert not found, f"{part} reaches a Kafka client:\n" + "\n".join(found)


def test_kafka_client_check_sees_an_import_in_a_chain(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "worker").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "worker" / "__init__.py").write_text("")
    (pkg / "worker" / "core.py").write_text("from stream_anon import settings\n")
    (pkg / "settings.py").write_text("def client():\n    import confluent_kafka\n")
    _, edges = import_graph(tmp_path)
    assert kafka_client_imports("stream_anon.worker", edges) == []     # a client made inside a function: not loaded
    (pkg / "settings.py").write_text("import faust\n")
    (pkg / "worker" / "state.py").write_text("def f():\n    import confluent_kafka\n")
    _, edges = import_graph(tmp_path)
    assert kafka_client_imports("stream_anon.worker", edges) == [
        "stream_anon.worker.core -> stream_anon.settings imports faust (line 1)",
        "stream_anon.worker.state:2 (function-level) imports confluent_kafka"]


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_nothing_from_a_higher_layer(layer):
    forbidden_internal, forbidden_external = LAYERS[layer]
    _, edges = import_graph()
    bad = [e for e in edges if in_layer(e.source, layer) and (
        (e.internal and any(in_layer(e.target, f) for f in forbidden_internal))
        or (not e.internal and e.target in forbidden_external))]
    report = [f"{e.where()} imports {e.target}" for e in sorted(bad, key=lambda e: (e.source, e.line))]
    print("\n".join(report))
    assert not bad, f"{layer} imports from a higher layer:\n" + "\n".join(report)


BOTTOM = {"stream_anon.validation": {"stream_anon.errors"}}   # module -> the package modules it may import


@pytest.mark.parametrize("module", sorted(BOTTOM))
def test_bottom_module_imports_only_the_standard_library_and_errors(module):
    _, edges = import_graph()
    own = [e for e in edges if e.source == module]
    bad = [e for e in own if (e.target not in BOTTOM[module] if e.internal
                              else e.target not in sys.stdlib_module_names and e.target != "__future__")]
    assert own and not bad, [f"{e.where()} imports {e.target}" for e in bad]


_RUNTIME_PROBE = r"""
import importlib, json, pkgutil, sys
layer = sys.argv[1]
pkg = importlib.import_module(layer)
names = [layer] + ([m.name for m in pkgutil.walk_packages(pkg.__path__, layer + ".")]
                   if hasattr(pkg, "__path__") else [])
for name in names:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_importing_a_layer_loads_no_higher_layer(layer):
    """Run time, through any chain (parent packages' ``__init__`` included): a fresh interpreter imports every
    module of the layer and must not have loaded a forbidden module."""
    forbidden_internal, forbidden_external = LAYERS[layer]
    out = subprocess.run([sys.executable, "-c", _RUNTIME_PROBE, layer], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert any(in_layer(m, layer) for m in loaded)
    bad = sorted(m for m in loaded if any(in_layer(m, f) for f in forbidden_internal)
                 or m.split(".")[0] in forbidden_external)
    if bad:   # say through which direct import each forbidden module came in
        g, _ = import_graph()
        own = [m for m in g if in_layer(m, layer)]
        chains = []
        for target in (b for b in bad if b in g):
            paths = [nx.shortest_path(g, s, target) for s in own if nx.has_path(g, s, target)]
            if paths:
                chains.append(" -> ".join(min(paths, key=len)))
        print("\n".join(chains))
    assert not bad, f"importing {layer} loads {bad}"


# ------------------------------------------------------------------------------------- evaluation code off production
def test_no_module_outside_the_attacks_and_evaluate_imports_an_attack():
    _, edges = import_graph()
    bad = [e for e in edges if e.internal and in_layer(e.target, ATTACKS)
           and not any(in_layer(e.source, allowed) for allowed in MAY_IMPORT_ATTACKS)]
    report = [f"{e.where()} imports {e.target}" for e in sorted(bad, key=lambda e: (e.source, e.line))]
    assert not bad, "an attack imported outside stream_anon.attacks / stream_anon.evaluate:\n" + "\n".join(report)


def harness_modules(root: Path = ROOT) -> set[str]:
    """Top-level names a module of the package would import the test or benchmark harness by."""
    return {"tests", "bench"} | {p.stem for d in ("tests", "bench") for p in (root / d).rglob("*.py")}


def test_no_module_imports_the_test_or_bench_harness():
    names = harness_modules()
    assert {"_worker_harness", "_kafka_helpers", "fingerprint", "chaos"} <= names     # the reader sees them
    _, edges = import_graph()
    bad = [e for e in edges if not e.internal and e.target in names]
    assert not bad, "\n".join(f"{e.where()} imports the harness module {e.target}" for e in bad)
    assert not [m for m in package_modules() if "harness" in m.split(".")[-1]], "a harness module in the package"


_ATTACK_PROBE = r"""
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("stream_anon."))))
"""


def test_the_worker_cli_and_demo_load_no_attack():
    """Run time: importing the worker, the command line, the demo and the DP report loads no attack module."""
    out = subprocess.run([sys.executable, "-c", _ATTACK_PROBE, "stream_anon.kafka.app", "stream_anon.cli",
                          "stream_anon.demo", "stream_anon.dp.report"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert "stream_anon.worker.core" in loaded
    assert not [m for m in loaded if in_layer(m, ATTACKS)], loaded


# ------------------------------------------------------------------------------------------------ private fields
# ``x._name`` where ``x`` is not ``self`` / ``cls``: each allowed one says why (the same class's other instance,
# or a third-party name whose public spelling has an underscore)
OTHERS_PRIVATE_ALLOWED = {
    ("stream_anon.engine.buffer", "b._set"): "a Buffer building another Buffer",
    ("stream_anon.keyed_table", "other._values"): "BlobTable.__eq__ on another BlobTable",
    ("stream_anon.dp.diffprivlib_adapter", "Geometric(epsilon=epsilon, sensitivity=sensitivity)._scale"): "diffprivlib",
    ("stream_anon.dp.diffprivlib_adapter", "mech._rng"): "diffprivlib",
    ("stream_anon.dp.diffprivlib_adapter", "Laplace._laplace_sampler"): "diffprivlib",
    ("stream_anon.helptext", "parser._actions"): "argparse",
    ("stream_anon.helptext", "argparse._SubParsersAction"): "argparse",
    ("stream_anon.worker.aggregates_process", "q._reader"): "multiprocessing's queue pipe (widened)",
    ("stream_anon.worker.aggregates_process", "q._writer"): "multiprocessing's queue pipe (widened)",
}


def others_private_fields(root: Path = ROOT) -> list[str]:
    """Every ``x._name`` of the package whose ``x`` is not ``self`` or ``cls`` and is not allowed above.
    ``KafkaError._CODE`` is librdkafka's public spelling of its local error codes; protoc's generated modules
    (``*_pb2``) are not read."""
    found = []
    for module, (path, _) in package_modules(root).items():
        if module.endswith("_pb2"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "KafkaError"):
                continue
            text = ast.unparse(node)
            if (module, text) not in OTHERS_PRIVATE_ALLOWED:
                found.append(f"{module}:{node.lineno} {text}")
    return sorted(found)


def test_no_helper_reads_another_class_private_fields():
    found = others_private_fields()
    assert not found, "a helper reads another class's private field (make it public, or move the code):\n" + \
        "\n".join(found)


def test_private_field_check_sees_a_helper_reading_one(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ledger.py").write_text("class L:\n    def __init__(self):\n        self._entries = {}\n\n\n"
                                   "def total(ledger):\n    return sum(ledger._entries.values())\n")
    assert others_private_fields(tmp_path) == ["stream_anon.ledger:7 ledger._entries"]


# ------------------------------------------------------------------------------------------------ sizes
MODULE_MAX_LINES = 600        # a module larger than this holds more than one job (issue 27)
CLASS_MAX_LINES = 300


def test_no_module_over_600_lines_and_no_class_over_300():
    too_long = []
    for module, (path, _) in package_modules().items():
        text = path.read_text()
        if text.count("\n") > MODULE_MAX_LINES:
            too_long.append(f"{module}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_MAX_LINES:
                too_long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "split these by job:\n" + "\n".join(too_long)


def test_the_large_classes_jobs_in_the_developer_guide_name_their_methods():
    """docs/developers.md lists each large class's jobs by its methods (instead of a line cap): every method it
    names exists, and every class over 250 lines is listed."""
    import importlib
    import re
    text = (ROOT / "docs" / "developers.md").read_text()
    start = text.index("### The large classes and their jobs")
    section = text[start:text.index("\n## ", start)]
    listed = re.findall(r"^- \*\*`(\w+)`\*\* \(`([\w/]+)\.py`\): (.*?)(?=^- |\Z)", section, re.S | re.M)
    assert len(listed) >= 4
    for name, path, body in listed:
        cls = getattr(importlib.import_module(f"{PACKAGE}.{path.replace('/', '.')}"), name)
        methods = [m for m in re.findall(r"`(\w+)`", body) if not m[0].isupper()]
        assert methods and not [m for m in methods if not hasattr(cls, m)], (name, methods)
    big = []
    for module, (path, _) in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250:
                big.append(node.name)
    assert not set(big) - {name for name, _, _ in listed}, sorted(set(big) - {name for name, _, _ in listed})



if __name__ == "__main__":      # the measure: python tests/cli/test_architecture.py [a checkout's root, e.g. old tree]
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    found = check_floors(*import_graph(root))
    print(f"circles (strongly connected components of more than one): {len(found.module_circles)} of modules, "
          f"{len(found.part_circles)} of parts {[len(c) for c in found.part_circles]}; upward import statements: "
          f"{len(found.upward)} ({len({(e.source, e.target) for e in found.upward})} module pairs); modules with a "
          f"chain up a floor: {len(found.chains)}; parts on no floor: {found.unplaced}")
    print(found.report())

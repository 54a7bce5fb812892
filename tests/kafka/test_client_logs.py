"""Every confluent-kafka client the package (and its tests) builds hands librdkafka's log lines to the Python logger
``stream_anon.kafka.client`` (a ``"logger"`` in its configuration), where log levels and formats apply. Without
one, librdkafka writes ``%3|...|FAIL|rdkafka#producer-N| ... Connect to ... failed`` straight to stderr from its
own threads, also after the command or test that made the client has moved on: the FAIL lines `make test` printed
(issue 43 item 10)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stream_anon"
CLIENTS = {"Producer", "Consumer", "AdminClient"}


class _Scope:
    """What a client's configuration expression can be traced to in its module: dict literals (with ``**``
    unpacking), a name's last assignment before the call in its enclosing functions (innermost first, else the
    module's), and the dict a function of the module returns (``input_consumer_config``)."""

    def __init__(self, tree: ast.Module):
        self.functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        self.module = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                       if isinstance(t, ast.Name)}

    def keys(self, conf, enclosing: tuple = (), line: int = 0, depth: int = 0) -> set:
        if conf is None or depth > 5:
            return set()
        if isinstance(conf, ast.Dict):
            out = {k.value for k in conf.keys if isinstance(k, ast.Constant)}
            for k, v in zip(conf.keys, conf.values):
                if k is None:                                   # {**other, ...}
                    out |= self.keys(v, enclosing, line, depth + 1)
            return out
        if isinstance(conf, ast.Call) and getattr(conf.func, "id", None) in self.functions:
            returns = [n.value for n in ast.walk(self.functions[conf.func.id]) if isinstance(n, ast.Return)]
            return set.intersection(*(self.keys(r, (), 0, depth + 1) for r in returns)) if returns else set()
        if isinstance(conf, ast.Name):
            for function in reversed(enclosing):
                assigned = [n for n in ast.walk(function) if isinstance(n, ast.Assign) and n.lineno < line
                            and any(isinstance(t, ast.Name) and t.id == conf.id for t in n.targets)]
                if assigned:
                    last = max(assigned, key=lambda n: n.lineno)
                    return self.keys(last.value, enclosing, last.lineno, depth + 1)
            return self.keys(self.module.get(conf.id), (), 0, depth + 1)
        return set()


def _client_calls(node: ast.AST, enclosing: tuple = ()):
    """(call, its enclosing functions, outermost first) of every Producer/Consumer/AdminClient call."""
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in CLIENTS:
            yield node, enclosing
    inner = enclosing + (node,) if isinstance(node, ast.FunctionDef) else enclosing
    for child in ast.iter_child_nodes(node):
        yield from _client_calls(child, inner)


def test_every_confluent_client_of_the_package_and_its_tests_logs_through_python_logging():
    found, silent = 0, []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        scope = _Scope(tree)
        for call, enclosing in _client_calls(tree):
            found += 1
            if "logger" not in scope.keys(call.args[0] if call.args else None, enclosing, call.lineno):
                silent.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert found >= 25, found          # the scan sees the clients (worker loop, lineage, retention, check, tests)
    assert not silent, f"confluent-kafka clients without a logger: {silent}"

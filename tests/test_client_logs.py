"""Every confluent-kafka client the package builds hands librdkafka's log lines to the Python logger
``stream_anon.kafka.client`` (a ``"logger"`` in its configuration), where log levels and formats apply. Without
one, librdkafka writes ``%3|...|FAIL|rdkafka#producer-N| ... Connect to ... failed`` straight to stderr from its
own threads, also after the command or test that made the client has moved on: the FAIL lines `make test` printed
(issue 43 item 10)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "stream_anon"
CLIENTS = {"Producer", "Consumer", "AdminClient"}


def _client_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in CLIENTS:
                yield node


def _keys(conf, functions: dict) -> set:
    """The constant keys of a configuration given as a dict literal, or as a call of a function of the same module
    that returns one (``input_consumer_config``)."""
    if isinstance(conf, ast.Call) and getattr(conf.func, "id", None) in functions:
        returns = [n.value for n in ast.walk(functions[conf.func.id]) if isinstance(n, ast.Return)]
        return set.intersection(*(_keys(r, {}) for r in returns)) if returns else set()
    return {k.value for k in conf.keys if isinstance(k, ast.Constant)} if isinstance(conf, ast.Dict) else set()


def test_every_confluent_client_of_the_package_logs_through_python_logging():
    found, silent = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for call in _client_calls(tree):
            found += 1
            if "logger" not in _keys(call.args[0] if call.args else None, functions):
                silent.append(f"{path.relative_to(PACKAGE.parent)}:{call.lineno}")
    assert found >= 10, found          # the scan sees the clients (worker loop, lineage, retention, check, ...)
    assert not silent, f"confluent-kafka clients without a logger: {silent}"

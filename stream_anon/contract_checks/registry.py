"""What the contract checks run on, found in the package's own registries: the strategies
(:data:`stream_anon.strategies.STRATEGIES`), the criteria (:data:`stream_anon.criteria.parse.KINDS`), the DP
aggregate kinds (:data:`stream_anon.dp.specs.KINDS`) and the formers (every class of ``stream_anon.formers`` that
implements :class:`~stream_anon.formers.base.Former`, each run by the bundled config that selects it). A part
registered there is checked without being listed here; what a check needs to run a part that no bundled config
uses (a sensitive field a strategy or criterion reads) is a sample below, and a part without one fails its check
saying so."""
from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import shutil
import tempfile
from pathlib import Path

import tomlkit

from stream_anon import contract
from stream_anon.config import StreamConfig, load_config, parse_config

# the base config a part no bundled config uses runs in (real Oyster taps: fare_product and product_category are
# its sensitive fields)
BASE = "oyster"
# parameters of the strategies whose defaults cannot run on BASE (they name a sensitive field, or bound a search)
STRATEGY_SAMPLES = {
    "grouping": {"field": "fare_product", "l": 2},
    "severity": {"field": "product_category", "severity": {"payg": 3}, "default_severity": 1},
    "utility-clustering": {"factors": "entropy", "max_block": 300},
    "heuristicmin": {"max_expansions": 50},
}
# one [[anonymization.criteria]] entry per criterion kind, on BASE
CRITERION_SAMPLES = {
    "distinct_l_diversity": {"field": "fare_product", "l": 2},
    "entropy_l_diversity": {"field": "fare_product", "l": 1.5},
    "frequency_l_diversity": {"field": "fare_product", "l": 1.5},
    "severity": {"field": "product_category", "severity": {"payg": 3}, "default_severity": 1},
}
FORMER_METHODS = ("form", "reuse", "complete", "expire", "state_core", "state_tables", "load_state")


def strategies() -> list[str]:
    from stream_anon.strategies import STRATEGIES
    return sorted(STRATEGIES)


def criteria() -> list[str]:
    from stream_anon.criteria.parse import KINDS
    return sorted(KINDS)


def aggregate_kinds() -> list[str]:
    from stream_anon.dp.specs import KINDS
    return list(KINDS)


def formers() -> list[str]:
    """The names of the classes of ``stream_anon.formers`` with every method of the Former protocol."""
    import stream_anon.formers as package
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and not getattr(cls, "_is_protocol", False) \
                    and all(callable(getattr(cls, m, None)) for m in FORMER_METHODS):
                found.add(name)
    return sorted(found)


def registered() -> dict[str, list[str]]:
    """Every part the checks cover, by registry: ``{"strategy": [...], "criterion": [...], "former": [...],
    "aggregate": [...]}``."""
    return {"strategy": strategies(), "criterion": criteria(), "former": formers(), "aggregate": aggregate_kinds()}


@functools.lru_cache(maxsize=None)
def bundled() -> dict[str, StreamConfig]:
    return {name: load_config(contract.config_path(name)) for name in contract.config_names()}


def former_config(former: str) -> StreamConfig:
    """The first bundled config whose former is the class named ``former``."""
    from stream_anon.engine.engine import make_former
    for config in bundled().values():
        if type(make_former(config)).__name__ == former:
            return config
    raise AssertionError(f"former {former}: no bundled config selects it (configs/): add one, so that it is checked")


def strategy_config(name: str) -> StreamConfig:
    """A bundled config using strategy ``name``, else BASE with it (and its sample parameters)."""
    for config in bundled().values():
        if config.anonymization.strategy == name:
            return config
    return bundled()[BASE].replace_anonymization(strategy=name, strategy_params=STRATEGY_SAMPLES.get(name, {}))


def aggregate_sample(kind: str) -> tuple[StreamConfig, dict]:
    """(a bundled config, an ``[[aggregates]]`` entry of kind ``kind`` that runs in it): a bundled entry of that
    kind, else a bundled entry of another kind whose keys this kind accepts (a mean's value and bounds make a
    sum)."""
    entries = [(config, a) for config in bundled().values() for a in config.raw.get("aggregates", [])]
    for config, entry in entries:
        if entry["kind"] == kind:
            return config, dict(entry)
    for config, entry in entries:
        candidate = {**entry, "kind": kind, "name": f"{kind}_check"}
        try:
            with_only(config, [candidate])
        except Exception:    # noqa: BLE001 - this entry's keys do not fit the kind: try the next
            continue
        return config, candidate
    raise AssertionError(f"aggregate kind {kind}: no bundled [[aggregates]] entry fits it; add one to a config")


def with_only(config: StreamConfig, aggregates: list[dict]) -> StreamConfig:
    """``config`` with ``aggregates`` as its only ``[[aggregates]]`` (validated as any config)."""
    raw = {**config.raw, "aggregates": aggregates}
    assert config.source is not None, "a bundled config is read from its file"
    return parse_config(raw, base_dir=config.source.parent, source=config.source)


def without_dp(config: StreamConfig) -> StreamConfig:
    """``config`` without its ``[dp]`` and ``[[aggregates]]`` (a check of something else runs faster)."""
    raw = {k: v for k, v in config.raw.items() if k not in ("dp", "aggregates")}
    assert config.source is not None, "a bundled config is read from its file"
    return parse_config(raw, base_dir=config.source.parent, source=config.source)


class ConfigCopy:
    """A bundled config's directory copied to a temporary one, with a config written there from a raw table: the
    audit reads its config as TOML. Use as a context manager: ``with ConfigCopy(raw) as path: ...``."""

    def __init__(self, raw: dict, name: str = "check"):
        self.raw, self.name = raw, name
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Path:
        self._tmp = tmp = tempfile.TemporaryDirectory(prefix="stream-anon-check-")
        root = Path(tmp.name)
        shutil.copytree(contract.configs_dir(), root, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.toml"))
        path = root / f"{self.name}.toml"
        path.write_text(tomlkit.dumps(self.raw))
        return path

    def __exit__(self, *exc) -> None:
        assert self._tmp is not None            # __enter__ made it
        self._tmp.cleanup()

"""The topic contract and the files the package reads at run time, found with :mod:`importlib.resources`.

Three resource packages ship inside ``stream_anon`` (pyproject.toml maps the repository's top-level directories
onto them, so the checkout keeps its layout):

- ``stream_anon.topics`` (``topics/``): ``topics.toml`` (``[[topic]]`` definitions and the ``[names]`` the code
  uses) and ``schemas/<kind>.schema.json``;
- ``stream_anon.configs`` (``configs/``): the bundled stream configs ``<stream>.toml`` and ``hierarchies/``
  (hierarchy paths inside a config are relative to the config file);
- ``stream_anon.data`` (``data/``): the raw-format slices, ``london_stations.csv``, ``adult_hierarchies/`` and
  ``ATTRIBUTION.md``.

Every accessor returns a path on the file system: an installed wheel and an editable install (``pip install -e``)
both keep these files as files; a zipped install is extracted once to a temporary directory.

>>> topics().records("oyster"), topics().releases
('anon.oyster.records', 'anon.releases')
>>> config_path("oyster").name, (config_path("oyster").parent / "hierarchies" / "oyster_location.json").is_file()
('oyster.toml', True)
>>> schema("fare")["title"]
'fare event'
"""
from __future__ import annotations

import importlib.resources
import json
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from stream_anon.validation import ConfigDir

TOPICS_PACKAGE = "stream_anon.topics"
CONFIGS_PACKAGE = "stream_anon.configs"
DATA_PACKAGE = "stream_anon.data"
TOPICS_FILE = "topics.toml"

# Where pyproject.toml's package-dir puts each resource package in a source checkout; used only when the
# checkout is on sys.path without being installed (``PYTHONPATH=<checkout>``), where that mapping is not in effect.
_CHECKOUT_DIRS = {TOPICS_PACKAGE: "topics", CONFIGS_PACKAGE: "configs", DATA_PACKAGE: "data"}


class ContractError(RuntimeError):
    """The bundled topic contract is inconsistent, or a named resource does not exist."""


@lru_cache(maxsize=None)
def _root(package: str) -> Path:
    """The directory of a resource package on the file system."""
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[1] / _CHECKOUT_DIRS[package]
        if not (checkout / "__init__.py").is_file():
            raise
        return checkout
    if isinstance(root, Path):
        return root
    # not on a file system (zip import): copy the whole package once, so relative paths between files still hold
    target = Path(tempfile.mkdtemp(prefix=f"{package}-"))
    _copy_tree(root, target)
    return target


def _copy_tree(src, dst: Path) -> None:
    for item in src.iterdir():
        if item.is_dir():
            (dst / item.name).mkdir()
            _copy_tree(item, dst / item.name)
        else:
            with importlib.resources.as_file(item) as path:
                shutil.copyfile(path, dst / item.name)


def topics_dir() -> Path:
    """Directory of the topic definitions (``*.toml``) and ``schemas/``."""
    return _root(TOPICS_PACKAGE)


def configs_dir() -> Path:
    """Directory of the bundled stream configs and their ``hierarchies/``."""
    return _root(CONFIGS_PACKAGE)


def data_dir() -> Path:
    """Directory of the bundled data slices."""
    return _root(DATA_PACKAGE)


def schema_path(kind: str) -> Path:
    path = topics_dir() / "schemas" / f"{kind}.schema.json"
    if not path.is_file():
        raise ContractError(f"no schema for event kind {kind!r} ({path})")
    return path


def schema(kind: str) -> dict:
    """The JSON schema of input events of ``kind`` (``fare``, ``vehicle``) or of ``aggregate`` rows."""
    return json.loads(schema_path(kind).read_text())


def config_names() -> list[str]:
    """Names of the bundled stream configs (``oyster``, ``citibike``, ...)."""
    return sorted(p.stem for p in configs_dir().glob("*.toml"))


def config_path(name: str) -> Path:
    """The bundled config of stream ``name``; its hierarchy paths resolve against its directory."""
    path = configs_dir() / f"{name}.toml"
    if not path.is_file():
        raise ContractError(f"no bundled config {name!r} (bundled: {', '.join(config_names())})")
    return path


def config_dir(directory, allow_outside: bool = False) -> ConfigDir:
    """Where the files of a config in ``directory`` may lie (:class:`~stream_anon.validation.ConfigDir`): that
    directory's tree, or for a bundled config the bundled configs' directory, which is one tree (its input configs
    name ``../hierarchies`` and ``../lookups``). A ConfigDir is returned as it is."""
    if isinstance(directory, ConfigDir):
        return directory
    path, bundled = Path(directory or ".").resolve(), configs_dir().resolve()
    return ConfigDir.of(path, allow_outside, bundled if path.is_relative_to(bundled) else path)


def resolve_config(path_or_name: str | Path) -> Path:
    """A config file given on the command line: an existing file, else the bundled config of that stream name.

    Anything else comes back unchanged (loading it reports the missing file)."""
    path = Path(path_or_name)
    if path.is_file() or str(path_or_name) not in config_names():
        return path
    return config_path(str(path_or_name))


def data_path(name: str) -> Path:
    """A bundled data file or directory (``oyster_slice.csv.gz``, ``adult_hierarchies``, ...)."""
    path = data_dir() / name
    if not path.exists():
        raise ContractError(f"no bundled data file {name!r} in {data_dir()}")
    return path


@dataclass(frozen=True)
class Topics:
    """The topic names of the contract (``[names]`` of topics.toml).

    >>> t = Topics("anon.{stream}.records", "anon.releases", "anon.deadletter", "anon.metrics", "anon.aggregates")
    >>> t.records("e2e")
    'anon.e2e.records'
    """
    records_pattern: str     # records topic of a stream, with ``{stream}``
    releases: str
    deadletter: str
    metrics: str
    aggregates: str

    def records(self, stream: str) -> str:
        """Published records of stream ``stream``."""
        return self.records_pattern.format(stream=stream)

    @staticmethod
    def raw(config) -> str:
        """The raw input topic of a stream config (a :class:`stream_anon.config.Config`)."""
        return config.stream.input_topic

    def of_stream(self, config) -> list[str]:
        """Every topic a worker of ``config`` reads or writes (the aggregates topic only with ``[dp]``)."""
        names = [self.raw(config), self.records(config.stream.name), self.releases, self.deadletter, self.metrics]
        if getattr(config, "dp", None) is not None:
            names.append(self.aggregates)
        return names

    @classmethod
    def from_toml(cls, path: str | Path) -> "Topics":
        """The ``[names]`` table of a topic definitions file; each shared name must be a defined topic."""
        with Path(path).open("rb") as fh:
            data = tomllib.load(fh)
        names = data.get("names")
        if not isinstance(names, dict):
            raise ContractError(f"{path}: no [names] table")
        fields = ("records", "releases", "deadletter", "metrics", "aggregates")
        missing = [f for f in fields if not isinstance(names.get(f), str)]
        if missing:
            raise ContractError(f"{path}: [names] lacks {missing}")
        if "{stream}" not in names["records"]:
            raise ContractError(f"{path}: [names] records must contain '{{stream}}', got {names['records']!r}")
        defined = {t.get("name") for t in data.get("topic", [])}
        undefined = [names[f] for f in fields[1:] if names[f] not in defined]
        if undefined:
            raise ContractError(f"{path}: [names] refers to undefined topics {undefined}")
        return cls(names["records"], names["releases"], names["deadletter"], names["metrics"], names["aggregates"])


@lru_cache(maxsize=None)
def topics() -> Topics:
    """The topic names of the bundled ``topics.toml``."""
    return Topics.from_toml(topics_dir() / TOPICS_FILE)

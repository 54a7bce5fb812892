"""One state model for every stateful part of a partition: a small bounded **core** plus **keyed tables**.

A part (the engine's window core, a former, the published-class registry, the DP aggregates, the budget ledger)
implements :class:`Checkpointable`:

* ``state_core()``: a JSON-serializable dict whose size does not grow with the individuals or events seen (counters,
  positions, small lists bounded by configuration). Not a copy: serialize it before the part changes again.
* ``state_tables()``: the part's live :class:`~stream_anon.keyed_table.KeyedTable` objects by name: what grows
  with the individuals or events seen. Each table says what changed since it was last asked
  (:meth:`KeyedTable.changes`), so a state record costs what changed.
* ``load_state(core, tables)``: on a part just built from the configuration, the state of ``state_core()`` and the
  tables in full (name -> ``(keys, rows)``; a missing table is empty).

Parts nest: :class:`Composite` names its children, their cores sit under the child's name and their tables as
``child/table``. The functions below work on any Checkpointable, so the partition's state record, its restore and
the contract suite (``tests/test_checkpoint_contract.py``) are written once.

>>> from stream_anon.keyed_table import KeyedTable
>>> class Counter:
...     def __init__(self):
...         self.n, self.seen = 0, KeyedTable([("time", "f8")])
...     def state_core(self):
...         return {"n": self.n}
...     def state_tables(self):
...         return {"seen": self.seen}
...     def load_state(self, core, tables):
...         self.n = core["n"]
...         load_tables(self.state_tables(), tables)
>>> a = Counter(); a.n = 2; a.seen.put(np.array([7]), np.array([(1.5,)], dtype=a.seen.dtype))
>>> core, tables = full_state(Composite({"counter": a}))
>>> core, sorted(tables)
({'counter': {'n': 2}}, ['counter/seen'])
>>> b = Composite({"counter": Counter()}); b.load_state(core, tables)
>>> b.children["counter"].n, b.children["counter"].seen == a.seen
(2, True)
"""
from __future__ import annotations

from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from stream_anon.keyed_table import KeyedTable

SEPARATOR = "/"          # a nested table's name: <child>/<table>
EMPTY_KEYS = np.empty(0, dtype=np.int64)

Tables = Mapping[str, tuple[np.ndarray, np.ndarray]]     # name -> (int64 keys sorted ascending, records)
Changes = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]   # name -> (keys put, their records, keys deleted)


@runtime_checkable
class Checkpointable(Protocol):
    """A stateful part of a partition (module docstring)."""

    def state_core(self) -> dict: ...

    def state_tables(self) -> Mapping[str, KeyedTable]: ...

    def load_state(self, core: dict, tables: Tables) -> None: ...


def full_state(part: Checkpointable) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(core, every table in full as copies). Does not reset what :func:`changes` reports."""
    return part.state_core(), {name: t.snapshot() for name, t in part.state_tables().items()}


def changes(part: Checkpointable) -> Changes:
    """What changed in the part's tables since the previous call (the first call on a new or restored part: every
    row, no deletion). Applying the change sets in order to the first gives :func:`full_state`'s tables."""
    return {name: t.changes() for name, t in part.state_tables().items()}


def table_rows(part: Checkpointable) -> int:
    """Rows held by the part's tables (what a full state record carries besides the core)."""
    return sum(len(t) for t in part.state_tables().values())


def load_tables(live: Mapping[str, KeyedTable], saved: Tables) -> None:
    """Fill ``live`` tables from ``saved`` ones (name -> (keys, rows)); a table not saved is emptied. A saved table
    the part does not have is an error: state written by another layout must not be half-read."""
    unknown = sorted(set(saved) - set(live))
    if unknown:
        raise ValueError(f"state holds table(s) {unknown} that this part does not have ({sorted(live)})")
    for name, table in live.items():
        keys, rows = saved.get(name, (EMPTY_KEYS, np.empty(0, dtype=table.dtype)))
        table.load(keys, np.asarray(rows, dtype=table.dtype))


class Composite:
    """Named children as one Checkpointable: core ``{child: child core}``, tables ``child/table``."""

    def __init__(self, children: Mapping[str, Checkpointable]):
        for name in children:
            if SEPARATOR in name:
                raise ValueError(f"a part's name may not contain {SEPARATOR!r}: {name!r}")
        self.children = dict(children)

    def state_core(self) -> dict:
        return {name: child.state_core() for name, child in self.children.items()}

    def state_tables(self) -> dict[str, KeyedTable]:
        return {f"{name}{SEPARATOR}{t}": table for name, child in self.children.items()
                for t, table in child.state_tables().items()}

    def load_state(self, core: dict, tables: Tables) -> None:
        unknown = sorted(n for n in tables if n.partition(SEPARATOR)[0] not in self.children)
        if unknown:
            raise ValueError(f"state holds table(s) {unknown} of no part of {sorted(self.children)}")
        for name, child in self.children.items():
            prefix = name + SEPARATOR
            child.load_state(core[name], {n[len(prefix):]: t for n, t in tables.items() if n.startswith(prefix)})

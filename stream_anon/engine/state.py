"""The engine state as one JSON document (core + keyed tables); the tables themselves are
:class:`stream_anon.keyed_table.KeyedTable` (shared with the DP aggregates' state)."""
from __future__ import annotations

import numpy as np

from stream_anon.keyed_table import KeyedTable  # noqa: F401  (the engine's tables; imported from here too)

# -- core + tables in one JSON document (Engine.state_dict / from_state, state records) ----------------
TABLE_PATHS = {"signatures": ("former", "units")}     # where a table sits in the document; default: (name,)


def table_dtype(descr) -> np.dtype:
    """The dtype of a table from its description in ``core["tables"]`` (``dtype.descr``, JSON round-tripped)."""
    return np.dtype([tuple(f) for f in descr])


def compose_state(core: dict, tables: dict) -> dict:
    """One JSON document: the core with each table at its path as columns ``{"ids": [...], field: [...]}``."""
    doc = dict(core)
    for name, (keys, rows) in tables.items():
        path = TABLE_PATHS.get(name, (name,))
        holder = doc
        for part in path[:-1]:
            holder[part] = dict(holder[part])
            holder = holder[part]
        holder[path[-1]] = {"ids": np.asarray(keys).tolist(),
                            **{f: rows[f].tolist() for f in rows.dtype.names}}
    return doc


def split_state(doc: dict) -> tuple[dict, dict]:
    """Inverse of :func:`compose_state`: (core, tables) using the layouts in ``doc["tables"]``."""
    core = dict(doc)
    tables = {}
    for name, descr in doc.get("tables", {}).items():
        path = TABLE_PATHS.get(name, (name,))
        holder = core
        for part in path[:-1]:
            holder[part] = dict(holder[part])
            holder = holder[part]
        cols = holder.pop(path[-1], None)
        if cols is None:
            continue
        dtype = table_dtype(descr)
        rows = np.zeros(len(cols["ids"]), dtype=dtype)
        for f in dtype.names:
            rows[f] = cols[f]
        tables[name] = (np.array(cols["ids"], dtype=np.int64), rows)
    return core, tables

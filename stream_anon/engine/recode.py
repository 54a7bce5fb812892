"""Buffered records carried over an accepted change of a hierarchy or of a sensitive domain
(``stream-anon worker --accept-config-change``): recoded, so that no record waiting in the buffer is dropped or
stalls because the configuration it was read under changed.

A hierarchy quasi-identifier (``categorical``, ``station``) is coded as its leaf's position among the hierarchy's
leaves (:meth:`stream_anon.engine.space.QISpace.encode`). A regrouped hierarchy orders its leaves otherwise, so
the codes of the records buffered under the old one would name other leaves. The state therefore keeps, beside the
engine's tables, each hierarchy quasi-identifier's leaves in code order (:class:`QILeaves`: written once, then only
when they change); after an accepted change :func:`recode_buffer` maps every buffered code to its leaf's code in
the new hierarchy (the old leaf's text, looked up in the new leaves). A leaf the new hierarchy no longer has is
coded as missing (published as ``*``, as an event without the field is): the record is still published, more
coarsely, never dropped. A record's sensitive values are re-checked against a changed domain
(:meth:`stream_anon.domains.SensitiveDomain.check`): a value it refuses is published as null (always allowed),
one it maps (a category outside its values, to ``other``) as mapped.
"""
from __future__ import annotations

import numpy as np
import orjson

from stream_anon import checkpoint
from stream_anon.keyed_table import BlobTable


class QILeaves:
    """Each hierarchy quasi-identifier's leaves in code order, by the code's dimension (a Checkpointable: one table,
    ``leaves``, dimension -> JSON list). :attr:`saved` holds the leaves the loaded state was coded with."""

    def __init__(self, space):
        self.current: dict[int, list[str]] = {}
        d = 0
        for qi in space.qis:
            if qi.kind in ("categorical", "station"):
                self.current[d] = [str(leaf) for leaf in qi.hierarchy.leaves]
            d += qi.dims
        self.table = BlobTable()
        self.saved: dict[int, list[str]] = {}
        self._write()

    def _write(self) -> None:
        keys = sorted(self.current)
        self.table.put(np.asarray(keys, dtype=np.int64), [orjson.dumps(self.current[d]) for d in keys])

    def state_core(self) -> dict:
        return {}

    def state_tables(self) -> dict:
        return {"leaves": self.table}

    def load_state(self, core: dict, tables: checkpoint.Tables) -> None:
        keys, blobs = tables.get("leaves", (np.empty(0, dtype=np.int64), []))
        self.saved = {int(k): orjson.loads(b) for k, b in zip(np.asarray(keys).tolist(), blobs)}
        self.table.load(np.asarray(keys, dtype=np.int64), list(blobs))
        if self.saved != self.current:
            self._write()


def recode_buffer(engine, saved: dict[int, list[str]], missing: dict[int, float], dims: list[int]) -> int:
    """Recode the buffered records' dimensions ``dims`` from the leaves ``saved`` (the codes' old leaves) to the
    engine's hierarchies; ``missing``: the old missing code of each dimension. Returns the records whose leaf the new
    hierarchy lacks (coded as missing). Raises ``KeyError`` for a dimension ``saved`` does not hold."""
    buf, space = engine.buffer, engine.space
    if not len(buf):
        return 0
    X = buf.X.copy()
    lost = 0
    d = 0
    for qi in space.qis:
        if d in dims:
            old = saved[d]
            lookup = qi.hierarchy.leaf_code if hasattr(qi.hierarchy, "leaf_code") else {
                v: i for i, v in enumerate(qi.hierarchy.leaves)}
            table = np.array([lookup.get(leaf, -1) for leaf in old] + [-1], dtype=float)
            col = X[:, d]
            was_missing = col == missing[d]
            codes = np.where(was_missing, len(old), np.clip(col, 0, len(old)).astype(np.int64))
            new = table[codes]
            gone = (new < 0) & ~was_missing
            lost += int(gone.sum())
            X[:, d] = np.where(new < 0, space.missing_code[d], new)
        d += qi.dims
    buf.X = X
    buf.changed_all()
    return lost


def recheck_sensitive(engine, fields: list[str]) -> int:
    """Re-check the buffered records' values of the sensitive ``fields`` against the engine's (changed) domains;
    returns the values published as null since."""
    buf = engine.buffer
    domains = {d.field: d for d in engine.reader.domains}
    order = [d.field for d in engine.reader.domains]           # the order of a record's sensitive values
    nulled = 0
    rows = [list(s) for s in buf.sensitive]
    for field in fields:
        if field not in order or field not in domains:
            continue
        i = order.index(field)
        for row in rows:
            shown, why = domains[field].check(row[i])
            if why is not None:
                shown = None
                nulled += 1
            row[i] = shown
    buf.sensitive = [tuple(r) for r in rows]
    buf.changed_all()
    return nulled


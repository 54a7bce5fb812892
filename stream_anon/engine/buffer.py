"""The window core's buffered data and its state tables: records waiting for a class (:class:`Buffer`) and the
carried fields of the windows not released yet (:class:`OpenWindows`).

Both are kept in memory as columns (what forming a class reads) and, for the state records, as a
:class:`~stream_anon.keyed_table.BlobTable` of **chunks**: one chunk per run of records appended together (a
batch's records of one window), keyed by a serial number. A chunk is written once when it is appended and again
only when some of its rows leave the buffer while others stay (deferred records), and deleted when its last row
leaves: a state record carries what changed, not the open windows' whole content.

The tables are brought up to date when they are asked for (:meth:`Buffer.state_tables`): until then (a batch run,
a benchmark) nothing is encoded.

Order: the buffer is always in its canonical order (event time, then audit token when ``by_token``, then arrival),
so a restored buffer is the saved rows sorted by that key (``rid``: the arrival serial of each row).
"""
from __future__ import annotations

import numpy as np
import orjson

from stream_anon import checkpoint
from stream_anon.engine.carried import CarriedWindow
from stream_anon.engine.records import Records
from stream_anon.events import UNIT_IDS
from stream_anon.keyed_table import BlobTable

_JSON = orjson.OPT_SERIALIZE_NUMPY


class Buffer:
    """Buffered records, column by column, in canonical order (module docstring). ``late``: arrived for a window
    already released; ``rid``: arrival serial; ``chunk``: the serial of the chunk a row was appended with."""

    def __init__(self, dims: int, by_token: bool):
        self.dims, self.by_token = dims, by_token
        self.X = np.empty((0, dims))
        self.units = np.empty(0, dtype=np.int64)
        self.times = np.empty(0)
        self.tokens: list[str] = []
        self.sensitive: list = []
        self.late = np.empty(0, dtype=bool)
        self.rid = np.empty(0, dtype=np.int64)
        self.chunk = np.empty(0, dtype=np.int64)
        self.table = BlobTable()
        self._synced = False           # the table holds the live content (then ``_dirty`` lists what changed)
        self._dirty: set[int] = set()

    def __len__(self) -> int:
        return len(self.tokens)

    def _columns(self) -> tuple:
        return self.X, self.units, self.times, self.late, self.rid, self.chunk

    def _rows_of_columns(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                          np.ndarray]:
        """:meth:`_columns` at ``rows``, in the order :meth:`_set` takes them."""
        return (self.X[rows], self.units[rows], self.times[rows], self.late[rows], self.rid[rows],
                self.chunk[rows])

    def _set(self, X, units, times, late, rid, chunk, tokens, sensitive) -> None:
        self.X, self.units, self.times, self.late, self.rid, self.chunk = X, units, times, late, rid, chunk
        self.tokens, self.sensitive = tokens, sensitive

    # -- changes ------------------------------------------------------------------------------------------------
    def append(self, rec: Records, late: np.ndarray, first_rid: int, chunk: int) -> None:
        """Add records (arrival serials from ``first_rid``) as chunk ``chunk`` and restore the canonical order."""
        n_old = len(self)
        n = len(rec)
        self.X = np.concatenate([self.X, rec.X])
        self.units = np.concatenate([self.units, rec.units])
        self.times = np.concatenate([self.times, rec.times])
        self.late = np.concatenate([self.late, late])
        self.rid = np.concatenate([self.rid, np.arange(first_rid, first_rid + n, dtype=np.int64)])
        self.chunk = np.concatenate([self.chunk, np.full(n, chunk, dtype=np.int64)])
        self.tokens += rec.tokens
        self.sensitive += rec.sensitive
        if self._synced:
            self._dirty.add(chunk)
        step = np.diff(self.times[max(n_old - 1, 0):])
        # already canonical when the new rows continue the time order (strictly, when ties are ordered by token)
        if not ((step > 0).all() if self.by_token else (step >= 0).all()):
            self.keep(self.canonical_order())

    def canonical_order(self) -> np.ndarray:
        """Rows in canonical order: event time, then audit token (``by_token``), then arrival."""
        if self.by_token and len(self):
            return np.lexsort((self.rid, np.array(self.tokens), self.times))
        return np.lexsort((self.rid, self.times))

    def take(self, rows) -> "Buffer":
        """The rows ``rows`` (in that order) as a new buffer without state tables (a view for forming)."""
        rows = np.asarray(rows, dtype=np.int64)
        b = Buffer(self.dims, self.by_token)
        il = rows.tolist()
        b._set(*self._rows_of_columns(rows), [self.tokens[i] for i in il], [self.sensitive[i] for i in il])
        return b

    def changed_all(self) -> None:
        """Every row changed in place (a recoding): every chunk of the state table is written again."""
        if self._synced:
            self._dirty.update(np.unique(self.chunk).tolist())

    def keep(self, rows) -> None:
        """Keep only the rows ``rows``, in that order (the others left the buffer)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._synced and len(rows) < len(self):
            gone = np.ones(len(self), dtype=bool)
            gone[rows] = False
            self._dirty.update(np.unique(self.chunk[gone]).tolist())
        il = rows.tolist()
        self._set(*self._rows_of_columns(rows), [self.tokens[i] for i in il], [self.sensitive[i] for i in il])

    # -- state --------------------------------------------------------------------------------------------------
    def _chunk_blob(self, rows: np.ndarray) -> bytes:
        il = rows.tolist()
        return orjson.dumps({"rid": self.rid[rows], "X": self.X[rows], "units": self.units[rows],
                             "times": self.times[rows], "late": self.late[rows],
                             "tokens": [self.tokens[i] for i in il], "sensitive": [self.sensitive[i] for i in il]},
                            option=_JSON)

    def _rows_by_chunk(self, chunks) -> dict[int, np.ndarray]:
        if not len(self):
            return {}
        order = np.argsort(self.chunk, kind="stable")
        ids, starts = np.unique(self.chunk[order], return_index=True)
        bounds = list(starts[1:]) + [len(order)]
        wanted = None if chunks is None else set(chunks)
        return {c: order[s:e] for c, s, e in zip(ids.tolist(), starts.tolist(), bounds)
                if wanted is None or c in wanted}

    def state_tables(self) -> dict[str, BlobTable]:
        """``buffer``: chunk serial -> the chunk's rows still buffered (JSON), brought up to date."""
        if not self._synced:
            by_chunk = self._rows_by_chunk(None)
            self.table.load(list(by_chunk), [self._chunk_blob(np.sort(r)) for r in by_chunk.values()])
            self._synced, self._dirty = True, set()
        elif self._dirty:
            by_chunk = self._rows_by_chunk(self._dirty)
            gone = [c for c in self._dirty if c not in by_chunk]
            if by_chunk:
                self.table.put(list(by_chunk), [self._chunk_blob(np.sort(r)) for r in by_chunk.values()])
            self.table.delete(gone)
            self._dirty = set()
        return {"buffer": self.table}

    def load_state(self, tables: checkpoint.Tables) -> None:
        keys, blobs = tables.get("buffer", (np.empty(0, dtype=np.int64), []))
        parts = [orjson.loads(b) for b in blobs]
        n = [len(p["rid"]) for p in parts]
        if parts and sum(n):
            X = np.array([x for p in parts for x in p["X"]], dtype=float).reshape(-1, self.dims)
            self._set(X, np.array([u for p in parts for u in p["units"]], dtype=np.int64),
                      np.array([t for p in parts for t in p["times"]], dtype=float),
                      np.array([v for p in parts for v in p["late"]], dtype=bool),
                      np.array([r for p in parts for r in p["rid"]], dtype=np.int64),
                      np.repeat(np.asarray(keys, dtype=np.int64), n),
                      [t for p in parts for t in p["tokens"]], [tuple(s) for p in parts for s in p["sensitive"]])
            self.keep(self.canonical_order())
        self.table.load(keys, blobs)
        self._synced, self._dirty = True, set()


class OpenWindows:
    """The windows holding records not released yet: per window index, the event times, audit tokens and carried
    fields of its on-time records in arrival order, with one state chunk per append (module docstring)."""

    def __init__(self, carried: tuple[str, ...]):
        self.carried = tuple(carried)
        self.windows: dict[int, dict] = {}       # index -> {"times", "tokens", "carried", "chunks": [(serial, n)]}
        self.table = BlobTable()
        self._synced = False

    def __contains__(self, w: int) -> bool:
        return w in self.windows

    def __len__(self) -> int:
        return len(self.windows)

    def keys(self) -> list[int]:
        return sorted(self.windows)

    def append(self, w: int, chunk: int, times: list, tokens: list, carried: dict) -> None:
        p = self.windows.get(w)
        if p is None:
            p = self.windows[w] = {"times": [], "tokens": [], "carried": CarriedWindow(self.carried), "chunks": []}
        p["times"] += times
        p["tokens"] += tokens
        p["carried"].append(carried)
        p["chunks"].append((chunk, len(times)))
        if self._synced:
            self.table.put([chunk], [self._chunk_blob(w, p, len(p["chunks"]) - 1)])

    def add(self, rec: Records, late: np.ndarray, wins: list[int], chunk: int) -> int:
        """File the carried fields of the on-time records of ``rec`` by window (``wins``: each record's window), one
        chunk per window from serial ``chunk``; returns the next free serial."""
        if not len(wins):
            return chunk
        # column by column, one window at a time (a run of records is nearly always of one window)
        wins_a = np.asarray(wins, dtype=np.int64)
        on_time = ~np.asarray(late, dtype=bool)
        if on_time.all() and wins_a[0] == wins_a[-1] and (wins_a == wins_a[0]).all():
            groups = [(wins[0], None)]                       # None: every record, no copy by index
        else:
            groups = [(int(w), np.flatnonzero(on_time & (wins_a == w)).tolist())
                      for w in np.unique(wins_a[on_time])]
        times = rec.times.tolist()
        for w, idx in groups:
            if idx is None:
                self.append(w, chunk, times, rec.tokens, rec.carried)
            else:
                self.append(w, chunk, [times[i] for i in idx], [rec.tokens[i] for i in idx],
                            {f: col[idx] if type(col) is np.ndarray else [col[i] for i in idx]
                             for f, col in rec.carried.items()})
            chunk += 1
        return chunk

    def rewindow(self, window_s: float, chunk: int) -> int:
        """File the open windows' records again by the window of their event time under ``window_s`` (a changed
        window length), each record's carried fields with it, in arrival order, as new chunks from serial
        ``chunk``; returns the next free serial. The state table is rewritten in full."""
        old, self.windows = self.windows, {}
        synced, self._synced = self._synced, False
        for _, p in sorted(old.items()):
            columns = p["carried"].columns()
            new_w = np.floor(np.asarray(p["times"], dtype=float) / window_s).astype(np.int64)
            for nw in np.unique(new_w).tolist():
                idx = np.flatnonzero(new_w == nw)
                il = idx.tolist()
                self.append(int(nw), chunk, [p["times"][i] for i in il], [p["tokens"][i] for i in il],
                            {f: col[idx] if type(col) is np.ndarray else [col[i] for i in il]
                             for f, col in columns.items()})
                chunk += 1
        if synced:
            self.state_tables()
        return chunk

    def pop(self, w: int) -> dict | None:
        p = self.windows.pop(w, None)
        if p is not None and self._synced:
            self.table.delete([c for c, _ in p["chunks"]])
        return p

    def _chunk_blob(self, w: int, p: dict, k: int) -> bytes:
        start = sum(n for _, n in p["chunks"][:k])
        n = p["chunks"][k][1]
        fields = {f: _chunk_json(chunks[k]) for f, chunks in p["carried"].chunks.items()}
        return orjson.dumps({"w": w, "times": p["times"][start:start + n], "tokens": p["tokens"][start:start + n],
                             "carried": fields}, option=_JSON)

    def state_tables(self) -> dict[str, BlobTable]:
        """``windows``: chunk serial -> one append's times, tokens and carried fields (JSON)."""
        if not self._synced:
            keys, blobs = [], []
            for w, p in sorted(self.windows.items()):
                for k, (chunk, _) in enumerate(p["chunks"]):
                    keys.append(chunk)
                    blobs.append(self._chunk_blob(w, p, k))
            self.table.load(keys, blobs)
            self._synced = True
        return {"windows": self.table}

    def load_state(self, tables: checkpoint.Tables) -> None:
        keys, blobs = tables.get("windows", (np.empty(0, dtype=np.int64), []))
        self.windows = {}
        for chunk, blob in zip(np.asarray(keys).tolist(), blobs):
            doc = orjson.loads(blob)
            n = len(doc["times"])
            saved = doc["carried"]
            # a field not saved (a consumer added since the state was written) reads as None, as a missing field
            cols = {f: (np.asarray(saved[f], dtype=np.int64) if f == UNIT_IDS else saved[f]) if f in saved
                    else [None] * n for f in self.carried}
            self.append(int(doc["w"]), int(chunk), doc["times"], doc["tokens"], cols)
        self.table.load(keys, blobs)
        self._synced = True


def _chunk_json(chunk):
    """A CarriedWindow chunk as a JSON-able value: JSON text as it is (a fragment), a list or an array."""
    if type(chunk) is bytes:
        return orjson.Fragment(b"[" + chunk + b"]")
    return chunk


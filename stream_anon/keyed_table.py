"""Keyed state tables: int64 keys -> fixed-width numpy records, with incremental changes (the engine's and the DP
aggregates' state that grows with the individuals seen).

The engine's state has two parts (docs/contracts.md, "Engine state"):

* a bounded **core** (buffer of the open windows, published classes, counters, signature list, value dictionary,
  former statistics...) returned in full by :meth:`Engine.state_core`, and
* **keyed tables** that grow with the individuals or events seen (m-invariance signatures, event ids seen), kept
  here as :class:`KeyedTable`: compact (8 bytes of key plus the record's width per entry, no Python object per
  entry) and able to say what changed since the last time it was asked (:meth:`KeyedTable.changes`), so that a
  checkpoint costs what changed, not what was ever seen.

Storage: a main pair of sorted arrays (keys, records) plus a small sorted *pending* segment for new keys, merged
into the main arrays when it outgrows ``max(4096, len/16)`` keys (each key is copied a bounded number of times,
amortized). Lookups are vectorized binary searches in both segments. Deletions compact the arrays at once (they
come in bulk, at window closes). Records are held as opaque fixed-width bytes (a ``np.void`` view of the dtype) and
seen through the dtype only at the interface: numpy copies, inserts and gathers structured records field by field,
10-15x slower than the same bytes as one void item (measured on inserts into the DP unit window table).

>>> t = KeyedTable([("time", "f8")])
>>> t.put(np.array([5, 3]), np.array([(50.0,), (30.0,)], dtype=t.dtype))
>>> found, rows = t.get(np.array([3, 4, 5]))
>>> found.tolist(), rows["time"][found].tolist()
([True, False, True], [30.0, 50.0])
>>> keys, rows, deleted = t.changes()       # first call: every row (the base is an empty table)
>>> keys.tolist(), deleted.tolist()
([3, 5], [])
>>> _ = t.delete(np.array([3])); t.put(np.array([7]), np.array([(70.0,)], dtype=t.dtype))
>>> keys, rows, deleted = t.changes()
>>> keys.tolist(), rows["time"].tolist(), deleted.tolist()
([7], [70.0], [3])
"""
from __future__ import annotations

import numpy as np

MERGE_MIN = 4096


def _increasing(keys: np.ndarray) -> bool:
    """Strictly increasing (sorted, no key twice): callers that pass sorted keys skip a sort."""
    return bool((keys[1:] > keys[:-1]).all())


class KeyedTable:
    """int64 key -> one record of ``dtype`` (a numpy structured dtype, fixed width).

    Change tracking: :meth:`changes` returns the keys put (with their current records) and the keys deleted since
    its previous call. Its first call (on a new table or one just loaded) returns every row as put and no
    deletion: the base of the first change set is an empty table. Until that first call nothing is tracked, so a
    table whose changes nobody reads (a benchmark, a batch run) keeps no change log.
    """

    def __init__(self, fields) -> None:
        self.dtype = np.dtype(fields)
        self._bytes = np.dtype((np.void, self.dtype.itemsize))    # how records are held (module docstring)
        self._keys = np.empty(0, dtype=np.int64)
        self._rows = np.empty(0, dtype=self._bytes)
        self._pkeys = np.empty(0, dtype=np.int64)     # pending segment (sorted, disjoint from the main keys)
        self._prows = np.empty(0, dtype=self._bytes)
        self._tracking = False
        self._dirty: list[np.ndarray] = []
        self._dirty_n = 0

    # -- size ---------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._keys) + len(self._pkeys)

    @property
    def nbytes(self) -> int:
        """Bytes held by keys and records (not counting the change log)."""
        return int(self._keys.nbytes + self._rows.nbytes + self._pkeys.nbytes + self._prows.nbytes)

    def __eq__(self, other) -> bool:
        """Same dtype and content (change tracking is not compared)."""
        if not isinstance(other, KeyedTable) or other.dtype != self.dtype:
            return NotImplemented
        k1, r1 = self.snapshot()
        k2, r2 = other.snapshot()
        return bool(np.array_equal(k1, k2) and np.array_equal(r1, r2))

    __hash__ = None  # type: ignore[assignment]  # unhashable (mutable); typeshed types it as a method

    def _as_bytes(self, rows) -> np.ndarray:
        """Records given at the interface (anything ``np.asarray`` makes records of ``dtype``) as held."""
        return np.asarray(rows, dtype=self.dtype).view(self._bytes)

    # -- lookups ------------------------------------------------------------------------------------------------
    @staticmethod
    def _find(sorted_keys: np.ndarray, keys: np.ndarray, increasing: bool | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, positions) of ``keys`` in ``sorted_keys``. ``increasing``: whether ``keys`` are sorted
        (tested when not given)."""
        if len(sorted_keys) == 0:
            return np.zeros(len(keys), dtype=bool), np.zeros(len(keys), dtype=np.int64)
        if len(keys) > 32 and not (_increasing(keys) if increasing is None else increasing):
            # hashed keys come in random order: searched in key order, each search starts where the last ended
            # (numpy's binary search keeps its lower bound for increasing keys), about 2x faster on a large table
            order = np.argsort(keys)
            pos = np.empty(len(keys), dtype=np.intp)
            pos[order] = np.searchsorted(sorted_keys, keys[order])
        else:
            pos = np.searchsorted(sorted_keys, keys)
        pos = np.minimum(pos, len(sorted_keys) - 1)
        return sorted_keys[pos] == keys, pos

    def get(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, records) for ``keys``; records of missing keys are zero."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = np.zeros(len(keys), dtype=self._bytes)
        found, pos = self._find(self._keys, keys)
        rows[found] = self._rows[pos[found]]
        if len(self._pkeys):
            pf, ppos = self._find(self._pkeys, keys)
            rows[pf] = self._prows[ppos[pf]]
            found = found | pf
        return found, rows.view(self.dtype)

    def contains(self, keys) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        found, _ = self._find(self._keys, keys)
        if len(self._pkeys):
            found = found | self._find(self._pkeys, keys)[0]
        return found

    # -- updates ------------------------------------------------------------------------------------------------
    def _touch(self, keys: np.ndarray) -> None:
        if self._tracking and len(keys):
            self._dirty.append(np.array(keys, dtype=np.int64))
            self._dirty_n += len(keys)
            if self._dirty_n > 2 * len(self) + 4 * MERGE_MIN:      # keep the log no larger than the table
                merged = np.unique(np.concatenate(self._dirty))
                self._dirty, self._dirty_n = [merged], len(merged)

    def put(self, keys, rows) -> None:
        """Insert or overwrite; for a key given twice the last record wins."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = self._as_bytes(rows)
        if len(keys) == 0:
            return
        if len(keys) > 1 and not _increasing(keys):
            # last occurrence of each key, in key order (from here on the keys are sorted)
            rk = keys[::-1]
            uk, idx = np.unique(rk, return_index=True)
            keys, rows = uk, rows[::-1][idx]
        self._touch(keys)
        found, pos = self._find(self._keys, keys, increasing=True)
        self._rows[pos[found]] = rows[found]
        new = ~found
        if len(self._pkeys) and new.any():
            pf, ppos = self._find(self._pkeys, keys, increasing=True)
            pf &= new
            self._prows[ppos[pf]] = rows[pf]
            new &= ~pf
        if new.any():
            nk, nr = keys[new], rows[new]
            if len(self._pkeys):
                at = np.searchsorted(self._pkeys, nk)
                self._pkeys = np.insert(self._pkeys, at, nk)
                self._prows = np.insert(self._prows, at, nr)
            else:
                self._pkeys, self._prows = nk.copy(), nr.copy()
            if len(self._pkeys) > max(MERGE_MIN, len(self._keys) // 16):
                self._merge()

    def _merge(self) -> None:
        if len(self._pkeys) == 0:
            return
        at = np.searchsorted(self._keys, self._pkeys)
        self._keys = np.insert(self._keys, at, self._pkeys)
        self._rows = np.insert(self._rows, at, self._prows)
        self._pkeys = np.empty(0, dtype=np.int64)
        self._prows = np.empty(0, dtype=self._bytes)

    def delete(self, keys) -> int:
        """Remove ``keys`` (missing ones are ignored); returns how many were removed."""
        keys = np.asarray(keys, dtype=np.int64)
        if len(keys) == 0 or len(self) == 0:
            return 0
        removed = []
        drop = np.isin(self._keys, keys)
        if drop.any():
            removed.append(self._keys[drop])
            self._keys, self._rows = self._keys[~drop], self._rows[~drop]
        if len(self._pkeys):
            drop = np.isin(self._pkeys, keys)
            if drop.any():
                removed.append(self._pkeys[drop])
                self._pkeys, self._prows = self._pkeys[~drop], self._prows[~drop]
        if not removed:
            return 0
        gone = np.concatenate(removed)
        self._touch(gone)
        return len(gone)

    def clear(self) -> int:
        """Remove every row (each is reported as deleted by :meth:`changes`); returns how many were removed."""
        keys, _ = self.snapshot()
        self._keys, self._rows = np.empty(0, dtype=np.int64), np.empty(0, dtype=self._bytes)
        self._touch(keys)
        return len(keys)

    def delete_where(self, field: str, below: float) -> tuple[np.ndarray, np.ndarray]:
        """Remove every row whose ``field`` is below ``below``; returns the removed (keys, records)."""
        parts_k, parts_r = [], []
        drop = self._rows.view(self.dtype)[field] < below
        if drop.any():
            parts_k.append(self._keys[drop])
            parts_r.append(self._rows[drop])
            self._keys, self._rows = self._keys[~drop], self._rows[~drop]
        if len(self._pkeys):
            drop = self._prows.view(self.dtype)[field] < below
            if drop.any():
                parts_k.append(self._pkeys[drop])
                parts_r.append(self._prows[drop])
                self._pkeys, self._prows = self._pkeys[~drop], self._prows[~drop]
        if not parts_k:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=self.dtype)
        keys, rows = np.concatenate(parts_k), np.concatenate(parts_r).view(self.dtype)
        self._touch(keys)
        return keys, rows

    # -- whole table ----------------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys sorted ascending, records): copies of the whole table. Does not touch the change tracking."""
        self._merge()
        return self._keys.copy(), self._rows.view(self.dtype).copy()

    def load(self, keys, rows) -> None:
        """Replace the content (change tracking restarts: the next :meth:`changes` returns every row)."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = self._as_bytes(rows)
        if len(keys) != len(rows):
            raise ValueError(f"{len(keys)} keys but {len(rows)} records")
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
        if len(keys) > 1 and (keys[1:] == keys[:-1]).any():
            raise ValueError("duplicate keys in a keyed table")
        self._keys, self._rows = keys, rows
        self._pkeys = np.empty(0, dtype=np.int64)
        self._prows = np.empty(0, dtype=self._bytes)
        self._tracking, self._dirty, self._dirty_n = False, [], 0

    def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys put, their current records, keys deleted) since the previous call, then forget them. Keys are
        sorted and unique, and a key is in at most one of the two lists (its state now). First call: every row,
        no deletion."""
        if not self._tracking:
            self._tracking = True
            self._dirty, self._dirty_n = [], 0
            keys, rows = self.snapshot()
            return keys, rows, np.empty(0, dtype=np.int64)
        if not self._dirty:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=self.dtype), np.empty(0, dtype=np.int64)
        keys = np.unique(np.concatenate(self._dirty))
        self._dirty, self._dirty_n = [], 0
        found, rows = self.get(keys)
        return keys[found], rows[found], keys[~found]


BLOB = "blob"        # the layout name of a BlobTable's records in a state record


class BlobTable:
    """int64 key -> one variable-length ``bytes`` value (JSON, as the parts that use it write it), with the
    change tracking of :class:`KeyedTable` and the same interface: what a part keeps per chunk of events or per
    published class, whose values are not of fixed width (audit tokens, sensitive values, generalizations).
    ``dtype`` is :data:`BLOB`; records at the interface are lists of ``bytes`` aligned with the keys.

    >>> t = BlobTable()
    >>> t.put(np.array([2, 1]), [b'"b"', b'"a"'])
    >>> keys, rows, deleted = t.changes()
    >>> keys.tolist(), rows, deleted.tolist()
    ([1, 2], [b'"a"', b'"b"'], [])
    >>> _ = t.delete(np.array([1])); t.put(np.array([3]), [b'"c"'])
    >>> [(k.tolist(), r, d.tolist()) for k, r, d in [t.changes()]]
    [([3], [b'"c"'], [1])]
    """

    dtype = BLOB

    def __init__(self) -> None:
        self._values: dict[int, bytes] = {}
        self._tracking = False
        self._dirty: set[int] = set()

    def __len__(self) -> int:
        return len(self._values)

    @property
    def nbytes(self) -> int:
        return sum(map(len, self._values.values())) + 8 * len(self._values)

    def __eq__(self, other) -> bool:
        if not isinstance(other, BlobTable):
            return NotImplemented
        return self._values == other._values

    __hash__ = None  # type: ignore[assignment]  # unhashable (mutable); typeshed types it as a method

    def get(self, key: int) -> bytes | None:
        return self._values.get(int(key))

    def items(self):
        """(key, value) in key order."""
        return sorted(self._values.items())

    def put(self, keys, values) -> None:
        keys = [int(k) for k in np.asarray(keys, dtype=np.int64).tolist()]
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        self._values.update(zip(keys, map(bytes, values)))
        if self._tracking:
            self._dirty.update(keys)

    def delete(self, keys) -> int:
        n = 0
        for k in np.asarray(keys, dtype=np.int64).tolist():
            if self._values.pop(k, None) is not None:
                n += 1
                if self._tracking:
                    self._dirty.add(k)
        return n

    def snapshot(self) -> tuple[np.ndarray, list[bytes]]:
        keys = sorted(self._values)
        return np.array(keys, dtype=np.int64), [self._values[k] for k in keys]

    def load(self, keys, values) -> None:
        keys = np.asarray(keys, dtype=np.int64).tolist()
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate keys in a blob table")
        self._values = dict(zip(keys, map(bytes, values)))
        self._tracking, self._dirty = False, set()

    def changes(self) -> tuple[np.ndarray, list[bytes], np.ndarray]:
        if not self._tracking:
            self._tracking = True
            self._dirty = set()
            keys, values = self.snapshot()
            return keys, values, np.empty(0, dtype=np.int64)
        dirty = sorted(self._dirty)
        self._dirty = set()
        put = [k for k in dirty if k in self._values]
        gone = [k for k in dirty if k not in self._values]
        return (np.array(put, dtype=np.int64), [self._values[k] for k in put], np.array(gone, dtype=np.int64))

"""The published classes an engine may reuse: one registry per engine (one stream partition)."""
from __future__ import annotations

import numpy as np
import orjson

from stream_anon import checkpoint
from stream_anon.keyed_table import BlobTable


class PublishedClasses:
    """Snapped boxes, ids, published generalizations, NCP, creation time and a tag (m-invariance: the signature)
    of the classes published so far, bounded by ``horizon_s`` of event time and ``max_classes``.

    State: the ``published`` :class:`~stream_anon.keyed_table.BlobTable`, one entry per class keyed by its serial
    number (registration order), brought up to date when asked for; the core holds the next serial."""

    def __init__(self, space, horizon_s: float, max_classes: int):
        self.space = space
        self.horizon_s, self.max_classes = float(horizon_s), int(max_classes)
        d = space.dims
        self.lo, self.hi = np.empty((0, d)), np.empty((0, d))
        self.ids: list[str] = []
        self.gen: list[dict] = []
        self.ncp, self.time = np.empty(0), np.empty(0)
        self.tag = np.empty(0, dtype=np.int64)
        self.serial = np.empty(0, dtype=np.int64)
        self.next_serial = 0
        self.table = BlobTable()
        self._synced = False

    def __len__(self) -> int:
        return len(self.ids)

    def register(self, lo, hi, ids, gens, ncp, time: float, tags=None) -> None:
        n = len(ids)
        start = len(self.ids)
        self.lo = np.concatenate([self.lo, lo])
        self.hi = np.concatenate([self.hi, hi])
        self.ncp = np.concatenate([self.ncp, ncp])
        self.time = np.concatenate([self.time, np.full(n, time)])
        self.tag = np.concatenate([self.tag, np.full(n, -1, dtype=np.int64) if tags is None
                                   else np.asarray(tags, dtype=np.int64)])
        self.serial = np.concatenate([self.serial, np.arange(self.next_serial, self.next_serial + n)])
        self.next_serial += n
        self.ids += list(ids)
        self.gen += list(gens)
        if self._synced:
            rows = range(start, start + n)
            self.table.put(self.serial[start:], [self._blob(i) for i in rows])

    def expire(self, now: float) -> None:
        keep = self.time >= now - self.horizon_s
        keep &= np.arange(len(keep)) >= len(keep) - self.max_classes
        if not keep.all():
            if self._synced:
                self.table.delete(self.serial[~keep])
            idx = np.flatnonzero(keep)
            self.lo, self.hi, self.ncp = self.lo[idx], self.hi[idx], self.ncp[idx]
            self.time, self.tag, self.serial = self.time[idx], self.tag[idx], self.serial[idx]
            self.ids = [self.ids[i] for i in idx]
            self.gen = [self.gen[i] for i in idx]

    def cover(self, X: np.ndarray) -> np.ndarray:
        """(rows, classes): which published boxes cover each row (a dimension published as the whole domain
        also covers a missing value)."""
        clo, chi = self.space.coverage_box(self.lo, self.hi)
        return ((X[:, None, :] >= clo[None]) & (X[:, None, :] <= chi[None])).all(axis=2)

    def choose_random(self, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Per row, a covering class chosen uniformly at random, or -1 (CASTLE, Cao et al., ICDE 2008, Example 4:
        choosing the best-fitting class would leak the value). A class already chosen for an earlier row of the
        call is preferred when it covers the row (uniformly among those): the additions a class takes in one
        release must hold k individuals (:func:`stream_anon.formers.base.thin_reuse_entries`), so they pool."""
        cover = self.cover(X)
        ok = cover.any(axis=1)
        if not ok.any():            # no draw: the generator's stream stays as it was
            return np.full(len(X), -1)
        draws = rng.random(cover.shape)
        chosen = np.zeros(cover.shape[1], dtype=bool)
        out = np.full(len(X), -1)
        for i in np.flatnonzero(ok).tolist():
            again = cover[i] & chosen
            out[i] = int(np.argmax(draws[i] * (again if again.any() else cover[i])))
            chosen[out[i]] = True
        return out

    def exact_cover(self, reused: dict[int, list[int]], X: np.ndarray) -> dict[int, list[int]]:
        """Reuse decisions (class index -> rows of ``X``) kept only where the class's published H3 cells hold the
        record (the boxes of H3 geopoints lie inside their cells; this is the exact test). Without H3 QIs:
        unchanged."""
        if not self.space.h3_qis:
            return reused
        out: dict[int, list[int]] = {}
        for c, rows in reused.items():
            ok = [r for r in rows if self.space.in_published_cells(X[r], self.gen[c])]
            if ok:
                out[c] = ok
        return out

    # -- state ----------------------------------------------------------------------------------------------
    def _blob(self, i: int) -> bytes:
        return orjson.dumps({"lo": self.lo[i], "hi": self.hi[i], "id": self.ids[i], "gen": self.gen[i],
                             "ncp": float(self.ncp[i]), "time": float(self.time[i]), "tag": int(self.tag[i])},
                            option=orjson.OPT_SERIALIZE_NUMPY)

    def state_core(self) -> dict:
        return {"next_serial": self.next_serial}

    def state_tables(self) -> dict[str, BlobTable]:
        """``published``: class serial -> its box, id, generalization, NCP, time and tag (JSON)."""
        if not self._synced:
            self.table.load(self.serial, [self._blob(i) for i in range(len(self))])
            self._synced = True
        return {"published": self.table}

    def load_state(self, core: dict, tables: checkpoint.Tables) -> None:
        keys, blobs = tables.get("published", (np.empty(0, dtype=np.int64), []))
        docs = [orjson.loads(b) for b in blobs]
        d = self.space.dims
        self.lo = np.array([c["lo"] for c in docs], dtype=float).reshape(-1, d)
        self.hi = np.array([c["hi"] for c in docs], dtype=float).reshape(-1, d)
        self.ids, self.gen = [c["id"] for c in docs], [c["gen"] for c in docs]
        self.ncp = np.array([c["ncp"] for c in docs], dtype=float)
        self.time = np.array([c["time"] for c in docs], dtype=float)
        self.tag = np.array([c["tag"] for c in docs], dtype=np.int64)
        self.serial = np.asarray(keys, dtype=np.int64)
        self.next_serial = int(core["next_serial"])
        self.table.load(keys, blobs)
        self._synced = True

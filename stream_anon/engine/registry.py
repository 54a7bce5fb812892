"""The published classes an engine may reuse: one registry per engine (one stream partition)."""
from __future__ import annotations

import numpy as np


class PublishedClasses:
    """Snapped boxes, ids, published generalizations, NCP, creation time and a tag (m-invariance: the signature)
    of the classes published so far, bounded by ``horizon_s`` of event time and ``max_classes``."""

    def __init__(self, space, horizon_s: float, max_classes: int):
        self.space = space
        self.horizon_s, self.max_classes = float(horizon_s), int(max_classes)
        d = space.dims
        self.lo, self.hi = np.empty((0, d)), np.empty((0, d))
        self.ids: list[str] = []
        self.gen: list[dict] = []
        self.ncp, self.time = np.empty(0), np.empty(0)
        self.tag = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def register(self, lo, hi, ids, gens, ncp, time: float, tags=None) -> None:
        n = len(ids)
        self.lo = np.concatenate([self.lo, lo])
        self.hi = np.concatenate([self.hi, hi])
        self.ncp = np.concatenate([self.ncp, ncp])
        self.time = np.concatenate([self.time, np.full(n, time)])
        self.tag = np.concatenate([self.tag, np.full(n, -1, dtype=np.int64) if tags is None
                                   else np.asarray(tags, dtype=np.int64)])
        self.ids += list(ids)
        self.gen += list(gens)

    def expire(self, now: float) -> None:
        keep = self.time >= now - self.horizon_s
        keep &= np.arange(len(keep)) >= len(keep) - self.max_classes
        if not keep.all():
            idx = np.flatnonzero(keep)
            self.lo, self.hi, self.ncp, self.time, self.tag = (a[idx] for a in (self.lo, self.hi, self.ncp,
                                                                                   self.time, self.tag))
            self.ids = [self.ids[i] for i in idx]
            self.gen = [self.gen[i] for i in idx]

    def cover(self, X: np.ndarray) -> np.ndarray:
        """(rows, classes): which published boxes cover each row (a dimension published as the whole domain
        also covers a missing value)."""
        clo, chi = self.space.coverage_box(self.lo, self.hi)
        return ((X[:, None, :] >= clo[None]) & (X[:, None, :] <= chi[None])).all(axis=2)

    def choose_random(self, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Per row, a covering class chosen uniformly at random, or -1 (CASTLE, Cao et al., ICDE 2008, Example 4:
        choosing the best-fitting class would leak the value)."""
        cover = self.cover(X)
        ok = cover.any(axis=1)
        if not ok.any():            # no draw: the generator's stream stays as it was
            return np.full(len(X), -1)
        choice = np.argmax(rng.random(cover.shape) * cover, axis=1)
        return np.where(ok, choice, -1)

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"lo": self.lo.tolist(), "hi": self.hi.tolist(), "ids": self.ids, "gen": self.gen,
                "ncp": self.ncp.tolist(), "time": self.time.tolist(), "tag": self.tag.tolist()}

    def load_state(self, state: dict) -> None:
        d = self.space.dims
        self.lo = np.array(state["lo"], dtype=float).reshape(-1, d)
        self.hi = np.array(state["hi"], dtype=float).reshape(-1, d)
        self.ids, self.gen = list(state["ids"]), list(state["gen"])
        self.ncp, self.time = np.array(state["ncp"], dtype=float), np.array(state["time"], dtype=float)
        self.tag = np.array(state["tag"], dtype=np.int64)

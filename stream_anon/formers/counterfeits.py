"""Counterfeit arithmetic of m-invariance (Xiao & Tao, SIGMOD 2007, section 4, adapted to classes counted in
distinct individuals): how many counterfeit individuals make a class m-unique with exactly its signature's
values, how to spread them over the values, and the audit tokens of counterfeit records."""
from __future__ import annotations

import hashlib
import hmac

import numpy as np

from stream_anon.crypto import HmacTokens


def counterfeit_need(counts: np.ndarray, n: np.ndarray, m: int, presence: bool = True,
                     nulls: np.ndarray | None = None) -> np.ndarray:
    """Fewest counterfeit individuals that make classes m-unique with exactly their signature's values.

    ``counts``: (C, s) real individuals per signature value (s >= m), ``n``: (C,) real individuals (an individual
    with a null value counts in ``n`` only). We need x_v >= 0 with every value present (counts + x >= 1) and
    ``(counts_v + x_v) * m <= n + X`` for X = sum x. With T = floor((n + X) / m) that is feasible iff
    ``max counts <= T``, ``zeros <= X <= sum(T - counts)``; the smallest X is at most m + s above
    ``max(zeros, m * max - n)``. With ``presence=False`` (no fixed signature: the columns are the value domain) a
    value may stay absent, but at least m values must be present: ``max(0, m - nonzero)`` counterfeits go to
    absent values. ``nulls`` (C,): individuals holding a null value; a null is visible in the class, so it obeys
    the 1/m rule too (``nulls <= T``) but is no distinct value and no counterfeit gets it.

    >>> counterfeit_need(np.array([[5, 5, 0], [3, 3, 3], [4, 3, 3]]), np.array([10, 9, 10]), 3).tolist()
    [5, 0, 2]
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    s = counts.shape[1]
    if s < m:
        raise ValueError(f"a signature needs at least m = {m} values, got {s}")
    zeros = (counts == 0).sum(axis=1)
    if not presence:
        zeros = np.maximum(m - (s - zeros), 0)
    top = counts.max(axis=1) if s else np.zeros(len(n), dtype=np.int64)
    if nulls is not None:
        top = np.maximum(top, np.asarray(nulls, dtype=np.int64).reshape(-1))
    x0 = np.maximum(np.maximum(zeros, m * top - n), 0)
    out = np.full(len(n), -1, dtype=np.int64)
    for extra in range(m + s + 2):
        x = x0 + extra
        t = (n + x) // m
        room = np.maximum(t[:, None] - counts, 0).sum(axis=1)
        ok = (out < 0) & (top <= t) & (t >= 1) & (room >= x)
        out[ok] = x[ok]
        if (out >= 0).all():
            break
    if (out < 0).any():        # pragma: no cover - impossible for s >= m (see the docstring)
        raise RuntimeError("counterfeit_need: no feasible count")
    return out


def need_one(counts, n: int, m: int, presence: bool = True, nulls: int = 0) -> int:
    """:func:`counterfeit_need` for one class, in plain Python (the per-individual assignment calls it thousands of
    times per release, where numpy's call overhead dominates).

    >>> need_one([5, 5, 0], 10, 3), need_one([3, 3, 3], 9, 3), need_one([4, 3, 3], 10, 3)
    (5, 0, 2)
    """
    s = len(counts)
    if s < m:
        raise ValueError(f"a signature needs at least m = {m} values, got {s}")
    zeros = sum(1 for c in counts if c == 0)
    if not presence:
        zeros = max(m - (s - zeros), 0)
    top = max(max(counts, default=0), nulls)
    x = max(zeros, m * top - n, 0)
    for _ in range(m + s + 2):
        t = (n + x) // m
        if top <= t and t >= 1 and sum(t - c for c in counts if c < t) >= x:
            return x
        x += 1
    raise RuntimeError("need_one: no feasible count")      # pragma: no cover - impossible for s >= m


def spread_counterfeits(counts: np.ndarray, n: int, m: int, presence: bool = True, nulls: int = 0) -> np.ndarray:
    """Counterfeit individuals per signature value for one class: the minimum number, each missing value first,
    the rest on the least represented values (the class ends as balanced as possible). With ``presence=False``
    absent values get one only as far as needed to reach m values (or room), in column order.

    >>> spread_counterfeits(np.array([4, 3, 3, 0]), 10, 3).tolist()
    [0, 0, 0, 2]
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = need_one(counts.tolist(), n, m, presence, nulls)
    x = np.zeros(len(counts), dtype=np.int64)
    active = counts > 0
    absent = np.flatnonzero(~active)
    first = absent if presence else absent[: max(0, m - int(np.count_nonzero(active)))]
    x[first] = 1
    active[first] = True
    t = (n + total) // m
    for _ in range(total - int(x.sum())):
        cur = counts + x
        room = active & (cur < t)
        if not room.any():                      # presence=False: open another absent value
            room = ~active & (t >= 1)
            active[np.flatnonzero(room)[0]] = True
            room = active & (cur < t)
        j = int(np.flatnonzero(room)[np.argmin(cur[room])])
        x[j] += 1
    return x


def counterfeit_token(secret: bytes, release_id: str, class_id: str, n: int) -> str:
    """Audit token of the n-th counterfeit record of a class in a release (hex HMAC-SHA256)."""
    return hmac.new(secret, f"counterfeit:{release_id}/{class_id}/{n}".encode(), hashlib.sha256).hexdigest()


class CounterfeitTokens:
    """:func:`counterfeit_token` of a class's counterfeit records 0..count-1, with the keyed state built once.

    >>> CounterfeitTokens(b"s")("r1", "c2", 2) == [counterfeit_token(b"s", "r1", "c2", n) for n in range(2)]
    True
    """

    def __init__(self, secret: bytes):
        self._tokens = HmacTokens(secret, b"counterfeit:")

    def __call__(self, release_id: str, class_id: str, count: int) -> list[str]:
        return self._tokens([f"{release_id}/{class_id}/{n}" for n in range(count)])


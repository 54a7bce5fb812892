"""The carried fields of one pending window (the values window consumers, the DP aggregates, read at its close),
held as compact JSON rather than as Python objects.

Why: a window is open for 15-30 minutes of event time, so the worker holds tens of thousands of events' carried
values at any moment. Kept as the parsed ``str``/``int`` objects they pinned memory among each batch's short-lived
objects and made everything else in the worker slower (carrying the DP fields as objects cost 2.8 us per event in
``bench/bench_worker_core.py``, of which ~0.5 is the carrying itself); as one JSON chunk per batch they cost a
serialization at append, a parse at close and nothing in between.

A chunk is JSON only when the round trip is exact (:func:`_exact_json`): ``str``, ``int``, finite ``float``,
``bool`` and ``None`` values (everything an event parsed from JSON has, except a nested object or list); any
other chunk (a DataFrame's NaN or numpy value, a nested object) stays the list it was. The engine's state writes
the chunks as they are (:class:`stream_anon.engine.buffer.OpenWindows`).

>>> w = CarriedWindow(("line", "fare"))
>>> w.append({"line": ["a", "b"], "fare": [150, None]})
>>> w.append({"line": ["c"], "fare": [float("nan")]})        # not exact as JSON: kept as a list
>>> cols = w.columns(np.array([2, 0, 1]))
>>> cols["line"], cols["fare"][1:]
(['c', 'a', 'b'], [150, None])
"""
from __future__ import annotations

import math

import numpy as np
import orjson

_EXACT_TYPES = frozenset({str, int, bool, type(None)})


def _exact_json(values: list) -> bytes | None:
    """``values`` as the inside of a JSON array (no brackets), or None when JSON would not give them back as they
    are (other types, NaN or infinities, text with lone surrogates, integers beyond 64 bits)."""
    types = set(map(type, values))
    if not types <= _EXACT_TYPES:
        if not types <= _EXACT_TYPES | {float} or not all(math.isfinite(v) for v in values if type(v) is float):
            return None
    try:
        return orjson.dumps(values)[1:-1]
    except orjson.JSONEncodeError:
        return None


def _decode(chunks: list):
    if chunks and all(type(c) is np.ndarray for c in chunks):
        return np.concatenate(chunks)
    if all(type(c) is bytes for c in chunks):
        return orjson.loads(b"[" + b",".join(chunks) + b"]")
    out: list = []
    for c in chunks:
        out += orjson.loads(b"[" + c + b"]") if type(c) is bytes else list(c)
    return out


class CarriedWindow:
    """One window's carried fields: per field, chunks (JSON bytes or lists) in arrival order."""

    __slots__ = ("chunks",)

    def __init__(self, fields: tuple[str, ...]):
        self.chunks: dict[str, list] = {f: [] for f in fields}

    def append(self, columns: dict) -> None:
        """Add a run of events: field -> values (every field of the window, equal lengths; a numpy array, such as
        the engine's unit ids, is kept as one)."""
        for f, col in columns.items():
            if type(col) is np.ndarray:
                if len(col):
                    self.chunks[f].append(col)
            elif col:
                chunk = _exact_json(col)
                self.chunks[f].append(col if chunk is None else chunk)

    def columns(self, order: np.ndarray | None = None) -> dict:
        """Field -> values of the window's events (lists; numpy arrays for array fields), in arrival order or in
        ``order`` (positions)."""
        out = {f: _decode(chunks) for f, chunks in self.chunks.items()}
        if order is not None:
            il = order.tolist()
            out = {f: col[order] if type(col) is np.ndarray else [col[i] for i in il] for f, col in out.items()}
        return out

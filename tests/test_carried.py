"""A pending window's carried fields held as JSON chunks (stream_anon.engine.carried): the values a window consumer
gets at the close are the values that arrived, type for type, through appends, reorders and state round trips."""
from __future__ import annotations

import numpy as np
import orjson

from stream_anon.engine.carried import CarriedWindow, JSONArray, orjson_default, plain_values

VALUES = ["a", "é", "", 1, 1.0, 2.5, True, False, None, 2**63 - 1, {"nested": [1]}, [1, "x"], float("nan"),
          "\ud800", 2**70]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(type(x) is type(y) and (x == y or (x != x and y != y)) for x, y in zip(a, b))


def test_values_come_back_as_they_went_in_type_for_type():
    w = CarriedWindow(("v", "n"))
    for i in range(0, len(VALUES), 3):                       # chunks: exact JSON ones and lists side by side
        w.append({"v": VALUES[i:i + 3], "n": list(range(i, min(i + 3, len(VALUES))))})
    assert _same(w.columns()["v"], VALUES)
    assert any(type(c) is bytes for c in w.chunks["v"]) and any(type(c) is list for c in w.chunks["v"])
    order = np.arange(len(VALUES))[::-1].copy()
    assert _same(w.columns(order)["v"], VALUES[::-1]) and w.columns(order)["n"] == list(range(len(VALUES)))[::-1]


def test_json_chunks_survive_the_state_round_trip_and_an_in_memory_restore():
    values = ["x", 3, 4.25, None, True]
    w = CarriedWindow(("v", "ids"))
    w.append({"v": values, "ids": np.array([7, 8, 9, 10, 11], dtype=np.int64)})
    raw = w.to_state(raw_json=True)
    assert type(raw["v"]) is JSONArray and type(raw["ids"]) is np.ndarray
    assert plain_values(raw) == w.to_state() == {"v": values, "ids": [7, 8, 9, 10, 11]}
    text = orjson.dumps(raw, default=orjson_default, option=orjson.OPT_SERIALIZE_NUMPY)
    for saved in (raw, orjson.loads(text)):                  # the committed chain in memory, or a decoded record
        back = CarriedWindow.from_state(("v", "ids"), saved, 5, {"ids": np.int64}).columns()
        assert _same(back["v"], values) and back["ids"].dtype == np.int64 and back["ids"].tolist() == [7, 8, 9, 10, 11]


def test_a_field_added_since_the_state_reads_as_null_for_the_saved_events():
    w = CarriedWindow.from_state(("v", "added"), {"v": [1, 2]}, 2)
    w.append({"v": [3], "added": ["z"]})
    assert w.columns() == {"v": [1, 2, 3], "added": [None, None, "z"]}

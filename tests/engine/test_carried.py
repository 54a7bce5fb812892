"""A pending window's carried fields held as JSON chunks (stream_anon.engine.carried): the values a window consumer
gets at the close are the values that arrived, type for type, through appends, reorders and state round trips."""
from __future__ import annotations

import numpy as np

from stream_anon.engine.buffer import OpenWindows
from stream_anon.engine.carried import CarriedWindow
from stream_anon.events import UNIT_IDS

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


def test_json_chunks_survive_the_state_round_trip():
    values = ["x", 3, 4.25, None, True]
    w = OpenWindows(("v", UNIT_IDS))
    w.state_tables()                                         # from here on every append is written as a chunk
    w.append(4, 17, [1.0] * 5, list("abcde"), {"v": values, UNIT_IDS: np.array([7, 8, 9, 10, 11], dtype=np.int64)})
    keys, blobs = w.table.snapshot()
    assert keys.tolist() == [17] and b'["x",3,4.25,null,true]' in blobs[0]     # the JSON chunk as it was
    back = OpenWindows(("v", UNIT_IDS))
    back.load_state({"windows": (keys, [bytes(b) for b in blobs])})
    cols = back.windows[4]["carried"].columns()
    ids = cols[UNIT_IDS]
    assert _same(cols["v"], values) and ids.dtype == np.int64 and ids.tolist() == [7, 8, 9, 10, 11]
    assert back.windows[4]["tokens"] == list("abcde") and back.windows[4]["chunks"] == [(17, 5)]


def test_a_field_added_since_the_state_reads_as_null_for_the_saved_events():
    w = OpenWindows(("v",))
    w.append(0, 1, [1.0, 2.0], ["t1", "t2"], {"v": [1, 2]})
    back = OpenWindows(("v", "added"))
    back.load_state(w.state_tables() and {"windows": w.table.snapshot()})
    back.append(0, 2, [3.0], ["t3"], {"v": [3], "added": ["z"]})
    assert back.windows[0]["carried"].columns() == {"v": [1, 2, 3], "added": [None, None, "z"]}

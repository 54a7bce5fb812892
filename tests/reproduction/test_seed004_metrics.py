"""Reproduction of Singer's thesis metrics (seed 004): Table 4.8 worked example and Table 4.5 arithmetic.

Table 4.8 gives only the released rows; the original values of its 10 trips are ours (Table 4.6's drivers,
with the second class Hybrid SUV 4/5 as released and two suppressed trips), chosen to agree with the
release. Seats' domain in the example is {2, 4, 5}: the thesis's loss 1/2 for "4 or 5" is Iyengar's
(M_P - 1)/(M - 1) with M = 3 leaves (with the full {2, 4, 5, 7} domain it would be 1/3 and IPL 0.40).
"""
import numpy as np
import pandas as pd
import pytest
from pycanon import anonymity

from stream_anon.hierarchy import Hierarchy
from stream_anon.metrics import (AnonymizedTable, average_class_size, cross_data_precision_loss, discernibility, emd,
                                 g_balance, h_affiliation, in_data_precision_loss, knowledge_gain, min_k, min_l,
                                 suppression_ratio, thesis_metrics)

H = {"engine": Hierarchy.from_nested({"?": {"With E": ["EV", "Hybrid"], "Gas": []}}),
     "body": Hierarchy.from_nested({"?": ["Sedan", "Long Sedan", "SUV"]}),
     "seats": Hierarchy.from_nested({"?": {"2": [], "4 or 5": ["4", "5"]}})}
QI = ["engine", "body", "seats"]
ORIG = pd.DataFrame(
    [("EV", "Sedan", "2", 1, "Kid Cudi"), ("EV", "Sedan", "2", 1, "Radio"), ("EV", "Sedan", "2", 2, "Radio"),
     ("EV", "Sedan", "2", 3, "Paul Kalkbrenner"), ("Gas", "Sedan", "2", 4, "BLACKPINK"),
     ("Hybrid", "SUV", "4", 5, "Taylor Swift"), ("Hybrid", "SUV", "4", 5, "Radio"),
     ("Hybrid", "SUV", "5", 6, "Taylor Swift"), ("Gas", "Long Sedan", "2", 7, "Radio"),
     ("EV", "SUV", "5", 8, "Radio")], columns=QI + ["driver", "artist"])
REL = pd.DataFrame([("?", "Sedan", "2")] * 5 + [("Hybrid", "SUV", "4 or 5")] * 3 + [(None, None, None)] * 2,
                   columns=QI)
REL["artist"] = ORIG["artist"]


@pytest.fixture(scope="module")
def release():
    return AnonymizedTable(ORIG, REL, QI, sensitive="artist", individual="driver", hierarchies=H)


def test_table_4_8_values(release):
    r = release
    assert suppression_ratio(r) == pytest.approx(2 / 10)
    assert min_k(r) == 2
    assert min_l(r) == 2
    assert average_class_size(r) == 3                       # (4 + 2) / 2 drivers
    assert discernibility(r) == 54                          # 5*5 + 3*3 + 2*10
    assert in_data_precision_loss(r) == pytest.approx(12.5 / 30)      # about 0.42
    assert cross_data_precision_loss(r) == pytest.approx(12.5 / 30)   # equals IPL for generalization
    assert emd(r) == pytest.approx(5 / 12)
    assert g_balance(r) == pytest.approx(4 / 9)
    assert h_affiliation(r) == 1.0
    assert h_affiliation(r, ignore=["Radio"]) == 1.0       # both drivers of class 2 share Taylor Swift
    assert knowledge_gain(r) == pytest.approx(5 / 16)


def test_table_4_8_scaled(release):
    m = thesis_metrics(release, raw=AnonymizedTable.identity(ORIG, QI, sensitive="artist", individual="driver",
                                                     hierarchies=H))
    assert m["min_k_scaled"] == pytest.approx(1 / 5)       # (2 - 1) / (6 - 1)
    assert m["min_l_scaled"] == pytest.approx(1 / 4)       # (2 - 1) / (5 - 1)
    assert 0 <= m["discernibility_scaled"] <= 1


def test_table_4_5_arithmetic():
    table = [("EV", "Sedan", 2, 4, 2028), ("EV", "SUV", 4, 1, 59), ("EV", "SUV", 5, 2, 828), ("EV", "SUV", 7, 1, 128),
             ("Gas", "Sedan", 2, 2, 826), ("Gas", "Long Sedan", 2, 2, 701), ("Gas", "Long Sedan", 4, 1, 736),
             ("Gas", "Long Sedan", 5, 1, 178), ("Hybrid", "Long Sedan", 5, 1, 72)]
    rows, driver = [], 0
    for e, b, s, vehicles, trips in table:
        ids = [driver + i for i in range(vehicles)]
        driver += vehicles
        rows += [(e, b, s, ids[t % vehicles]) for t in range(trips)]
    df = pd.DataFrame(rows, columns=QI + ["driver"])
    assert len(df) == 5556 and df.driver.nunique() == 15
    raw = AnonymizedTable.identity(df, QI, individual="driver")
    assert round(average_class_size(raw), 2) == 1.67         # 15 drivers / 9 classes
    assert discernibility(raw) == 6_570_474                  # sum of squared trip counts
    assert min_k(raw) == 1


def test_min_k_and_min_l_agree_with_pycanon(release):
    kept = REL[release.kept].copy()
    per_record = AnonymizedTable(ORIG[release.kept], kept, QI, sensitive="artist", hierarchies=H)
    assert min_k(per_record) == anonymity.k_anonymity(kept, QI) == 3
    assert min_l(per_record) == anonymity.l_diversity(kept, QI, ["artist"]) == 2
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"a": rng.integers(0, 4, 300), "b": rng.integers(0, 3, 300), "s": rng.integers(0, 6, 300)})
    r = AnonymizedTable.identity(df, ["a", "b"], sensitive="s")
    assert min_k(r) == anonymity.k_anonymity(df, ["a", "b"])
    assert min_l(r) == anonymity.l_diversity(df, ["a", "b"], ["s"])

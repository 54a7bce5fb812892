"""Reproduction of Hasan, Jiang & Li (seed 002): the toy Table 1 -> Table 3 buckets, the 1970 rider's 12
candidate combinations, and the 25% distortion of Grouping."""
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stream_anon.hierarchy import Hierarchy
from stream_anon.metrics import AnonymizedTable, distortion_ratio, utility_percent
from stream_anon.strategies.grouping import group_attributes, grouping_anonymize, k_medoids, phi_squared

E47, W49, E17, E27 = "E 47 St & Park Ave", "W 49 St & 8 Ave", "E 17 St & Broadway", "E 27 St & 1 Ave"
B22, E20, A52, W63 = "Broadway & E 22 St", "E 20 St & 2 Ave", "8 Ave & W 52 St", "W 63 St & Broadway"
CAR, FRO, W21 = "Carlton Ave & Flushing Ave", "Front St & Gold St", "W 21 St & 6 Ave"
ROWS = [  # Table 1: birth year, gender, start station, end station, start time, end time (April 2016)
    (1970, "M", E47, W49, "1 6:53", "1 6:59"), (1970, "M", W49, E47, "1 16:12", "1 16:19"),
    (1986, "F", E17, E27, "5 13:48", "5 13:56"), (1986, "F", E27, E17, "6 0:16", "6 0:25"),
    (1970, "M", E47, W49, "7 18:49", "7 18:55"), (1988, "M", B22, E20, "7 6:06", "7 6:11"),
    (1970, "M", W49, E47, "7 17:56", "7 18:02"), (1981, "M", A52, W63, "7 6:47", "7 6:52"),
    (1986, "F", E27, E17, "20 0:06", "20 0:15"), (1988, "M", E20, B22, "20 8:41", "20 8:45"),
    (1983, "M", CAR, FRO, "20 11:16", "20 11:20"), (1983, "F", W21, E20, "21 7:53", "21 8:00")]
GENDER = Hierarchy.from_nested({"Person": ["M", "F"]})
COLUMNS = [["birth_year"], ["gender"], ["start_station", "end_station"], ["start_time", "end_time"]]


def _t(s):
    day, hm = s.split()
    return datetime(2016, 4, int(day), *map(int, hm.split(":")))


@pytest.fixture
def table1():
    df = pd.DataFrame(ROWS, columns=["birth_year", "gender", "start_station", "end_station", "start_time",
                                     "end_time"])
    df["start_time"], df["end_time"] = df["start_time"].map(_t), df["end_time"].map(_t)
    df["duration_min"] = (df["end_time"] - df["start_time"]).dt.total_seconds() / 60
    return df


def test_toy_buckets(table1):
    # Table 3: the first bucket holds original rows 1, 5, 6, 8, 10, 11 (1-based), the six shortest trips.
    # Rows 1, 5 and 7 all last 6 minutes and only 1 and 5 join the first bucket: the split is the relaxed
    # Mondrian cut (sorted rows halved, ties by row order), not "below the median" (4 rows) or "up to it" (7).
    res = grouping_anonymize(table1, bucket_by=["duration_min"], sensitive=["start_time", "end_time"], l=6,
                             columns=COLUMNS, generalize={"gender": "Person"}, seed=0)
    buckets = sorted(sorted((b + 1).tolist()) for b in res.buckets)
    assert buckets == [[1, 5, 6, 8, 10, 11], [2, 3, 4, 7, 9, 12]]
    first = res.released[res.released["bucket"] == [b for b in range(2) if 0 in res.buckets[b]][0]]
    # the published bucket keeps each column's multiset, permuted; the station pair moves as one value
    assert sorted(first["birth_year"]) == [1970, 1970, 1981, 1983, 1988, 1988]
    pairs = list(zip(first["start_station"], first["end_station"]))
    assert sorted(pairs) == sorted(zip(table1["start_station"].iloc[[0, 4, 5, 7, 9, 10]],
                                       table1["end_station"].iloc[[0, 4, 5, 7, 9, 10]]))
    assert set(first["gender"]) == {"Person"}
    # Sec. 3.4: the 1970 rider in bucket 1 = 2 genders under "Person" x 1 visiting place (E47 -> W49, his
    # pair, seen twice) x 6 distinct time stamps = 12 candidate combinations.
    places = {p for p in pairs if p == (E47, W49)}
    combos = GENDER.node_range("Person")[1] + 1
    combos *= len(places) * first[["start_time", "end_time"]].drop_duplicates().shape[0]
    assert combos == 12


def test_l_check_refuses_a_split_that_breaks_diversity(table1):
    # 6 distinct time stamps per bucket: l = 7 cannot hold in a bucket of 6, so the table stays one bucket.
    res = grouping_anonymize(table1, bucket_by=["duration_min"], sensitive=["start_time", "end_time"], l=7,
                             columns=COLUMNS)
    assert [len(b) for b in res.buckets] == [12]


def test_distortion_is_one_quarter(table1):
    # Grouping generalizes only Gender (to the root) among the 4 QIs: DR = 1/4, utility 75%.
    res = grouping_anonymize(table1, bucket_by=["duration_min"], sensitive=["start_time", "end_time"], l=6,
                             columns=COLUMNS, generalize={"gender": "Person"})
    released = res.released.sort_index()
    qis = ["birth_year", "gender", "start_station", "end_station"]
    r = AnonymizedTable(table1, released[qis], qis, hierarchies={"gender": GENDER},
                suppressed=np.zeros(len(table1), bool))
    assert distortion_ratio(r) == pytest.approx(0.25)
    assert utility_percent(r) == pytest.approx(75.0)


def test_attribute_grouping_by_phi_squared(table1):
    # On the toy table start and end station determine each other (phi^2 = 1).
    assert phi_squared(table1["start_station"], table1["end_station"]) == pytest.approx(1.0)
    assert phi_squared(table1["gender"], table1["gender"]) == pytest.approx(1.0)
    # Twelve rows correlate almost everything, so the column layout is checked on real Citi Bike trips: a
    # station id and its (binned) latitude are functionally dependent and must share a column.
    df = pd.read_csv(Path(__file__).resolve().parents[2] / "data" / "citibike_slice.csv.gz", nrows=3000)
    attrs = ["start station id", "end station id", "birth year", "gender", "start station latitude",
             "end station latitude"]
    cols = group_attributes(df, attrs, n_columns=4)
    assert ["start station id", "start station latitude"] in cols
    assert ["end station id", "end station latitude"] in cols


def test_k_medoids_is_the_exact_pam_optimum():
    rng = np.random.default_rng(0)
    pts = rng.random((7, 2))
    D = np.linalg.norm(pts[:, None] - pts[None], axis=2)
    labels, medoids = k_medoids(D, 3)
    import itertools
    best = min(D[:, list(m)].min(axis=1).sum() for m in itertools.combinations(range(7), 3))
    assert D[:, medoids].min(axis=1).sum() == pytest.approx(best)
    assert (labels == np.argmin(D[:, medoids], axis=1)).all()

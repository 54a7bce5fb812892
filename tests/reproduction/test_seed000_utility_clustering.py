"""Reproduction of Bhati et al. (seed 000), the parts implemented so far: Table 4 weights and the distortion
family. The S_AUTO row needs the paper's private tap data and is not reproduced."""
import networkx as nx
import pandas as pd
import pytest

from stream_anon.hierarchy import Hierarchy
from stream_anon.metrics import AnonymizedTable, distortion, entropy_factor, utility_weights

# passenger type, boarding, alighting, start time
TABLE4 = {"S_OD": ([1, 5, 5, 1], [0.083, 0.416, 0.416, 0.083]),
          "S_RST": ([1, 1, 1, 5], [0.125, 0.125, 0.125, 0.625]),
          "S_PT": ([5, 1, 1, 1], [0.625, 0.125, 0.125, 0.125]),
          "S_EQ": ([1, 1, 1, 1], [0.25, 0.25, 0.25, 0.25])}


@pytest.mark.parametrize("scenario", list(TABLE4))
def test_table4_weights(scenario):
    factors, printed = TABLE4[scenario]
    # The paper truncates 5/12 = 0.41666 to 0.416; compare at the printed precision.
    assert utility_weights(factors) == pytest.approx(printed, abs=1e-3)


def test_entropy_factor():
    assert entropy_factor(["a", "b", "a", "b"]) == pytest.approx(1.0)
    assert entropy_factor([0, 100, 1000, 1800], bucket=900) == pytest.approx(1.5)


def test_distortion_family():
    tree = Hierarchy.from_nested({"Person": {"Adult": [], "Not Adult": ["Senior Citizen", "Child/Student"]}})
    line = nx.path_graph(["s1", "s2", "s3", "s4", "s5"])        # diameter 4
    orig = pd.DataFrame({"pt": ["Adult", "Senior Citizen", "Child/Student", "Adult", "Adult"],
                         "stn": ["s1", "s3", "s4", "s5", "s2"], "t": [0, 3600, 7200, 0, 100]})
    rel = pd.DataFrame({"pt": ["Person", "Person", "Not Adult", "Not Adult", None], "c": [0, 0, 1, 1, None]})
    rel["stn"] = None
    rel["t"] = None
    rel.loc[4, "pt"] = None
    r = AnonymizedTable(orig, rel, ["pt", "stn", "t"], class_col="c", hierarchies={"pt": tree}, graphs={"stn": line},
                bounds={"t": (0, 7200)}, suppressed=[False, False, False, False, True])
    w = {"pt": 0.5, "stn": 0.25, "t": 0.25}
    d = distortion(r, w)
    # class 0 = records 0, 1: pt LCA Person (1), stations s1..s3 (2/4), time 3600/7200
    # class 1 = records 2, 3: pt LCA Person (Child/Student + Adult: 1), s4..s5 (1/4), time 7200/7200
    g0 = 0.5 * 1 + 0.25 * 0.5 + 0.25 * 0.5
    g1 = 0.5 * 1 + 0.25 * 0.25 + 0.25 * 1
    assert d["gamma_g"] == pytest.approx((2 * g0 + 2 * g1) / 4)
    assert d["gamma_s"] == pytest.approx(0.2)
    assert d["gamma_tot"] == pytest.approx(d["gamma_g"] + (1 - d["gamma_g"]) * 0.2)
    assert d["per_attribute"]["stn"] == pytest.approx(0.375 + 0.625 * 0.2)


# -- Algorithm 1 on the toy table (Table 2 -> Table 3) --------------------------------------------------------
import numpy as np  # noqa: E402

from stream_anon.strategies.tabular import frame_attributes  # noqa: E402
from stream_anon.strategies.utility_clustering import utility_clustering  # noqa: E402

PT_TREE = Hierarchy.from_nested({"Person": {"Adult": [], "Not Adult": ["Senior Citizen", "Child/Student"]}})
# Figure 1 is an image; its text fixes sp(A, B) = 1 and sp(A, D) = 2 (Example 8) and Table 3 merges B with C
# (one hop). Four stations on two lines: A-B-C and B-D is the smallest graph meeting all three [inference].
FIG1 = nx.Graph([("A", "B"), ("B", "C"), ("B", "D")])
HM = lambda h, m: h * 3600 + m * 60  # noqa: E731
TABLE2 = pd.DataFrame({
    "pt": ["Adult", "Adult", "Child/Student", "Adult", "Senior Citizen", "Child/Student", "Adult", "Senior Citizen"],
    "bs": list("AABBACBA"), "as": list("CCDADDDD"),
    "start": [HM(9, 0), HM(9, 0), HM(9, 5), HM(10, 0), HM(11, 0), HM(9, 15), HM(10, 0), HM(11, 5)],
    "ride": [400, 400, 320, 280, 520, 340, 480, 520], "dist": [3.6, 3.6, 2.2, 2, 4.2, 3.8, 2.2, 4.2]})
TOY_QIS = {"pt": PT_TREE, "bs": FIG1, "as": FIG1, "start": None, "ride": None, "dist": None}
# Table 3, row by row (r_1..r_8): generalized values; a single value stays itself.
TABLE3 = {
    "pt": ["Adult", "Adult", "Child/Student", "Adult", "Senior Citizen", "Child/Student", "Adult", "Senior Citizen"],
    "bs": [{"A"}, {"A"}, {"B", "C"}, {"B"}, {"A"}, {"B", "C"}, {"B"}, {"A"}],
    "as": [{"C"}, {"C"}, {"D"}, {"A", "D"}, {"D"}, {"D"}, {"A", "D"}, {"D"}],
    "start": [HM(9, 0), HM(9, 0), (HM(9, 5), HM(9, 15)), HM(10, 0), (HM(11, 0), HM(11, 5)), (HM(9, 5), HM(9, 15)),
              HM(10, 0), (HM(11, 0), HM(11, 5))],
    "ride": [400, 400, (320, 340), (280, 480), 520, (320, 340), (280, 480), 520],
    "dist": [3.6, 3.6, (2.2, 3.8), (2, 2.2), 4.2, (2.2, 3.8), (2, 2.2), 4.2],
}


def _as_cell(v):
    return set(v) if isinstance(v, frozenset) else (tuple(float(x) for x in v) if isinstance(v, tuple) else v)


@pytest.mark.parametrize("normalization", ["max", "zscore"])
@pytest.mark.parametrize("head", ["density", "greedy"])
def test_toy_table2_gives_table3(normalization, head):
    # Table 3 is reached by every configuration: the four pairs are each other's nearest neighbours.
    res = utility_clustering(TABLE2, TOY_QIS, k=2, normalization=normalization, head=head, seed=1)
    assert sorted(sorted(c.tolist()) for c in res.classes) == [[0, 1], [2, 5], [3, 6], [4, 7]]
    assert len(res.suppressed) == 0
    for col, expected in TABLE3.items():
        got = [_as_cell(v) for v in res.released[col]]
        want = [tuple(float(x) for x in v) if isinstance(v, tuple) else v for v in expected]
        assert got == want, col


def test_distances_examples_7_and_8():
    attrs = {a.name: a for a in frame_attributes(TABLE2, TOY_QIS)}
    # Example 7: D^T(Senior Citizen (r_5), Child/Student (r_6)) = 2 - 1 = 1
    assert attrs["pt"].distances_to(np.array([5]), 4)[0] == 1
    # Example 8: D^G(A (r_1), B (r_3)) = 1 on boarding; D^G(A (r_4), D (r_7)) = 2 on alighting
    assert attrs["bs"].distances_to(np.array([2]), 0)[0] == 1
    assert attrs["as"].distances_to(np.array([6]), 3)[0] == 2
    # max normalization: D^T / (L^T - 1) with 3 leaves; D^G / Diam(G) with Diam = 2
    assert attrs["pt"].max_distance == 2 and attrs["bs"].max_distance == 2


def test_zscore_statistics_are_exact_over_all_record_pairs():
    rng = np.random.default_rng(0)
    df = TABLE2.sample(30, replace=True, random_state=1).reset_index(drop=True)
    df["start"] = rng.integers(0, 86400, len(df))
    for a in frame_attributes(df, TOY_QIS):
        brute = a.pairwise(np.arange(len(df)))
        mean, std = a.zscore_stats()
        assert mean == pytest.approx(brute.mean()) and std == pytest.approx(brute.std()), a.name


def test_c1_limit_suppresses_the_head_and_returns_the_others():
    # Boarding limited to 0 hops: r_3 (B) and r_6 (C) can no longer share a class. Whoever of them heads a
    # candidate class with the other is suppressed; the rest still forms 2-anonymous classes.
    res = utility_clustering(TABLE2, TOY_QIS, k=2, normalization="max", head="density", limits={"bs": 0},
                             leftovers="defer")
    assert len(res.suppressed) >= 1
    for c in res.classes:
        assert len(c) >= 2 and TABLE2["bs"].iloc[c].nunique() == 1
    placed = np.concatenate(res.classes)
    assert len(set(placed.tolist()) | set(res.suppressed.tolist())) == len(TABLE2)


def test_priority_attribute_is_distorted_least():
    # Exp. 2's direction: giving one attribute utility factor 5 lowers its distortion against equal weights.
    from stream_anon.metrics import distortion
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"pt": rng.choice(PT_TREE.leaves, 200), "bs": rng.choice(list("ABCD"), 200),
                       "as": rng.choice(list("ABCD"), 200), "start": rng.integers(0, 86400, 200)})
    qis = {"pt": PT_TREE, "bs": FIG1, "as": FIG1, "start": (0, 86400)}
    per = {}
    for name, factors in (("S_EQ", None), ("S_RST", {"start": 5})):
        res = utility_clustering(df, qis, k=5, factors=factors)
        per[name] = distortion(res.release(df))["per_attribute"]["start"]
    assert per["S_RST"] < per["S_EQ"]

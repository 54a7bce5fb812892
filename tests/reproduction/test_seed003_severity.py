"""Reproduction of Kayem, Vester & Meinel (seed 003): k_min, severity penalties, AS_e and l_e."""
import pandas as pd
import pytest

from stream_anon.hierarchy import Hierarchy
from stream_anon.metrics import AnonymizedTable, weighted_information_loss
from stream_anon.metrics.severity import (CRIME_SEVERITY, average_severity, distinct_diversity, k_min,
                                          needs_top_generalization, severity_penalty, total_severity_penalty)


def test_k_min():
    assert k_min(5, [3, 5, 7, 25]) == 5          # k_cons = 5, minimum severity 3
    assert k_min(5, [7, 25]) == 7                # minimum severity 7 > k_cons


def test_severity_penalties():
    assert severity_penalty(CRIME_SEVERITY["Murder"], 5) == 5        # Example 2
    assert severity_penalty(CRIME_SEVERITY["Theft"], 5) == 1
    assert total_severity_penalty([0] * 5, ["Murder", "Theft", "Theft", "Theft", "Theft"], CRIME_SEVERITY) == 9


def test_table2_first_class():
    crimes = ["Theft", "Embezzlement", "Robbery", "Drunken Driving", "Theft"]
    # Eq. 10 prints a sum over D divided by |e|; Example 3's (5+3+7+5+5)/5 = 5 shows the sum runs over the class.
    assert average_severity(CRIME_SEVERITY[c] for c in crimes) == 5.0
    assert distinct_diversity(crimes) == 4
    assert needs_top_generalization(crimes, CRIME_SEVERITY)            # AS_e 5 > l_e 4


def test_weighted_information_loss():
    h = Hierarchy.from_nested({"*": {"North": ["A", "B"], "South": ["C", "D"]}})
    orig = pd.DataFrame({"age": [20, 22, 40, 60], "suburb": ["A", "B", "C", "D"]})
    rel = pd.DataFrame({"age": [(20, 22), (20, 22), (40, 60), (40, 60)], "suburb": ["North", "North", "*", "*"]})
    r = AnonymizedTable(orig, rel, ["age", "suburb"], hierarchies={"suburb": h})
    # age: 2/40 twice, 20/40 twice; suburb: 1/3 twice, 1 twice
    assert weighted_information_loss(r, {"age": 1, "suburb": 1}) == pytest.approx(2 * 0.05 + 2 * 0.5 + 2 / 3 + 2)
    assert weighted_information_loss(r, {"age": 10, "suburb": 5}) == pytest.approx(10 * 1.1 + 5 * (2 / 3 + 2))

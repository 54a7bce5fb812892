"""m-invariance (issue 3), engine-independent parts: the oyster-cards demo stream, the independent checker
(stream_anon.audit.checks.m_invariance) and the intersection attack with its naive per-window baseline
(stream_anon.attacks.intersection)."""
from __future__ import annotations

import copy
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

import pytest

from stream_anon.attacks.intersection import intersection_attack, naive_kl_releases, signatures
from stream_anon.audit import AuditConfig, MInvarianceConfig, QISpec, check_m_invariance, counterfeit_lower_bound
from stream_anon.audit.primitives import audit_token
from stream_anon.datasets import oyster_cards
from stream_anon.events import validate_event

ROOT = Path(__file__).resolve().parents[2]
CARDS_CONFIG = ROOT / "configs" / "oyster-cards.toml"
SECRET = b"test-secret-minvariance"

# -- the thesis' Figure 4.1 (Section 4.1): hospital releases, Age [20, 30], Zip 123* -------------------------------
ZIP_HIERARCHY = {"tree": {"*": {"123*": ["12345", "12346", "12347", "12348"], "456*": ["45601"]}}}
QIS = [QISpec("age", "age", "numeric", None, 0, 120), QISpec("zip", "zip", "categorical", ZIP_HIERARCHY)]
PEOPLE = {"Alice": (25, "12345", "Gastritis"), "Bob": (27, "12346", "Apnea"), "Charlotte": (22, "12347", "Insomnia"),
          "Dave": (29, "12348", "Flu"), "Eve": (24, "12345", "Apnea"), "Frank": (26, "12346", "Flu")}
CFG2 = MInvarianceConfig(m=2, privacy_unit="name", invariant="condition")


def person_event(name: str, release: int) -> dict:
    age, zipcode, condition = PEOPLE[name]
    return {"event_id": f"{name}-r{release}", "name": name, "age": age, "zip": zipcode, "condition": condition}


GEN = {"age": {"from": 20, "to": 30}, "zip": {"label": "123*"}}


def release(rid: str, classes: dict[str, list], counterfeits: dict[str, int] | None = None,
            m: int = 2) -> tuple[list, dict]:
    """Records and manifest of one release; a class lists raw events (real) or condition strings (counterfeit
    records); ``counterfeits`` gives the class's counterfeit individuals (the manifest count)."""
    records, entries = [], []
    for cid, members in classes.items():
        n_cf = 0
        for i, member in enumerate(members):
            if isinstance(member, dict):
                value, token = member["condition"], audit_token(SECRET, member["event_id"])
            else:
                value, token = member, audit_token(SECRET, f"counterfeit-{rid}-{cid}-{i}")   # of no raw event
                n_cf += 1
            records.append({"release_id": rid, "class_id": cid, "qi": GEN, "sensitive": {"condition": value},
                            "audit_token": token})
        entries.append({"class_id": cid, "generalization": GEN, "records": len(members), "reused": False,
                        "individuals": len({m["name"] for m in members if isinstance(m, dict)}),
                        "counterfeit_individuals": (counterfeits or {}).get(cid, 0), "counterfeit_records": n_cf})
    return records, {"release_id": rid, "stream": "hospital", "seq": int(rid[-1]), "k": 2, "m": m,
                     "classes": entries}


def figure_4_1():
    """(a) Alice Gastritis, Bob Apnea; (b) Bob Apnea, Charlotte Insomnia: each 2-anonymous and 2-diverse."""
    raw = [person_event("Alice", 1), person_event("Bob", 1), person_event("Bob", 2), person_event("Charlotte", 2)]
    r1, m1 = release("hosp-1", {"c1": [raw[0], raw[1]]})
    r2, m2 = release("hosp-2", {"c1": [raw[2], raw[3]]})
    return raw, r1 + r2, [m1, m2]


def invariant_pair():
    """m = 2 invariant: Alice leaves, so Bob's class in release 2 gets a counterfeit Gastritis (1 individual,
    1 record); Charlotte and Dave form a second class with their own signature."""
    raw = [person_event("Alice", 1), person_event("Bob", 1), person_event("Bob", 2), person_event("Charlotte", 2),
           person_event("Dave", 2)]
    r1, m1 = release("hosp-1", {"c1": [raw[0], raw[1]]})
    r2, m2 = release("hosp-2", {"c1": [raw[2], "Gastritis"], "c2": [raw[3], raw[4]]}, counterfeits={"c1": 1})
    return raw, r1 + r2, [m1, m2]


def attack(raw, records, **kw):
    return intersection_attack(records, raw, SECRET, privacy_unit="name", invariant="condition", **kw)


def test_figure_4_1_attack_pins_bob():
    raw, records, _ = figure_4_1()
    for knowledge in ("class", "qi"):
        bob = attack(raw, records, targets=["Bob"], knowledge=knowledge, quasi_identifiers=QIS)
        assert bob["pinned"] == 1 and bob["success_rate"] == 1.0 and bob["min_candidates"] == 1
        assert bob["true_value_missed"] == 0
    everyone = attack(raw, records)
    assert everyone["targets"] == 3 and everyone["pinned"] == 1          # Alice and Charlotte keep 2 candidates
    assert everyone["success_rate"] == pytest.approx(1 / 3)


def test_figure_4_1_checker_flags_the_signature_change():
    raw, records, manifests = figure_4_1()
    report = check_m_invariance(records, manifests, raw, SECRET, CFG2)
    assert not report.passed
    assert report.checks["m_uniqueness"]["passed"]                       # each release is fine on its own
    assert not report.checks["invariance"]["passed"]
    assert report.summary["signature_changes"] == 1
    example = report.checks["invariance"]["examples"][0]
    assert example["signatures"] == [["Apnea", "Gastritis"], ["Apnea", "Insomnia"]]
    assert "Bob" not in str(report.to_dict())                           # examples never name the individual


def test_invariant_pair_with_counterfeit_passes_and_resists_the_attack():
    raw, records, manifests = invariant_pair()
    report = check_m_invariance(records, manifests, raw, SECRET, CFG2)
    assert report.passed, report.format_text()
    s = report.summary
    assert (s["releases"], s["classes"], s["individuals"]) == (2, 3, 4)
    assert (s["counterfeit_individuals"], s["counterfeit_records"], s["signature_changes"]) == (1, 1, 0)
    # release 1 {G, A}: 0; release 2 {A, I, F}: 2*1 - 3 < 0: no counterfeit was forced by the distribution
    assert s["counterfeit_lower_bound"] == 0 == report.counterfeit_lower_bound()
    for knowledge in ("class", "qi"):
        result = attack(raw, records, knowledge=knowledge, quasi_identifiers=QIS)
        assert result["pinned"] == 0 and result["min_candidates"] >= CFG2.m
    bob = attack(raw, records, targets=["Bob"])
    assert bob["min_candidates"] == 2 and bob["true_value_missed"] == 0


def test_checker_fails_when_a_value_exceeds_one_over_m():
    raw = [person_event(n, 1) for n in ("Bob", "Eve", "Frank")]
    records, manifest = release("hosp-1", {"c1": raw})                    # Apnea, Apnea, Flu: 2/3 > 1/2
    report = check_m_invariance(records, [manifest], raw, SECRET, CFG2)
    assert not report.passed
    assert report.checks["m_uniqueness"]["violations_by_kind"] == {"a value is held by more than 1/m of the class": 1}
    assert report.counterfeit_lower_bound() == 1                         # 2*2 - 3
    # one counterfeit Gastritis individual repairs it: Apnea 2 of 4
    records, manifest = release("hosp-1", {"c1": raw + ["Gastritis"]}, counterfeits={"c1": 1})
    assert check_m_invariance(records, [manifest], raw, SECRET, CFG2).passed


def test_checker_fails_without_counterfeit_accounting():
    raw, records, manifests = invariant_pair()
    for drop in ("counterfeit_records", "counterfeit_individuals"):
        broken = copy.deepcopy(manifests)
        del broken[1]["classes"][0][drop]
        report = check_m_invariance(records, broken, raw, SECRET, CFG2)
        assert not report.passed and not report.checks["counterfeits"]["passed"], drop
    # a counterfeit record dropped from the manifest's class list entirely
    broken = copy.deepcopy(manifests)
    broken[1]["classes"] = broken[1]["classes"][1:]
    kinds = check_m_invariance(records, broken, raw, SECRET, CFG2).checks["counterfeits"]["violations_by_kind"]
    assert "counterfeit records in a class the manifest does not list" in kinds
    assert "records of no raw event differ from manifests' counterfeit_records" in kinds
    # without the counterfeit, Bob's class in release 2 holds one value: not 2-unique, and the signature changes
    no_cf = [r for r in records if not (r["release_id"] == "hosp-2" and r["class_id"] == "c1"
                                        and r["sensitive"]["condition"] == "Gastritis")]
    report = check_m_invariance(no_cf, broken, raw, SECRET, CFG2)
    assert not report.checks["m_uniqueness"]["passed"] and report.summary["signature_changes"] == 1


def test_counterfeit_individuals_may_repeat_a_value_within_their_records():
    m3 = MInvarianceConfig(m=3, privacy_unit="name", invariant="condition")
    names = ("Bob", "Eve", "Alice", "Charlotte", "Dave")                  # Apnea x2, Gastritis, Insomnia, Flu
    raw = [person_event(n, 1) for n in names]
    # Apnea 2 of 5 > 1/3; two counterfeit individuals with Cold (one record each): Apnea 2 of 7 <= 1/3, Cold too
    records, manifest = release("hosp-1", {"c1": raw + ["Cold", "Cold"]}, counterfeits={"c1": 2}, m=3)
    report = check_m_invariance(records, [manifest], raw, SECRET, m3)
    assert report.passed, report.format_text()
    assert report.counterfeit_lower_bound() == 1                          # 3*2 - 5
    # a manifest claiming 3 counterfeit individuals: 2 counterfeit records cannot hold them
    manifest["classes"][0]["counterfeit_individuals"] = 3
    kinds = check_m_invariance(records, [manifest], raw, SECRET, m3).checks["counterfeits"]["violations_by_kind"]
    assert "more counterfeit individuals than counterfeit records" in kinds


def test_counterfeit_lower_bound_formula():
    # the example: PAYG at 35% with m = 3 forces about 5% counterfeits
    shares = {"payg": 35, "travelcard": 27, "bus_tram_pass": 18, "freedom_pass_elderly": 10, "child": 5,
              "freedom_pass_disabled": 3, "staff": 2}
    assert counterfeit_lower_bound([shares], 3) == 5
    assert counterfeit_lower_bound([["a", "a", "b"], Counter(a=1, b=1, c=1), []], 2) == 1 + 0 + 0


def test_config_m_is_read_from_the_raw_toml():
    assert AuditConfig.from_toml(CARDS_CONFIG).m == 3
    cfg = MInvarianceConfig.from_toml(CARDS_CONFIG)
    assert (cfg.m, cfg.privacy_unit, cfg.invariant, cfg.stream) == (3, "card_id", "product_category", "oyster-cards")
    assert MInvarianceConfig.from_toml(CARDS_CONFIG, m=4).m == 4
    with pytest.raises(ValueError, match="anonymization.m"):
        MInvarianceConfig(m=1, privacy_unit="card_id", invariant="product_category")


# -- the oyster-cards stream --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cards():
    return oyster_cards.read_events()


def test_oyster_cards_stream_is_valid_persistent_and_deterministic(cards):
    assert cards == oyster_cards.read_events()                          # deterministic for a seed
    assert oyster_cards.read_events(params=oyster_cards.OysterCardsParams(seed=1)) != cards
    assert all(validate_event(e, "fare") is None for e in cards)
    assert len({e["event_id"] for e in cards}) == len(cards)
    assert all(e["event_id"].startswith("oyc-") for e in cards)
    assert [e["event_time"] for e in cards] == sorted(e["event_time"] for e in cards)
    category = defaultdict(set)
    journeys_of = defaultdict(set)
    days = defaultdict(set)
    for e in cards:
        category[e["card_id"]].add(e["product_category"])
        journeys_of[e["journey_id"]].add(e["card_id"])
        days[e["card_id"]].add(e["event_time"][:10])
    params = oyster_cards.OysterCardsParams()
    assert len(category) == params.cards
    assert all(len(c) == 1 and None not in c for c in category.values())   # one product category for ever
    assert all(len(c) == 1 for c in journeys_of.values())                   # a journey belongs to one card
    assert all(len(d) == params.days for d in days.values())                # every card comes back every day
    stats = oyster_cards.stats(cards)
    assert 2.0 <= stats["journeys_per_card_day_mean"] <= params.mean_journeys_per_card_per_day + 0.1
    assert stats["windows_per_card_min"] >= params.days                     # many releases per card
    assert stats["journeys_from_home_share"] > 0.3                          # home-station bias
    journeys_per_card = Counter(next(iter(c)) for c in journeys_of.values())
    assert min(journeys_per_card.values()) >= params.days


def test_oyster_cards_journeys_never_overlap(cards):
    spans = defaultdict(dict)
    for e in cards:
        t = datetime.fromisoformat(e["event_time"]).timestamp()
        lo, hi = spans[e["card_id"]].get(e["journey_id"], (t, t))
        spans[e["card_id"]][e["journey_id"]] = (min(lo, t), max(hi, t))
    for journeys in spans.values():
        ordered = sorted(journeys.values())
        assert all(b[0] >= a[1] + oyster_cards.MIN_GAP_S for a, b in zip(ordered, ordered[1:]))


def test_naive_per_window_kl_releases_leak_on_oyster_cards(cards):
    qis = AuditConfig.from_toml(CARDS_CONFIG).quasi_identifiers
    k, l = 10, 3
    records, manifests = naive_kl_releases(cards, k, l, secret=SECRET, quasi_identifiers=qis,
                                           sensitive_fields=["product_category"])
    by_token = {audit_token(SECRET, e["event_id"]): e for e in cards}
    units, values = defaultdict(set), defaultdict(set)
    for r in records:
        e = by_token[r["audit_token"]]
        units[(r["release_id"], r["class_id"])].add(e["card_id"])
        values[(r["release_id"], r["class_id"])].add(e["product_category"])
    # each release is k-anonymous in distinct cards and distinct-l-diverse on its own
    assert units and all(len(u) >= k for u in units.values()) and all(len(v) >= l for v in values.values())
    assert signatures(records, "product_category").keys() == units.keys()
    result = intersection_attack(records, cards, SECRET, privacy_unit="card_id", invariant="product_category")
    # measured: 243 of 2000 cards (12.2%) pinned, mean 2.22 candidates (slice, OysterCardsParams() defaults)
    assert result["targets"] == 2000 and result["true_value_missed"] == 0
    assert result["success_rate"] > 0.05 and result["min_candidates"] == 1
    assert result["mean_candidates"] < l
    report = check_m_invariance(records, manifests, cards, SECRET, MInvarianceConfig.from_toml(CARDS_CONFIG))
    assert not report.passed and report.summary["signature_changes"] > 0
    assert report.summary["counterfeit_lower_bound"] > 0

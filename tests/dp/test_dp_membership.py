"""Issue 14 item 5: membership inference (Pyrgelis et al., NDSS 2018 style likelihood-ratio test) on the
oyster-cards aggregates. Without noise the attack wins (AUC >= 0.9); against the releases of the default budget
of configs/oyster-cards.toml (epsilon 1 per card per day) it is close to guessing (AUC <= 0.55). Fixed seeds;
the DP releases go through the public release path (DPAggregator.process_window)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stream_anon.attacks.membership import auc, lr_scores, membership_game
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.dp import BudgetLedger, DPAggregator
from stream_anon.events import parse_event_time

AGGS = ("tap_ins_zone_hour", "taps_per_zone")        # the count aggregates of the default config
GROUP, TARGETS, TRIALS = 20, 8, 30


@pytest.fixture(scope="module")
def setting():
    dp = load_config("configs/oyster-cards.toml").dp
    dp = replace(dp, aggregates=tuple(s for s in dp.aggregates if s.name in AGGS))
    events = [e for e in load_events("oyster-cards") if e["event_time"] < "2009-11-10"]   # day 0 of the slice
    for e in events:
        e["_w"] = int(parse_event_time(e["event_time"]) // 900)
    label, first, _ = dp.clock.period_of(events[0]["_w"])
    lo = first + (events[0]["_w"] - first) // 4 * 4               # first hour boundary
    hi = first + ((events[-1]["_w"] - first) // 4 + 1) * 4         # end of the last hour (exclusive)
    n_rel = (hi - lo) // 4
    layout, offset = {}, 0                                          # (aggregate, key) -> column block
    for s in dp.aggregates:
        layout[s.name] = (offset, {k: i for i, k in enumerate(s.domain)})
        offset += n_rel * len(s.domain)
    cards = sorted({e["card_id"] for e in events})
    index = {c: i for i, c in enumerate(cards)}
    by_card: dict[str, list] = {c: [] for c in cards}
    for e in events:
        by_card[e["card_id"]].append(e)
    # each card's bounded contribution per cell (W windows per aggregate, C events per window), as the adversary
    # who knows the target's taps computes it
    vec = np.zeros((len(cards), offset))
    for s in dp.aggregates:
        base, keys = layout[s.name]
        for c, evs in by_card.items():
            evs = [e for e in evs if all(e.get(f) in allowed for f, allowed in s.where)]
            flat_keys = list(zip(*(g.keys_of(evs) for g in s.group_by)))
            windows, per = [], {}
            for e, key in zip(evs, flat_keys):
                if None in key:
                    continue
                w = e["_w"]
                if w not in windows:
                    if len(windows) == s.max_windows:
                        continue
                    windows.append(w)
                if per.get(w, 0) == s.max_contributions:
                    continue
                per[w] = per.get(w, 0) + 1
                vec[index[c], base + (w - lo) // 4 * len(keys) + keys[key]] += 1
    return dp, events, by_card, cards, vec, lo, hi, layout


def _dp_release(setting, seed):
    dp, _, by_card, cards, vec, lo, hi, layout = setting

    def release(members):
        evs = sorted((e for m in members for e in by_card[cards[m]]), key=lambda e: e["event_time"])
        agg = DPAggregator(dp, BudgetLedger(None, dp.epsilon_budget), seed=f"{seed}-{members[-1]}-{members[0]}")
        by_w: dict[int, list] = {}
        for e in evs:
            by_w.setdefault(e["_w"], []).append(e)
        y, t2 = np.zeros(vec.shape[1]), np.zeros(vec.shape[1])
        for w in range(lo, hi):
            for r in agg.process_window(w, by_w.get(w, [])):
                if r["type"] != "aggregate" or r["output"] != "per_window":
                    continue
                base, keys = layout[r["aggregate"]]
                col = base + (r["span_start_window"] - lo) // 4 * len(keys) + keys[tuple(r["group"].values())]
                y[col], t2[col] = r["value"], r["noise_std"] ** 2
        return y, t2
    return release


def test_auc_helper_and_lr_score():
    assert auc([3, 4, 5], [0, 1, 2]) == 1.0 and auc([1, 2], [1, 2]) == 0.5
    s = lr_scores([[2.0, 0.0], [1.0, 0.0]], target=[1.0, 0.0], mean_out=[1.0, 0.0], var_out=[1.0, 1.0])
    assert s[0] > s[1]


def test_release_path_computes_the_adversary_cell_layout(setting):
    """The noise-free model the attack uses is what the aggregator releases (epsilon huge: noise ~ 0)."""
    dp = replace(setting[0], aggregates=tuple(replace(s, epsilon=1e6) for s in setting[0].aggregates),
                 epsilon_budget=3e6)
    members = np.arange(0, len(setting[3]), 7)
    y, _ = _dp_release((dp,) + setting[1:], seed=0)(members)
    assert np.abs(y - setting[4][members].sum(0)).max() < 0.5 and y.sum() > 100


def test_membership_auc_high_without_noise_and_near_half_at_the_default_budget(setting):
    dp, _, _, cards, vec, *_ = setting
    active = np.flatnonzero(vec.sum(1) >= 3)
    rng = np.random.default_rng(14)
    targets = rng.choice(active, TARGETS, replace=False)
    clear = membership_game(vec, targets, GROUP, TRIALS, lambda m: vec[m].sum(0), np.random.default_rng(1))
    noisy = membership_game(vec, targets, GROUP, TRIALS, _dp_release(setting, seed=2), np.random.default_rng(1))
    print(f"membership AUC: no noise {clear['auc']:.3f}, default budget {noisy['auc']:.3f} "
          f"({noisy['games']} games, group {GROUP}, {len(cards)} cards)")
    assert clear["auc"] >= 0.9
    assert noisy["auc"] <= 0.55

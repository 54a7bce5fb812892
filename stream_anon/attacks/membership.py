"""Membership inference on released aggregates: does a given unit (a card) appear in the group behind a
release? A likelihood-ratio test in the style of Pyrgelis, Troncoso & De Cristofaro, *Knock Knock, Who's
There? Membership Inference on Aggregate Location Data*, NDSS 2018 (prior knowledge: the target's own
locations and the distribution of aggregates of groups without it).

Pure numpy; it imports nothing from :mod:`stream_anon.dp`: the release under attack is a callable.

Model. A release is a vector over cells (e.g. (hour, zone) counts of a day). The adversary knows the target's
contribution ``v`` (its own counts per cell), and, from reference groups without the target (past releases of
similar groups: the "prior knowledge" of the paper), the mean ``mu`` and variance ``s2`` per cell of the aggregate
without it; the release states its noise variance ``t2`` (published on every row). Under a Gaussian model of
each cell, the log-likelihood ratio of "in" (mean ``mu + v``) against "out" (mean ``mu``) is

    score(y) = sum_c [ v_c (y_c - mu_c) - v_c^2 / 2 ] / max(s2_c + t2_c, floor)

(Neyman-Pearson: thresholding it is the most powerful test under that model). The attack's success is the
ROC AUC over games: half with the target in the group, half with another unit in its place.

>>> rng = np.random.default_rng(0)
>>> cards = rng.poisson(0.05, size=(400, 60)).astype(float)
>>> res = membership_game(cards, targets=[int(np.argmax(cards.sum(1)))], group_size=20, trials=100,
...                       release=lambda members: cards[members].sum(0), rng=rng)
>>> res["auc"] > 0.9
True
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def lr_scores(observed, target, mean_out, var_out, noise_var=0.0, floor: float = 0.25) -> np.ndarray:
    """Log-likelihood-ratio scores of releases ``observed`` (trials x cells, or one vector) for a target with
    contribution ``target`` (cells), given the out-of-group mean and variance per cell and the noise variance."""
    y = np.atleast_2d(np.asarray(observed, dtype=float))
    v = np.asarray(target, dtype=float)
    var = np.maximum(np.asarray(var_out, dtype=float) + np.asarray(noise_var, dtype=float), floor)
    return ((y - np.asarray(mean_out, dtype=float)) * v - v * v / 2) @ (1.0 / var) if y.size else np.zeros(0)


def auc(scores_in, scores_out) -> float:
    """ROC AUC: P(score of a member game > score of a non-member game), ties counted one half
    (Mann-Whitney U / (n_in n_out))."""
    a, b = np.asarray(scores_in, dtype=float), np.asarray(scores_out, dtype=float)
    if not len(a) or not len(b):
        raise ValueError("auc: needs scores of both classes")
    allv = np.concatenate([a, b])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    sorted_v = allv[order]
    # average ranks of ties
    _, first, counts = np.unique(sorted_v, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, counts)
    u = ranks[:len(a)].sum() - len(a) * (len(a) + 1) / 2
    return float(u / (len(a) * len(b)))


def membership_game(cards: np.ndarray, targets: Sequence[int] | np.ndarray, group_size: int, trials: int,
                    release: Callable[[np.ndarray], np.ndarray | tuple], rng: np.random.Generator,
                    reference_groups: int = 200) -> dict:
    """Play the distinguishing game for each target; returns the AUC over all games and per target.

    ``cards``: units x cells, each unit's own (bounded) contribution, known to the adversary for the target.
    For each target and trial, a group of ``group_size - 1`` other units is drawn, plus the target ("in") or
    one more other unit ("out"); ``release(members)`` returns the released vector, or ``(vector,
    noise_variance)``. The adversary's prior (mean and variance per cell without the target) comes from
    ``reference_groups`` noise-free aggregates of random groups of ``group_size`` other units.
    """
    cards = np.asarray(cards, dtype=float)
    n = len(cards)
    if not 1 < group_size < n:
        raise ValueError(f"group_size: must be in (1, {n}), got {group_size!r}")
    all_in, all_out, per_target = [], [], {}
    for t in targets:
        others = np.delete(np.arange(n), t)
        ref = np.array([cards[rng.choice(others, group_size, replace=False)].sum(0)
                        for _ in range(reference_groups)])
        mu, s2 = ref.mean(0), ref.var(0)
        s_in: list[float] = []
        s_out: list[float] = []
        for _ in range(trials):
            base = rng.choice(others, group_size, replace=False)
            for member, bucket in ((t, s_in), (base[-1], s_out)):
                members = np.append(base[:-1], member)
                out = release(members)
                y, t2 = out if isinstance(out, tuple) else (out, 0.0)
                bucket.append(float(lr_scores(y, cards[t], mu, s2, t2)[0]))
        per_target[int(t)] = auc(s_in, s_out)
        all_in += s_in
        all_out += s_out
    return {"auc": auc(all_in, all_out), "auc_per_target": per_target, "games": len(all_in) + len(all_out),
            "group_size": group_size, "targets": len(per_target)}

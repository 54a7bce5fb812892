"""k-anonymous release formation: a pluggable strategy groups the window's records into classes, the former
re-checks k in distinct individuals and the loss limit, and due leftovers go into a randomly chosen earlier
class that covers them (CASTLE, Cao et al., ICDE 2008)."""
from __future__ import annotations

import numpy as np

from stream_anon.formers.base import Counterfeits, NewClass, Plan, WindowView, distinct_per_group


class KAnonymousFormer:
    """Classes of at least ``k`` distinct individuals, formed by ``strategy`` (``stream_anon.strategies``).

    ``reuse``: ``"deadline"`` (due leftovers go into a covering earlier class), ``"immediate"`` (every buffered
    record covered by an earlier class goes there at the next close) or ``"never"``.
    """

    shuffle_records = False
    registry_tags = False
    m = None                      # not an m-invariant former

    def __init__(self, strategy, k: int, max_class_ncp: float, reuse: str, sensitive_fields: tuple[str, ...]):
        self.strategy, self.k, self.max_class_ncp = strategy, int(k), float(max_class_ncp)
        self.reuse_policy, self.sensitive_fields = reuse, tuple(sensitive_fields)

    def form(self, view: WindowView) -> Plan:
        n = len(view)
        plan = Plan(loss_rejected=np.zeros(n, dtype=bool))
        assigned = np.zeros(n, dtype=bool)
        if self.reuse_policy == "immediate":
            self._reuse_into(view, np.arange(n), plan.reused, assigned)
        pending = np.flatnonzero(~assigned)
        if len(pending) == 0:
            return plan
        extra = {}
        if self.strategy.uses_sensitive:
            # strategies with a diversity or severity rule (seeds 002, 003) see the sensitive columns too
            extra["sensitive"] = {f: [view.sensitive[i][j] for i in pending]
                                  for j, f in enumerate(self.sensitive_fields)}
        raw = self.strategy.form_classes(view.X[pending], view.units[pending], self.k, view.space, view.rng,
                                         **extra)
        locs = [np.asarray(local, dtype=np.int64) for local in raw]
        if not locs:
            return plan
        sizes = np.array([len(lc) for lc in locs])
        flat = np.concatenate(locs)
        if (sizes == 0).any() or len(np.unique(flat)) != len(flat):
            raise RuntimeError(f"strategy {self.strategy.name!r} returned overlapping or empty classes")
        rows_all = pending[flat]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        # enforcement, independent of the strategy: k distinct individuals (all classes at once)
        n_ind = distinct_per_group(view.units[rows_all], sizes)
        # information loss of each class's snapped box (all classes at once; same boxes as one by one)
        Xc = view.X[rows_all]
        lo, hi, _ = view.space.snap(np.minimum.reduceat(Xc, starts, axis=0), np.maximum.reduceat(Xc, starts, axis=0))
        ncp = view.space.ncp(lo, hi)
        for j, lc in enumerate(locs):
            if n_ind[j] < self.k:
                continue
            rows = pending[lc]
            if ncp[j] > self.max_class_ncp:
                plan.loss_rejected[rows] = True
                continue
            plan.new_classes.append(NewClass(rows))
        return plan

    def reuse(self, view: WindowView, rows: np.ndarray, plan: Plan) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self.reuse_policy != "never":
            self._reuse_into(view, rows, out, np.zeros(len(view), dtype=bool))
        return out

    @staticmethod
    def _reuse_into(view: WindowView, rows: np.ndarray, out: dict, assigned: np.ndarray) -> None:
        if len(rows) == 0 or len(view.registry) == 0:
            return
        choice = view.registry.choose_random(view.X[rows], view.rng)
        for r, c in zip(rows.tolist(), choice.tolist()):
            if c >= 0:
                out.setdefault(c, []).append(r)
                assigned[r] = True

    def complete(self, view: WindowView, groups: list, published_rows: list[int]) -> list[Counterfeits | None]:
        return [None] * len(groups)

    def expire(self, now: float) -> None:
        pass

    def state_core(self) -> dict:
        return {}

    def state_tables(self) -> dict:
        return {}

    def load_state(self, core: dict, tables: dict) -> None:
        if core or tables:
            raise ValueError("the k-anonymous former keeps no state, but the checkpoint holds some")

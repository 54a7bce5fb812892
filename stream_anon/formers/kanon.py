"""k-anonymous release formation: a pluggable strategy groups the window's records into classes, the former checks
k in distinct individuals, every configured criterion (``[[anonymization.criteria]]``, :mod:`stream_anon.criteria`)
and the loss limit itself, and due leftovers go into a randomly chosen earlier class that covers them (CASTLE, Cao
et al., ICDE 2008).

Enforcement is independent of the strategy, so a faulty strategy costs utility, never privacy:

1. a class of fewer than k individuals is not published (its records wait; when due they are reused or suppressed
   as ``fewer_than_k_individuals_by_deadline``);
2. a class of k individuals failing a criterion is **merged** with the class whose merged box loses least (a proxy
   of NCP: the weighted widths of the union box), until it holds or no other class is left; a merged class holds
   every criterion before it is published (each is re-checked);
3. a class still failing publishes nothing: its records wait while not due, and a due one goes into an earlier class
   when reuse is allowed (below), else is suppressed with the failing criterion's reason (e.g.
   ``distinct_l_diversity_not_met:fare_product``);
4. a class above ``max_class_ncp`` is refused for its loss (``class_loss_above_limit`` when due).

Reuse of earlier classes (deadline leftovers, ``reuse = "immediate"``, late records under ``next_release``) adds
records to a class that held every criterion when it was published, inside its box. For a monotone criterion (k,
distinct l-diversity, the loss limit: adding records inside the box removes no individual, no value and does not
widen the box) the class still holds it, over all its releases. Entropy and frequency l-diversity and the severity
rule are not monotone (records of a frequent or severe value can break them), and the registry keeps no sensitive
values to re-check a class with: with any of them configured, no record is reused (due leftovers are suppressed).
"""
from __future__ import annotations

import numpy as np

from stream_anon.criteria import Classes, Column, Criterion, KIndividuals, MaxClassNCP
from stream_anon.formers.base import Counterfeits, NewClass, Plan, WindowView


class KAnonymousFormer:
    """Classes of at least ``k`` distinct individuals, formed by ``strategy`` (``stream_anon.strategies``), that meet
    every one of ``criteria`` (``stream_anon.criteria``; module docstring).

    ``reuse``: ``"deadline"`` (due leftovers go into a covering earlier class), ``"immediate"`` (every buffered
    record covered by an earlier class goes there at the next close) or ``"never"``.
    """

    shuffle_records = False
    registry_tags = False
    m = None                      # not an m-invariant former

    def __init__(self, strategy, k: int, max_class_ncp: float, reuse: str, sensitive_fields: tuple[str, ...],
                 criteria: tuple = ()):
        self.strategy, self.k, self.max_class_ncp = strategy, int(k), float(max_class_ncp)
        self.reuse_policy, self.sensitive_fields = reuse, tuple(sensitive_fields)
        self.criteria = tuple(criteria)
        unknown = sorted({f for c in self.criteria for f in c.fields} - set(self.sensitive_fields))
        if unknown:
            raise ValueError(f"criteria read fields that are not sensitive fields: {unknown}")
        self.k_rule, self.loss_rule = KIndividuals(self.k), MaxClassNCP(self.max_class_ncp)
        # reuse adds records to a published class, which only a monotone criterion survives unchecked
        self.reuses = reuse != "never" and all(c.monotone for c in self.criteria)

    def form(self, view: WindowView) -> Plan:
        n = len(view)
        loss_rejected = np.zeros(n, dtype=bool)
        plan = Plan(loss_rejected=loss_rejected)
        assigned = np.zeros(n, dtype=bool)
        if self.reuse_policy == "immediate" and self.reuses:
            self._reuse_into(view, np.arange(n), plan.reused, assigned)
        pending = np.flatnonzero(~assigned)
        if len(pending) == 0:
            return plan
        extra: dict[str, object] = {}
        if self.strategy.uses_sensitive:
            # strategies with a diversity or severity rule (seeds 002, 003) see the sensitive columns too
            extra["sensitive"] = {f: [view.sensitive[i][j] for i in pending]
                                  for j, f in enumerate(self.sensitive_fields)}
        if getattr(self.strategy, "uses_due", False):
            extra["due"] = view.due[pending]     # h3-mondrian lets records that are not due wait for a finer cell
        raw = self.strategy.form_classes(view.X[pending], view.units[pending], self.k, view.space, view.rng,
                                         **extra)
        locs = [np.asarray(local, dtype=np.int64) for local in raw]
        if not locs:
            return plan
        sizes = np.array([len(lc) for lc in locs])
        flat = np.concatenate(locs)
        if (sizes == 0).any() or len(np.unique(flat)) != len(flat):
            raise RuntimeError(f"strategy {self.strategy.name!r} returned overlapping or empty classes")
        # enforcement, independent of the strategy: k distinct individuals (all classes at once)
        k_ok = self.k_rule.holds(Classes(sizes, view.units[pending[flat]]))
        groups = [pending[lc] for lc, ok in zip(locs, k_ok) if ok]
        failed: list[tuple[np.ndarray, Criterion]] = []
        if self.criteria and groups:
            groups, failed = self._repair(view, groups)
        for rows, ok in zip(groups, self._within_loss(view, groups)):
            if ok:
                plan.new_classes.append(NewClass(rows))
            else:
                loss_rejected[rows] = True
        for rows, criterion in failed:
            self._give_up(view, rows[view.due[rows]], criterion.reason, plan)
        return plan

    def _within_loss(self, view: WindowView, groups: list[np.ndarray]) -> np.ndarray:
        """The loss limit of every class's snapped box (all classes at once; same boxes as one by one)."""
        if not groups or not self.loss_rule.binding:
            return np.full(len(groups), True)
        sizes = np.array([len(g) for g in groups])
        Xc = view.X[np.concatenate(groups)]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        lo, hi, labels = view.space.snap(np.minimum.reduceat(Xc, starts, axis=0),
                                         np.maximum.reduceat(Xc, starts, axis=0))
        return self.loss_rule.holds(Classes(sizes, np.empty(0), ncp=view.space.ncp(lo, hi, labels)))

    def _columns(self, view: WindowView) -> dict[str, Column]:
        index = {f: j for j, f in enumerate(self.sensitive_fields)}
        return {f: Column.encode([s[index[f]] for s in view.sensitive])
                for f in dict.fromkeys(f for c in self.criteria for f in c.fields)}

    def _first_failure(self, classes: Classes) -> np.ndarray:
        """Per class, the index in ``criteria`` of the first criterion it fails, or -1."""
        out = np.full(len(classes), -1)
        for i, criterion in reversed(list(enumerate(self.criteria))):
            out[~criterion.holds(classes)] = i
        return out

    def _repair(self, view: WindowView, groups: list[np.ndarray]
                ) -> tuple[list[np.ndarray], list[tuple[np.ndarray, Criterion]]]:
        """Merge every class failing a criterion with its cheapest partner until it holds (module docstring, step
        2). Returns the classes that hold every criterion (in the order of their first class) and ``(rows,
        criterion)`` of those that still fail."""
        columns = self._columns(view)
        fail = self._first_failure(Classes.of(groups, view.units, columns))
        if (fail < 0).all():
            return groups, []
        groups = list(groups)
        lo = np.array([view.X[g].min(axis=0) for g in groups])
        hi = np.array([view.X[g].max(axis=0) for g in groups])
        alive = np.ones(len(groups), dtype=bool)
        width, weight = view.space.width, view.space.weight
        queue = np.flatnonzero(fail >= 0).tolist()
        while queue:
            f = queue.pop(0)
            alive[f] = False
            others = np.flatnonzero(alive)
            if len(others) == 0:
                alive[f] = True
                break
            cost = np.minimum((np.maximum(hi[others], hi[f]) - np.minimum(lo[others], lo[f])) / width, 1.0) @ weight
            g = int(others[np.argmin(cost)])
            groups[g] = np.concatenate([groups[g], groups[f]])
            lo[g], hi[g] = np.minimum(lo[g], lo[f]), np.maximum(hi[g], hi[f])
            was_failing = fail[g] >= 0
            fail[g] = self._first_failure(Classes.of([groups[g]], view.units, columns))[0]
            if fail[g] >= 0 and not was_failing:
                queue.append(g)
            elif fail[g] < 0 and was_failing:
                queue.remove(g)
        kept = [groups[j] for j in np.flatnonzero(alive & (fail < 0))]
        failed = [(groups[j], self.criteria[fail[j]]) for j in np.flatnonzero(alive & (fail >= 0))]
        return kept, failed

    def _give_up(self, view: WindowView, rows: np.ndarray, reason: str, plan: Plan) -> None:
        """Due rows of a class no merge could repair: an earlier class when reuse is allowed, else suppressed with
        the criterion's reason (the engine would otherwise name k)."""
        if len(rows) == 0:
            return
        taken = np.zeros(len(view), dtype=bool)
        if self.reuses:
            self._reuse_into(view, rows, plan.reused, taken)
        left = rows[~taken[rows]]
        if len(left):
            plan.suppressed.setdefault(reason, []).extend(left.tolist())

    def reuse(self, view: WindowView, rows: np.ndarray, plan: Plan) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self.reuses:
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

"""A close's decisions: every record of the close placed in a new class or an earlier published class, suppressed
with its reason, or left waiting (the engine's window core hands them to :func:`..assemble.assemble_release`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_anon.formers.base import (SUPPRESSED_END, SUPPRESSED_LOSS, SUPPRESSED_NO_CLASS, SUPPRESSED_THIN_REUSE,
                                  Former, Plan, WindowView, thin_reuse_entries)

LATE = "late"      # suppression reason of a late event (an event for a window already released)


@dataclass
class CloseDecisions:
    plan: Plan                          # the former's new classes
    reused: dict[int, list[int]]        # registry index -> rows published in that earlier class
    suppressed: dict[str, list[int]]    # reason -> rows
    placed: np.ndarray                  # (rows,) in a new or an earlier class
    resolved: np.ndarray                # (rows,) suppressed


def decide_close(former: Former, registry, view: WindowView, work, nf: int, nl: int, in_view: int,
             late_policy: str, k: int) -> CloseDecisions:
    """Decide the rows of ``work`` (the close's records: ``nf`` of the closing windows, then ``nl`` late ones, the
    first ``in_view`` of which the former sees as due records) over ``view`` (the rows the former forms from)."""
    nv = nf + in_view
    plan = former.form(view)
    placed = np.zeros(len(work), dtype=bool)
    for nc in plan.new_classes:
        placed[nc.rows] = True
    reused = registry.exact_cover(plan.reused, work.X)
    for rows in reused.values():
        placed[rows] = True
    suppressed_rows = {reason: list(rows) for reason, rows in plan.suppressed.items()}
    resolved = np.zeros(len(work), dtype=bool)
    for rows in suppressed_rows.values():
        resolved[rows] = True
    # due leftovers: an earlier class chosen by the former, else suppressed
    leftovers = np.flatnonzero(view.due & ~placed[:nv] & ~resolved[:nv])
    for c, rows in registry.exact_cover(former.reuse(view, leftovers, plan), work.X).items():
        reused.setdefault(c, []).extend(rows)
        placed[rows] = True
    loss = plan.loss_rejected
    for i in np.flatnonzero(view.due & ~placed[:nv] & ~resolved[:nv]).tolist():
        reason = LATE if i >= nf else SUPPRESSED_LOSS if loss is not None and loss[i] else (
            SUPPRESSED_END if view.final else SUPPRESSED_NO_CLASS)
        suppressed_rows.setdefault(reason, []).append(i)
        resolved[i] = True
    if nl > in_view:
        # late records: never in a new class; a random earlier class covering them, or suppressed as late
        late_rows = np.arange(nf, nf + nl)
        if late_policy == "next_release":
            late_view = WindowView(work.X, work.units, work.times, work.sensitive, np.ones(len(work), bool),
                                   view.final, view.window_end, view.space, view.rng, registry)
            for c, rows in registry.exact_cover(former.reuse(late_view, late_rows, Plan()), work.X).items():
                reused.setdefault(c, []).extend(rows)
                placed[rows] = True
        for i in late_rows[~placed[late_rows]].tolist():
            suppressed_rows.setdefault(LATE, []).append(i)
            resolved[i] = True
    # a reused class's additions of fewer than k individuals: suppressed when due or late, else they wait
    thin = thin_reuse_entries(reused, work.units, k)
    placed[thin] = False
    must = thin >= nf                                       # late rows
    must[~must] = view.due[thin[~must]]
    if must.any():
        suppressed_rows.setdefault(SUPPRESSED_THIN_REUSE, []).extend(thin[must].tolist())
        resolved[thin[must]] = True
    return CloseDecisions(plan, reused, suppressed_rows, placed, resolved)

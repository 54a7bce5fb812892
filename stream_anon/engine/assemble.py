"""A release assembled from a close's decisions: the classes (new ones snapped and registered, reused ones as
published), the former's counterfeits, the records in release order and the manifest's figures."""
from __future__ import annotations

import numpy as np

from stream_anon.engine.release import ClassInfo, Release
from stream_anon.criteria.base import distinct_per_group
from stream_anon.formers.base import NewClass, WindowView


def assemble_release(engine, buf, view: WindowView, release_id: str, window_start: float,
                     new_classes: list[NewClass], reused: dict[int, list[int]], suppressed_rows: dict[str, list[int]],
                     deferred_tokens: list[str], late: int) -> Release:
    """The release of ``engine``'s close over the rows of ``buf`` (the close's work rows): new classes are
    snapped, described and registered for reuse; ``reused``: registry index -> rows; the former completes every
    class (counterfeits, signatures) before the records are put in release order."""
    reg, former, space = engine.registry, engine.former, engine.space
    groups = []     # (class id, generalization, ncp, reused, tag, rows) in release order
    if new_classes:
        sizes = np.array([len(nc.rows) for nc in new_classes])
        Xc = buf.X[np.concatenate([nc.rows for nc in new_classes])]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        lo, hi = np.minimum.reduceat(Xc, starts, axis=0), np.maximum.reduceat(Xc, starts, axis=0)
        lo, hi, labels = space.snap(lo, hi, (Xc, starts) if space.h3_qis else None)
        ncp = space.ncp(lo, hi, labels)
        for j, nc in enumerate(new_classes):
            groups.append((f"{release_id}-c{j:04d}", space.describe(lo[j], hi[j], labels[j]),
                           float(ncp[j]), False, nc.tag, nc.rows))
        reg.register(lo, hi, [g[0] for g in groups], [g[1] for g in groups], ncp, view.window_end,
                     [nc.tag for nc in new_classes] if former.registry_tags else None)
    for c, reused_rows in sorted(reused.items()):
        groups.append((reg.ids[c], reg.gen[c], float(reg.ncp[c]), True, int(reg.tag[c]),
                       np.array(reused_rows, dtype=np.int64)))
    published_rows = [r for nc in new_classes for r in nc.rows.tolist()] + \
                     [r for reused_rows in reused.values() for r in reused_rows]
    extras = former.complete(view, [(g[0], g[5], g[4]) for g in groups], published_rows)
    classes: list[ClassInfo] = []
    rec_class, rec_sens, rec_tok, rec_ncp, rec_cf = [], [], [], [], []
    own_sizes: tuple = ()
    if groups:
        units = buf.units[np.concatenate([g[5] for g in groups])]
        lens = np.array([len(g[5]) for g in groups])
        n_reals = distinct_per_group(units, lens).tolist()
        # each individual's smallest class here; a reused class holds at least k (its creation) besides these
        bound = np.array([max(engine.k, n) if g[3] else n for g, n in zip(groups, n_reals)], dtype=np.int64)
        distinct, which = np.unique(units, return_inverse=True)
        smallest = np.full(len(distinct), np.iinfo(np.int64).max)
        np.minimum.at(smallest, which, np.repeat(bound, lens))
        own_sizes = tuple(zip(*(a.tolist() for a in np.unique(smallest, return_counts=True))))
    for ci, ((cid, gen, ncp_c, is_reused, _, rows), extra) in enumerate(zip(groups, extras)):
        rl = rows.tolist()
        rec_class += [ci] * len(rl)
        rec_sens += [buf.sensitive[r] for r in rl]
        rec_tok += [buf.tokens[r] for r in rl]
        rec_ncp += [ncp_c] * len(rl)
        rec_cf += [False] * len(rl)
        n_cf_ind, n_cf_rec = 0, 0
        if extra is not None:
            n_cf_ind, n_cf_rec = extra.individuals, len(extra.sensitive)
            rec_class += [ci] * n_cf_rec
            rec_sens += extra.sensitive
            rec_tok += engine.counterfeit_tokens(release_id, cid, n_cf_rec)
            rec_ncp += [ncp_c] * n_cf_rec
            rec_cf += [True] * n_cf_rec
        classes.append(ClassInfo(cid, gen, n_reals[ci], len(rl) + n_cf_rec, ncp_c, is_reused,
                                 counterfeit_individuals=n_cf_ind, counterfeit_records=n_cf_rec))
    m = former.m
    order = view.rng.permutation(len(rec_tok)) if former.shuffle_records else np.arange(len(rec_tok))
    config = engine.config
    return Release(
        release_id=release_id, stream=config.stream.name, partition=engine.partition, seq=engine.seq,
        window_start=window_start, window_end=view.window_end,
        # the largest event time of the records the release closed over: with time-ordered input the
        # watermark at the close, and independent of the arrival order within the allowed lateness
        watermark=float(view.times.max()) if len(view) else engine.watermark, k=engine.k,
        classes=classes,
        record_class=np.array(rec_class, dtype=np.int64)[order] if rec_tok else np.empty(0, dtype=np.int64),
        record_sensitive=[rec_sens[i] for i in order],
        record_token=[rec_tok[i] for i in order],
        record_ncp=np.array(rec_ncp, dtype=float)[order] if rec_tok else np.empty(0),
        sensitive_fields=config.sensitive,
        suppressed_tokens={reason: [buf.tokens[i] for i in rows] for reason, rows in suppressed_rows.items()},
        deferred_tokens=deferred_tokens,
        max_suppression_ratio=config.anonymization.max_suppression_ratio,
        record_counterfeit=(np.array(rec_cf, dtype=bool)[order] if rec_tok else np.empty(0, dtype=bool))
        if m is not None else None,
        m=m, kid=engine.kid, late=late, lineage=engine.lineage, own_class_sizes=own_sizes,
    )

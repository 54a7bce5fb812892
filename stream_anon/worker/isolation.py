"""Failure isolation: a partition batch that raised as a whole is cut down to the events that fail alone, which are
dead-lettered; the others give what they give without them (a worker's output does not depend on how input is
cut into batches). One event never stops a partition (docs/operations.md, Faults)."""
from __future__ import annotations

import logging
from collections.abc import Sequence

from stream_anon.worker import state as st

log = logging.getLogger("stream_anon.worker")

TRIES = 2              # attempts of a single event before it is dead-lettered as a processing error
MAX_FAILURES = 64      # failed attempts per batch; beyond, a failing part is dead-lettered whole


def isolate(core, ps, events: Sequence, offsets: list, out, first: Exception) -> None:
    """``core`` (a :class:`~stream_anon.worker.core.WorkerCore`): the batch failed as a whole: go back to the state before it (the last committed state,
    ``ps.chain``) and split the batch in halves, processed in order, each part from a snapshot of the state before
    it, until the events that fail alone are found (``TRIES`` attempts each); those are
    dead-lettered with ``processing error: <exception class>``. Output does not depend on how input is cut
    into batches, so the other events give what they give without the culprits. After
    ``MAX_FAILURES`` failed attempts a part that fails is dead-lettered whole (bounded work)."""
    log.error("partition %s: batch of %d events failed (%s); isolating the culprit(s)", ps.partition,
              len(events), type(first).__name__)
    out.pending.clear()
    core.restore(ps, *ps.committed_state())
    waited, ps.wait_for_aggregates = ps.wait_for_aggregates, True     # a part's failure must show in its attempt
    try:
        _isolate_parts(core, ps, events, offsets, out)
    finally:
        ps.wait_for_aggregates = waited

def _isolate_parts(core, ps, events: Sequence, offsets: list, out) -> None:
    failures, isolated = 1, 0

    def run(idx: list[int], tries: int = 0) -> None:
        nonlocal failures, isolated
        snap, mark = ps.snapshot(core.stream, core.topic), len(out.messages)
        counts = dict(out.counts)
        try:
            core.attempt(ps, events, offsets, idx, out)
            return
        except Exception as exc:   # noqa: BLE001
            failures += 1
            del out.messages[mark:]
            out.counts.update(counts)
            core.restore(ps, *st.resolve_chain([snap.as_written()]))
            if failures > MAX_FAILURES:
                for i in idx:
                    core.deadletter(out, f"processing error: {type(exc).__name__} (isolation gave up after "
                                          f"{failures} failed attempts)", ps.partition, offsets[i],
                                     event=events[i])
            elif len(idx) > 1:
                mid = len(idx) // 2
                run(idx[:mid])
                run(idx[mid:])
            elif tries + 1 < TRIES:
                run(idx, tries + 1)
            else:
                isolated += 1
                core.deadletter(out, f"processing error: {type(exc).__name__}", ps.partition, offsets[idx[0]],
                                 event=events[idx[0]])

    run(list(range(len(events))))
    log.error("partition %s: %d event(s) dead-lettered as processing errors after %d failed attempts",
              ps.partition, isolated, failures)

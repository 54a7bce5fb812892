"""Why a run published little: the dominant suppression reason and the setting to change, for the verdict of a
run that publishes nothing or suppresses over its limit (:func:`stream_anon.audit.run.judge`) and the health lines.

Reasons are the engine's (docs/privacy.md, Deferral and suppression); a criterion's reason is its kind, a colon
and the field (``distinct_l_diversity_not_met:fare_product``).

>>> dominant_cause({"late": 90, "fewer_than_k_individuals_by_deadline": 10})[:75]
'mostly late (90 of 100 suppressed): events arrived for a window already rel'
>>> dominant_cause({}) is None
True
"""
from __future__ import annotations

LATE = "late"
ADVICE = {
    LATE: "events arrived for a window already released: input out of event-time order (e.g. a file replayed "
          "unsorted) or later than [stream] allowed_lateness_s; sort the input by event time or raise "
          "allowed_lateness_s (`stream-anon calibrate --suggest` measures the share arriving late)",
    "fewer_than_k_individuals_by_deadline": "classes of k distinct individuals did not form by the deadline: "
          "lengthen anonymization.window_s and max_delay_s, lower anonymization.k, or read the input on fewer "
          "partitions (`stream-anon calibrate --suggest` proposes a window)",
    "reused_class_fewer_than_k_new_individuals": "late or due records too few to add k individuals to an earlier "
          "class in one release: raise [stream] allowed_lateness_s so they join their own window, or lengthen "
          "anonymization.window_s and max_delay_s",
    "class_loss_above_limit": "classes lost more than anonymization.max_class_ncp: raise it, or lengthen the "
          "windows so classes form from nearer records",
    "end_of_stream": "records still waiting when the stream was flushed at its end: expected for a short replay; "
          "else lower anonymization.max_delay_s",
    "invariant_value_changed": "individuals whose m-invariant value changed while their signature was bound: "
          "check [sensitive] invariant is a value an individual keeps",
}


def advice_for(reason: str) -> str:
    if reason in ADVICE:
        return ADVICE[reason]
    if ":" in reason:                            # a configured criterion's reason
        kind, _, field = reason.partition(":")
        return (f"classes failing the criterion {kind.replace('_not_met', '')} on {field} by their deadline: "
                "relax it in [[anonymization.criteria]] or lengthen the windows")
    return "see docs/privacy.md, Deferral and suppression"


def dominant_cause(by_reason: dict | None) -> str | None:
    """``mostly <reason> (n of N suppressed): <what to change>`` for the largest reason; None when nothing was
    suppressed."""
    by_reason = {r: n for r, n in (by_reason or {}).items() if n}
    if not by_reason:
        return None
    reason = max(sorted(by_reason), key=lambda r: by_reason[r])
    return (f"mostly {reason} ({by_reason[reason]} of {sum(by_reason.values())} suppressed): "
            f"{advice_for(reason)}")


def k_out_of_reach(summary: dict) -> str | None:
    """What to change when k is more than the individuals of any window (``summary["window_individuals"]``:
    :func:`.measures.window_individuals`): no class could form, whatever the other settings; None otherwise.

    >>> k_out_of_reach({"k": 400, "window_individuals": {"window_s": 900.0, "individuals": 97}})[:80]
    'k = 400 is more than the distinct individuals of any window (at most 97 in one w'
    >>> k_out_of_reach({"k": 10, "window_individuals": {"window_s": 900.0, "individuals": 97}}) is None
    True
    """
    w = summary.get("window_individuals") or {}
    k, n = summary.get("k"), w.get("individuals")
    if k is None or n is None or n >= k:
        return None
    return (f"k = {k} is more than the distinct individuals of any window (at most {n} in one window of "
            f"{w['window_s']:.0f} s of one input partition): no class of k can form; lower anonymization.k to at "
            f"most {n}, or lengthen anonymization.window_s and max_delay_s until a window holds k individuals, or "
            "read the input on fewer partitions (`stream-anon calibrate --suggest` proposes a window)")


def nothing_published_cause(summary: dict) -> str:
    """Why a run published nothing: no input read, every event dead-lettered or still waiting, or the dominant
    suppression reason."""
    if not summary.get("events_in"):
        return "no event read from the input topic: nothing has been produced to it"
    waiting = (summary.get("deferred") or 0) + (summary.get("open") or 0)
    suppressed = summary.get("suppressed") or 0
    dead = summary.get("dead_lettered") or 0
    if not summary.get("releases") and not dead:
        return (f"nothing has consumed the input topic yet: its {summary['events_in']} events have no release and no "
                "dead letter of this stream on the output topics (start the worker with this config, or check "
                "that the worker's [stream] name is this config's)")
    if not suppressed and dead >= waiting:
        return "every event was dead-lettered: see dead letters by reason (the [input] mapping or the event schema)"
    if not suppressed:
        return ("the events are still deferred or in open windows: no window has closed yet (more input, or the "
                "worker's --flush-when-idle, closes them)")
    return k_out_of_reach(summary) or dominant_cause(summary.get("suppressed_by_reason")) or ""

"""Check ``accounting``: each raw message ends in exactly one place: published, suppressed, dead-lettered, still
deferred (latest manifest per partition) or **open**. Defeats silent loss and double publication.

Open: an event no output places, whose event time is at or after the end of the last window its input partition
released (or whose partition released nothing yet), is in a window still open at audit time: it is reported as
open (``open``, ``open_oldest``: their number and the oldest event time), never as lost, and does not fail the check.
An unplaced event of an already released time is lost, as is one an earlier manifest listed as deferred (the latest
manifest of its partition must still place it), and every unplaced event of a partition whose manifests state no
readable ``window_end``.

Published/suppressed/deferred tokens of no raw event, and dead letters whose source is not a raw message read,
also fail it (fabricated output, or an incomplete read of the input). An announced counterfeit record is no
input event: the equation counts real records only. A raw message that did not parse (not JSON, nested too deep
for the decoder) or has no ``event_id`` has no token: it must be dead-lettered, else it is lost.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from ..check import AuditContext, RawEvent, ViolationLog
from ..primitives import get_path, parse_time, source_key, string_values


def _released_until(manifests: list[dict]) -> dict[Any, datetime | None]:
    """Input partition -> the end of the last window its releases closed (an aware datetime)."""
    out: dict[Any, datetime | None] = {}
    for m in manifests:
        end = parse_time(m.get("window_end"))
        p = m.get("partition")
        until = out.setdefault(p, None)    # released, end unknown: nothing of it is open
        if end is not None and (until is None or end > until):
            out[p] = end
    return out


def _open_time(ctx: AuditContext, raw: RawEvent, released: dict[Any, datetime | None]) -> datetime | None:
    """The event time of ``raw`` when it lies in a window its partition has not released yet, else None."""
    if raw.event is None or raw.source is None:
        return None
    t = parse_time(get_path(raw.event, ctx.config.event_time))
    if t is None:
        return None
    if raw.source[1] not in released:
        return t
    end = released[raw.source[1]]
    return t if end is not None and t >= end else None


class Accounting:
    name = "accounting"

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        raws = ctx.raws
        # places per token (published / suppressed / deferred) and per source (dead-lettered)
        placed: dict[str | None, list[str]] = defaultdict(list)     # a record without a token: under None
        counterfeit = 0
        for r in ctx.records:
            if ctx.is_counterfeit(r):
                counterfeit += 1        # announced counterfeit record: no input event, outside the equation
                continue
            placed[r.get("audit_token")].append(f"published:{r.get('release_id')}")
        suppressed_by_reason: Counter = Counter()
        for m in ctx.manifests:
            for reason, toks in (m.get("suppressed_tokens") or {}).items():
                for t in string_values(toks):
                    placed[t].append(f"suppressed:{reason}")
        latest: dict[tuple, dict] = {}
        for m in ctx.manifests:
            key = (m.get("stream"), m.get("partition"))
            if key not in latest or (m.get("seq") or 0) > (latest[key].get("seq") or 0):
                latest[key] = m
        for m in latest.values():
            for t in string_values(m.get("deferred_tokens")):
                placed[t].append("deferred")
        ever_deferred = {t for m in ctx.manifests for t in string_values(m.get("deferred_tokens"))}
        dl_by_source: Counter = Counter(source_key(d.get("source")) for d in ctx.deadletters)
        sources = Counter(r.source for r in raws)
        for src, n in sources.items():
            if n > 1:
                log.fail("raw source read twice", source=src)
        for src in dl_by_source:
            if src not in sources:
                log.fail("dead letter of unknown source", source=src)
        raws_by_token: dict[str, list[RawEvent]] = defaultdict(list)
        outcome: Counter = Counter()
        released = _released_until(ctx.manifests)
        open_times: list[datetime] = []
        for raw in raws:
            n_dl = dl_by_source.get(raw.source, 0)
            if n_dl:
                outcome["dead_lettered"] += 1
                if n_dl > 1:
                    outcome["duplicated"] += 1
                    log.fail("duplicated", source=raw.source, places=["deadletter"] * n_dl)
            if raw.token is None:
                if not n_dl:
                    outcome["lost"] += 1
                    log.fail("lost", source=raw.source, note="unparseable or no event_id, not dead-lettered")
                continue
            raws_by_token[raw.token].append(raw)
        for token, group in raws_by_token.items():
            open_ = [r for r in group if not dl_by_source.get(r.source)]
            places = placed.get(token, [])
            for p in places[: len(open_)]:
                kind = p.split(":", 1)[0]
                outcome[kind] += 1
                if kind == "suppressed":
                    suppressed_by_reason[p.split(":", 1)[1]] += 1
            if len(places) < len(open_):
                for raw in open_[len(places):]:
                    opened = None if token in ever_deferred else _open_time(ctx, raw, released)
                    if opened is not None:
                        outcome["open"] += 1
                        open_times.append(opened)
                        continue
                    outcome["lost"] += 1
                    log.fail("lost", source=raw.source, audit_token=token)
            elif len(places) > len(open_):
                outcome["duplicated"] += len(places) - len(open_)
                log.fail("duplicated", source=group[0].source, audit_token=token, places=places)
        unknown = [t for t in placed if t not in raws_by_token]
        for tok in unknown:
            log.fail("token of no raw event", audit_token=tok, places=placed[tok])
        counts: dict[str, Any] = {
            "events_in": len(raws), "published": outcome["published"], "suppressed": outcome["suppressed"],
            "suppressed_by_reason": dict(suppressed_by_reason), "dead_lettered": outcome["dead_lettered"],
            "deferred": outcome["deferred"], "open": outcome["open"],
            "open_oldest": min(open_times).isoformat() if open_times else None,
            "lost": outcome["lost"], "duplicated": outcome["duplicated"],
            "unknown_tokens": len(unknown), "counterfeit_records": counterfeit,
        }
        balance = counts["published"] + counts["suppressed"] + counts["dead_lettered"] + counts["deferred"] \
            + counts["open"]
        equation = f"{counts['events_in']} == {counts['published']} + {counts['suppressed']} + " \
                   f"{counts['dead_lettered']} + {counts['deferred']} + {counts['open']}"
        log.details.update(counts, equation=equation, balanced=balance == counts["events_in"])
        return log.result(extra_ok=balance == counts["events_in"])

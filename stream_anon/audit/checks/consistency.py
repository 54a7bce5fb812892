"""Check ``consistency``: manifests agree with the records actually published (per class and in total), the
class generalization equals the records' ``qi``, k matches the k in force and every recorded change of a setting
the audit compares leads to the setting in force (:mod:`..in_force`), counts match token lists, and a class's
counterfeit records match its manifest count. Output messages that were no JSON object (or nested deeper than
any output of the engine) fail it too.

Individuals are recounted, never taken from the manifest: a class's ``individuals`` must be the distinct privacy
units of its real records in the release, and a release's ``individuals`` those of all its real records (units
from the raw events the records' tokens name; counterfeit records are no one). A class with a record of no raw
event is not recounted: the ``k`` check fails that record.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ..check import MAX_EXAMPLES, AuditContext, ViolationLog
from ..inputs import canonical_json
from ..primitives import string_values

_PREVIEW_CHARS = 200


def preview(value: Any) -> str:
    """A short text of a malformed output message for the report; a container is named by its type only (its
    text could be nested too deep to build)."""
    if isinstance(value, (bytes, bytearray, str)):
        return str(value[:_PREVIEW_CHARS * 4])[:_PREVIEW_CHARS]
    if isinstance(value, (dict, list, tuple)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)[:_PREVIEW_CHARS]


class Consistency:
    name = "consistency"

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        cfg, records, manifests, malformed = ctx.config, ctx.records, ctx.manifests, ctx.malformed
        fake_per_class: Counter = Counter((r.get("release_id"), r.get("class_id")) for r in records
                                          if ctx.is_counterfeit(r))
        for m in malformed[:MAX_EXAMPLES]:
            log.fail("malformed output message", value=preview(m))
        if len(malformed) > MAX_EXAMPLES:
            log.violations["malformed output message"] += len(malformed) - MAX_EXAMPLES
        per_release: Counter = Counter()
        per_class: Counter = Counter()
        qi_by_class: dict[tuple, Any] = {}
        units_of: dict[tuple, set] = defaultdict(set)       # (release, class) -> privacy units of its real records
        unseen: set = set()                                  # (release, class) holding a record of no raw event
        for r in records:
            key = (r.get("release_id"), r.get("class_id"))
            per_release[key[0]] += 1
            per_class[key] += 1
            qi_by_class.setdefault(key, r.get("qi"))
            raw = ctx.raw_of(r)
            if raw is None:
                if not ctx.is_counterfeit(r):
                    unseen.add(key)
            elif raw.unit is not None:
                units_of[key].add(raw.unit)
        classes_of_release: dict[Any, set] = defaultdict(set)
        for rid, cid in per_class:
            classes_of_release[rid].add(cid)
        known = {m.get("release_id") for m in manifests}
        for rid in per_release:
            if rid not in known:
                log.fail("records without manifest", release_id=rid, records=per_release[rid])
        in_force = ctx.in_force
        for name, details in in_force.problems:
            log.fail(name, **details)
        creators: Counter = Counter()
        for m in manifests:
            rid = m.get("release_id")
            if cfg.stream is not None and m.get("stream") not in (None, cfg.stream):
                log.fail("manifest of another stream", release_id=rid)
            total = 0
            listed = set()
            fake_total = 0
            for c in m.get("classes") or []:
                cid = c.get("class_id")
                listed.add(cid)
                n = c.get("records") or 0
                total += n
                n_fake = c.get("counterfeit_records") or 0
                fake_total += n_fake
                if fake_per_class.get((rid, cid), 0) != n_fake:
                    log.fail("class counterfeit records differ from manifest", release_id=rid, class_id=cid,
                             manifest=n_fake, published=fake_per_class.get((rid, cid), 0))
                if not c.get("reused"):
                    creators[cid] += 1
                if per_class.get((rid, cid), 0) != n:
                    log.fail("class record count differs", release_id=rid, class_id=cid, manifest=n,
                             published=per_class.get((rid, cid), 0))
                n_units = len(units_of.get((rid, cid), ()))
                if "individuals" in c and (rid, cid) not in unseen and c["individuals"] != n_units:
                    log.fail("class individuals differ from records", release_id=rid, class_id=cid,
                             manifest=c["individuals"], records=n_units,
                             line=f"release {rid} class {cid}: the manifest states {c['individuals']!r} "
                                  f"individuals, its real records hold {n_units}")
                if (rid, cid) in qi_by_class and "generalization" in c and \
                        canonical_json(c["generalization"]) != canonical_json(qi_by_class[(rid, cid)]):
                    log.fail("class generalization differs from records", release_id=rid, class_id=cid)
            for cid in classes_of_release.get(rid, ()):
                if cid not in listed:
                    log.fail("record class not in manifest", release_id=rid, class_id=cid)
            mine = classes_of_release.get(rid, set()) | listed
            if "individuals" in m and not any((rid, cid) in unseen for cid in mine):
                n_units = len(set().union(*(units_of.get((rid, cid), set()) for cid in mine)))
                if m["individuals"] != n_units:
                    log.fail("release individuals differ from records", release_id=rid, manifest=m["individuals"],
                             records=n_units, line=f"release {rid}: the manifest states {m['individuals']!r} "
                                                   f"individuals, its real records hold {n_units}")
            actual = per_release.get(rid, 0)
            if total != actual:
                log.fail("classes' records do not sum to published records", release_id=rid, sum=total,
                         actual=actual)
            if m.get("published") is not None and m.get("published") != actual - fake_total:
                log.fail("published count differs", release_id=rid, manifest=m.get("published"),
                         actual=actual - fake_total)
            if m.get("counterfeit_records") is not None and m.get("counterfeit_records") != fake_total:
                log.fail("release counterfeit records differ from its classes", release_id=rid,
                         manifest=m.get("counterfeit_records"), classes=fake_total)
            for reason, toks in (m.get("suppressed_tokens") or {}).items():
                n = (m.get("suppressed") or {}).get(reason)
                if n is not None and n != len(string_values(toks)):
                    log.fail("suppressed count differs from tokens", release_id=rid, reason=reason)
            if isinstance(m.get("deferred"), int) and m.get("deferred_tokens") is not None \
                    and m["deferred"] != len(string_values(m["deferred_tokens"])):
                log.fail("deferred count differs from tokens", release_id=rid)
        for cid, n in creators.items():
            if n > 1:
                log.fail("class created in more than one release", class_id=cid, releases=n)
        log.details.update(releases=len(manifests), records=len(records), k_changes=in_force.k_changes,
                           settings_changes=in_force.changes)
        return log.result()

"""What the audit does with a stream of several lineages or keys, before any check.

**Lineages.** A stream's outputs may span lineages (a new lineage after a lost state: ``lineage`` in every
manifest, DP row and dead letter, and in every release id). A lineage is a history of its own: its releases
re-place the same input (each raw event ends in one place *per lineage*), its m-invariance signatures and DP
budget start anew. The audit therefore judges each lineage apart, every check on that lineage's outputs against
the same raw input (:func:`split_by_lineage`), and reports each (verdict, figures, the DP check's worst charge per
period). What a consumer who reads both lineages learns is their sum: the DP charges of the same period in two
lineages add up (reported as ``dp_across_lineages``, a figure, not a verdict: the new lineage was declared by an
operator who knew the earlier one was lost).

**Previous keys.** After a key rotation (``stream-anon worker --rotate-key``) the manifests name two key ids. Given
the previous secrets too, the audit maps every token made under one of them to the current secret's token of the
same raw event (:func:`translate_tokens`), so each check sees one key; pseudonyms of every given secret count as
leaks.
"""
from __future__ import annotations

from typing import Any

from .inputs import AuditOutputs, outputs_part
from .primitives import audit_token, json_object

NO_LINEAGE = "(none)"      # outputs from before lineages


def lineage_of(item: dict) -> str:
    value = item.get("lineage") if isinstance(item, dict) else None
    return value if isinstance(value, str) and value else NO_LINEAGE


def split_by_lineage(outputs: Any) -> dict[str, AuditOutputs]:
    """The outputs of each lineage (records by their release's manifest; items of no known lineage with the
    first lineage, where the checks report them). One lineage: ``{lineage: outputs}`` unchanged."""
    manifests = outputs_part(outputs, "manifests")
    release_lineage = {m.get("release_id"): lineage_of(m) for m in manifests if isinstance(m, dict)}
    names = list(dict.fromkeys([lineage_of(m) for m in manifests if isinstance(m, dict)]
                               + [lineage_of(a) for a in outputs_part(outputs, "aggregates") if isinstance(a, dict)]))
    if len(names) <= 1:
        return {names[0] if names else NO_LINEAGE: outputs}
    parts = {name: AuditOutputs() for name in names}
    first = parts[names[0]]
    first.malformed = outputs_part(outputs, "malformed")
    for m in manifests:
        parts.get(lineage_of(m), first).manifests.append(m)
    for r in outputs_part(outputs, "records"):
        name = release_lineage.get(r.get("release_id")) if isinstance(r, dict) else None
        parts.get(name, first).records.append(r)
    for d in outputs_part(outputs, "deadletters"):
        parts.get(lineage_of(d), first).deadletters.append(d)
    for a in outputs_part(outputs, "aggregates"):
        parts.get(lineage_of(a), first).aggregates.append(a)
    return parts


def _map(token_of: dict, value):
    if isinstance(value, str):
        return token_of.get(value, value)
    if isinstance(value, list):
        return [_map(token_of, v) for v in value]
    if isinstance(value, dict):
        return {k: _map(token_of, v) for k, v in value.items()}
    return value


def translate_tokens(raw_events: list, outputs: Any, previous: list[bytes], secret: bytes) -> AuditOutputs:
    """The outputs with every audit token made under a ``previous`` secret replaced by ``secret``'s token of the
    same raw event (records, manifests' suppressed and deferred tokens, dead letters). Tokens of no raw event stay
    as they are (accounting reports them)."""
    token_of: dict[str, str] = {}
    for _source, payload in raw_events:
        event = payload if isinstance(payload, dict) else json_object(payload)
        eid = event.get("event_id") if event else None
        if isinstance(eid, str) and eid:
            current = audit_token(secret, eid)
            for old in previous:
                token_of[audit_token(old, eid)] = current
    out = AuditOutputs(malformed=outputs_part(outputs, "malformed"),
                       aggregates=outputs_part(outputs, "aggregates"))
    for r in outputs_part(outputs, "records"):
        out.records.append({**r, "audit_token": token_of.get(r.get("audit_token"), r.get("audit_token"))}
                           if isinstance(r, dict) else r)
    for m in outputs_part(outputs, "manifests"):
        if isinstance(m, dict):
            m = {**m, **{k: _map(token_of, m[k]) for k in ("suppressed_tokens", "deferred_tokens") if k in m}}
        out.manifests.append(m)
    for d in outputs_part(outputs, "deadletters"):
        if isinstance(d, dict) and "audit_token" in d:
            d = {**d, "audit_token": token_of.get(d["audit_token"], d["audit_token"])}
        out.deadletters.append(d)
    return out

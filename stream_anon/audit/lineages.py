"""What the audit does with a stream of several lineages or keys, before any check.

**Lineages.** A stream's outputs may span lineages (a new lineage after a lost state: ``lineage`` in every
manifest, DP row and dead letter, and in every release id). A lineage is a history of its own: its releases
re-place the same input (each raw event ends in one place *per lineage*), its m-invariance signatures and DP
budget start anew. The audit therefore judges each lineage apart, every check on that lineage's outputs against
the same raw input (:func:`split_by_lineage`), and reports each (verdict, figures, the DP check's worst charge per
period). What a consumer who reads both lineages learns is their sum: the DP charges of the same period in two
lineages add up (reported as ``dp_across_lineages``, a figure, not a verdict: the new lineage was declared by an
operator who knew the earlier one was lost).

**Settings of a superseded lineage.** A lineage that a later one supersedes (named in ``supersedes`` of the later
lineage's ``lineage_started``, an operator's explicit act: ``--new-lineage``) ran under the settings of its own
time: m and the privacy unit cannot change within a lineage (the worker refuses them), so a new m or unit comes
with a new lineage. Such a lineage is judged by the k, m and privacy unit its newest manifests state (one value over
its partitions; the k in force walks back from there through its recorded changes, :mod:`.in_force`), not by the
config's: by the first of the audit config and the earlier configs (``--earlier-config``) with that m and unit, its
other settings too. Every difference from the audit config is reported (``judged_by_its_own``:
``anonymization.m 3 (the config: 2)``). Every other lineage, and the current one always, is judged by the config
given.

**Previous keys.** After a key rotation (``stream-anon worker --rotate-key``) the manifests name two key ids. Given
the previous secrets too, the audit maps every token made under one of them to the current secret's token of the
same raw event (:func:`translate_tokens`), so each check sees one key; pseudonyms of every given secret count as
leaks.
"""
from __future__ import annotations

import dataclasses
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
        (parts.get(name, first) if name is not None else first).records.append(r)
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
        if isinstance(r, dict):
            token: Any = r.get("audit_token")       # any JSON value: one of no raw event stays as it is
            r = {**r, "audit_token": token_of.get(token, token)}
        out.records.append(r)
    for m in outputs_part(outputs, "manifests"):
        if isinstance(m, dict):
            m = {**m, **{k: _map(token_of, m[k]) for k in ("suppressed_tokens", "deferred_tokens") if k in m}}
        out.manifests.append(m)
    for d in outputs_part(outputs, "deadletters"):
        if isinstance(d, dict) and "audit_token" in d:
            d = {**d, "audit_token": token_of.get(d["audit_token"], d["audit_token"])}
        out.deadletters.append(d)
    return out


def superseded_lineages(manifests) -> set[str]:
    """The lineages a later lineage's declaration supersedes (``lineage_started.supersedes`` of its manifests)."""
    out: set[str] = set()
    for m in manifests:
        started = m.get("lineage_started") if isinstance(m, dict) else None
        names = started.get("supersedes") if isinstance(started, dict) else None
        out.update(n for n in (names if isinstance(names, list) else []) if isinstance(n, str))
    return out


_STATED = (("k", int, "anonymization.k"), ("m", int, "anonymization.m"), ("privacy_unit", str, "stream.privacy_unit"),
           ("input_digest", str, "input_digest"))


def stated_settings(manifests) -> dict:
    """What a lineage's newest manifests (the newest of each partition) all state of ``k``, ``m``, ``privacy_unit``
    and ``input_digest``; a value the partitions disagree on, or none stated, is left out."""
    newest: dict = {}
    for m in manifests:
        if isinstance(m, dict) and isinstance(m.get("seq"), int):
            p = m.get("partition")
            if p not in newest or m["seq"] > newest[p]["seq"]:
                newest[p] = m
    stated = {}
    for name, kind, _ in _STATED:
        values = {m.get(name) for m in newest.values()}
        value = values.pop() if len(values) == 1 else None
        if isinstance(value, kind) and not isinstance(value, bool):
            stated[name] = value
    return stated


def _compared(cfg, stated: dict) -> list[str]:
    """The stated settings ``cfg`` is compared on (a config made without an input digest: not on the reading)."""
    return [name for name, _, _ in _STATED if name in stated
            and not (name == "input_digest" and cfg.input_digest is None)]


def _fits(cfg, stated: dict) -> bool:
    """``cfg`` has the privacy unit, m and input reading ``stated``."""
    return all(getattr(cfg, n) == stated[n] for n in _compared(cfg, stated) if n != "k")


def own_settings(cfg, manifests, earlier=()) -> tuple[Any, list[str]]:
    """A superseded lineage's audit config and a line per setting that differs from ``cfg``'s: the first of ``cfg``
    and the ``earlier`` configs whose privacy unit, m and input reading (``input_digest``) are those its newest
    manifests state (:func:`stated_settings`; ``cfg`` when none is), with the k, m and privacy unit they state. A
    value the partitions disagree on, or none stated, keeps the config's (the checks then report what does not fit;
    an input reading no config has: :func:`unread`).

    >>> from stream_anon.audit.config import AuditConfig
    >>> cfg = AuditConfig(k=5, privacy_unit="card_id", m=2)
    >>> old = [{"partition": p, "seq": s, "k": 5, "m": 3} for p in (0, 1) for s in (1, 2)]
    >>> own, lines = own_settings(cfg, old)
    >>> (own.k, own.m, cfg.m), lines
    ((5, 3, 2), ['anonymization.m 3 (the config: 2)'])
    >>> own_settings(cfg, old[:2] + [{"partition": 1, "seq": 3, "k": 5, "m": 4}])[1]     # the partitions disagree
    []
    >>> journeys = [{**m, "privacy_unit": "journey_id"} for m in old]
    >>> own, lines = own_settings(cfg, journeys, [AuditConfig(k=5, privacy_unit="journey_id", m=3, source="old")])
    >>> own.source, own.privacy_unit, lines
    ('old', 'journey_id', ['anonymization.m 3 (the config: 2)', 'stream.privacy_unit journey_id (the config: card_id)'])
    >>> superseded_lineages([{"lineage": "L2", "lineage_started": {"lineage": "L2", "supersedes": ["L1"]}}])
    {'L1'}
    """
    stated = stated_settings(manifests)
    base = next((c for c in (cfg, *earlier) if _fits(c, stated)), cfg)
    compared = _compared(cfg, stated)
    lines = [f"{key} {stated[name]} (the config: {getattr(cfg, name)})" for name, _, key in _STATED
             if name in compared and stated[name] != getattr(cfg, name)]
    own = base.with_k(stated["k"]) if "k" in stated else base
    changes = {n: stated[n] for n in ("m", "privacy_unit") if n in stated and stated[n] != getattr(own, n)}
    return (dataclasses.replace(own, **changes) if changes else own), lines


def unread(cfg, manifests) -> str | None:
    """Why a lineage judged by ``cfg`` cannot be: its manifests state another input reading than ``cfg``'s (the raw
    messages would be read as it never read them), else None."""
    digest = stated_settings(manifests).get("input_digest")
    if digest is None or cfg.input_digest is None or digest == cfg.input_digest:
        return None
    return (f"the lineage read its raw messages as input_digest {digest} states, no config given reads them so "
            f"(the config: {cfg.input_digest}); give the config it ran under with --earlier-config")

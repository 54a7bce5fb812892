"""Check ``leaks``: no raw identifier, privacy unit or pseudonym in any string value or key of records and
manifests (dead letters are internal and carry raw payloads).

Matching rules (to avoid false positives); only string-typed output values and dict keys are searched (numbers
such as fares never match an id):

* Pseudonyms (64 hex chars) and their 16/32-char prefixes: substring search inside maximal lowercase-hex runs
  (a random 16-hex collision with an audit token is ~1e-8 even for 1e5 x 1e5 pairs).
* Raw identifier / unit values: the value (``str()``) must equal the whole output string, or one of its tokens
  when split on whitespace and ``, ; : / | = ( ) [ ] { } " '`` (not on ``- _ .`` so ISO times, decimals and
  release/class ids stay whole). Values shorter than 4 chars are skipped, as are values that equal a hierarchy
  label or a raw value of a configured (non-identifier) sensitive field: those are published legitimately.

Numeric bounds: where a numeric quasi-identifier has a granularity (configured, or the default derived from its
domain), each published ``from`` / ``to`` must be a multiple of it or a domain bound; a bound off the grid that
equals the record's own raw value fails as ``numeric bound equals a member's value`` (every bound that equals some
member's value is met on that member's record), any other off the grid as ``numeric bound off its granularity``.

Across accepted configuration changes (:mod:`..in_force`): a record or manifest is judged by the config in force
when its release was made: its identifier and sensitive fields, the labels of its hierarchies and the granularity of
its numeric bounds (a release made under such a setting that no given config has fails once per setting, with one
line naming it, and is searched with the audit config's). A manifest's ``settings_changed`` lines quote the configs
before and after the change (a sensitive domain's values, of a field that became an identifier), not events: they
are searched for pseudonyms only.
"""
from __future__ import annotations

import re

from ..check import AuditContext, ViolationLog
from ..primitives import as_float, as_text, get_path, on_grid, pseudonym, qi_value, strings_in

MIN_NEEDLE_LEN = 4
_SPLIT_RE = re.compile(r"[\s,;:/|=()\[\]{}\"']+")
_HEX_RUN_RE = re.compile(r"[0-9a-f]{16,}")
# a manifest's recorded changes quote the configs before and after (a domain's values), no event: pseudonyms only
_QUOTES_CONFIG = ".settings_changed["


def needles(ctx: AuditContext, cfg=None) -> tuple[dict[str, str], dict[str, str]]:
    """(exact-value needles -> description, hex prefixes/pseudonyms -> description) of the releases judged by
    ``cfg`` (default: the audit config): its identifier fields' raw values, less the labels of its hierarchies and
    the raw values of its sensitive fields."""
    cfg = cfg or ctx.config
    allow: set[str] = set()
    for q in cfg.quasi_identifiers:
        if q.hierarchy is not None:
            allow.update(q.hierarchy.parent)
    identifier_fields = list(dict.fromkeys(cfg.identifier_fields))
    legit_sensitive = [f for f in dict.fromkeys(cfg.sensitive_fields) if f not in identifier_fields]
    exact: dict[str, str] = {}
    hexes: dict[str, str] = {}
    events = [raw for raw in ctx.raws if raw.event is not None]
    for raw in events:
        for f in legit_sensitive:
            v = as_text(get_path(raw.event, f))
            if v is not None:
                allow.add(v)
    for raw in events:
        for f in identifier_fields:
            v = as_text(get_path(raw.event, f))
            if v is not None and len(v) >= MIN_NEEDLE_LEN:
                exact.setdefault(v, f"raw {f}")
        if raw.unit is not None:
            for secret in (ctx.secret, *ctx.previous_secrets):
                p = pseudonym(secret, raw.unit)
                hexes[p] = "pseudonym"
                hexes.setdefault(p[:32], "pseudonym[:32]")
                hexes.setdefault(p[:16], "pseudonym[:16]")
    for v in allow:
        exact.pop(v, None)
    return exact, hexes


class Leaks:
    name = "leaks"

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        for entry in ctx.in_force.unmatched_lines(self.name):
            log.fail("release made under settings no given config has", **entry)
        tokens_known = {r.token for r in ctx.raws if r.token is not None} | set(ctx.counterfeits)
        judges: dict[int, tuple] = {}          # id(config) -> (exact needles, hex needles, its strings' findings)

        def judge(release_id) -> tuple:
            cfg = ctx.config_for(release_id)
            if id(cfg) not in judges:
                judges[id(cfg)] = (*needles(ctx, cfg), {})    # keys, labels and times repeat across records
            return judges[id(cfg)]

        def leaks_in(s: str, exact: dict, hexes: dict) -> tuple[str, ...]:     # exact {}: pseudonyms only
            found = [f"leaked {exact[t]}" for t in {s, *_SPLIT_RE.split(s)} if t in exact]
            if s not in tokens_known:  # an audit token is an HMAC of its own: no pseudonym inside
                for run in _HEX_RUN_RE.findall(s):
                    for i in range(len(run) - 15):
                        if run[i:i + 16] in hexes:  # every needle starts with its pseudonym's 16-char prefix
                            n = next(n for n in (64, 32, 16) if run[i:i + n] in hexes)
                            found.append(f"leaked {hexes[run[i:i + n]]}")
            return tuple(found)  # () is a shared singleton: the cache stays small

        scanned = 0
        for kind, items in (("record", ctx.records), ("manifest", ctx.manifests)):
            for item in items:
                exact, hexes, cache = judge(item.get("release_id"))
                for path, s in strings_in(item):
                    scanned += 1
                    if path.startswith(_QUOTES_CONFIG):
                        found = leaks_in(s, {}, hexes)
                    elif (found := cache.get(s)) is None:
                        found = cache[s] = leaks_in(s, exact, hexes)
                    for what in found:
                        log.fail(what, where=kind, release_id=item.get("release_id"), path=path)
        exact, hexes, _ = judge(None)
        log.details.update(strings_scanned=scanned, identifier_values=len(exact), pseudonym_needles=len(hexes),
                           numeric_bounds_checked=numeric_bounds(ctx, log))
        return log.result()


def numeric_bounds(ctx: AuditContext, log: ViolationLog) -> int:
    """Check every numeric bound against its granularity (module docstring); the number of bounds checked."""
    if not any(q.kind == "numeric" and q.granularity for cfg in ctx.in_force.used() for q in cfg.quasi_identifiers):
        return 0
    checked = 0
    for r in ctx.records:
        published = r.get("qi")
        qi = published if isinstance(published, dict) else {}
        raw = ctx.raw_of(r)
        rid = r.get("release_id")
        unjudged = ctx.in_force.skipped(rid, "leaks")
        for q in ctx.config_for(rid).quasi_identifiers:
            if q.kind != "numeric" or not q.granularity or f"quasi_identifiers.{q.name}.granularity" in unjudged:
                continue
            pub = qi.get(q.name)
            if not isinstance(pub, dict):
                continue
            value = as_float(qi_value(q, raw.event)) if raw is not None and raw.event is not None else None
            for key in ("from", "to"):
                b = as_float(pub.get(key))
                if b is None:
                    continue
                checked += 1
                if b in (as_float(q.lower), as_float(q.upper)) or on_grid(b, float(q.granularity)):
                    continue
                exact = value is not None and abs(b - value) <= 1e-9 * max(1.0, abs(value))
                log.fail("numeric bound equals a member's value" if exact else "numeric bound off its granularity",
                         qi=q.name, bound=b, granularity=q.granularity, release_id=r.get("release_id"),
                         class_id=r.get("class_id"))
    return checked

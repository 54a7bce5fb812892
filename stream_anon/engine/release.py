"""What the engine emits: releases (records + manifest), rejections for the dead-letter topic."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from stream_anon.engine.space import iso


@dataclass
class Rejection:
    """An input event the engine cannot anonymize, with the reason (goes to the dead-letter topic)."""
    event: dict
    reason: str


@dataclass
class ClassInfo:
    class_id: str
    generalization: dict
    individuals: int       # distinct privacy units among this release's records of the class
    records: int
    ncp: float
    reused: bool           # True: records released under a class published by an earlier release
    counterfeit_individuals: int = 0   # m-invariance: counterfeit individuals / records added to this class here
    counterfeit_records: int = 0       # (``records`` counts real and counterfeit records)


@dataclass(frozen=True)
class Release:
    """One window's output of one partition (columnar; records materialize on demand). Immutable: every field is
    given when the engine builds it."""
    release_id: str
    stream: str
    partition: int
    seq: int
    window_start: float
    window_end: float
    watermark: float
    k: int
    classes: list[ClassInfo]
    # per published record (aligned arrays)
    record_class: np.ndarray           # index into classes
    record_sensitive: list             # tuples aligned with sensitive_fields
    record_token: list
    record_ncp: np.ndarray
    sensitive_fields: tuple
    suppressed_tokens: dict[str, list] = field(default_factory=dict)
    deferred_tokens: list = field(default_factory=list)
    max_suppression_ratio: float = 1.0
    record_counterfeit: np.ndarray | None = None   # m-invariance: True for counterfeit records (published like
                                                    # real ones; manifests give only their numbers)
    m: int | None = None                            # m of an m-invariant release (None: m-invariance off)
    kid: str | None = None                          # key id of the secret of the audit tokens (crypto.key_id)
    late: int = 0                                   # late events this release handled (published or suppressed)
    flushed: bool = False                           # made by a flush (end of input): every record was resolved
    lineage: str | None = None                      # the stream's lineage (part of release_id; None: no lineage)
    # the release's own individuals (distinct units of its real records) by the size of the smallest class holding
    # them here: ((size, individuals), ...), a reused class at max(k, its individuals in this release), the lower
    # bound the release knows of
    own_class_sizes: tuple = ()

    @property
    def published(self) -> int:
        """Real records published (input events); counterfeit records are not counted here."""
        return len(self.record_token) - self.counterfeit_records

    @property
    def individuals(self) -> int:
        """Distinct individuals (privacy units) of the release's real records."""
        return sum(n for _, n in self.own_class_sizes)

    @property
    def counterfeit_records(self) -> int:
        return 0 if self.record_counterfeit is None else int(np.count_nonzero(self.record_counterfeit))

    @property
    def counterfeit_individuals(self) -> int:
        return sum(c.counterfeit_individuals for c in self.classes)

    @property
    def published_watermark(self) -> float | None:
        """The watermark as published: rounded down to the start of its window, never the exact time of the
        partition's latest event. At a release the watermark lies in the closed window (the event that moves it
        into the next window is processed after the close), so this is ``window_start``; a watermark outside the
        window (never seen) is rounded down to its minute."""
        wm = self.watermark
        if wm is None or not np.isfinite(wm):
            return None
        if self.window_start <= wm:
            return float(self.window_start)
        return float(np.floor(wm / 60.0) * 60.0)

    @property
    def suppressed(self) -> dict[str, int]:
        return {reason: len(tokens) for reason, tokens in self.suppressed_tokens.items()}

    @property
    def n_suppressed(self) -> int:
        return sum(len(t) for t in self.suppressed_tokens.values())

    @property
    def ncp_mean(self) -> float:
        """Mean NCP of the real records (counterfeit records carry their class's NCP but are no data)."""
        ncp = self.record_ncp if self.record_counterfeit is None else self.record_ncp[~self.record_counterfeit]
        return float(ncp.mean()) if len(ncp) else 0.0

    @property
    def suppression_ratio(self) -> float:
        total = self.published + self.n_suppressed
        return self.n_suppressed / total if total else 0.0

    @property
    def records(self) -> list[dict]:
        """Published records as dicts (docs/contracts.md section 5)."""
        gens = [c.generalization for c in self.classes]
        ids = [c.class_id for c in self.classes]
        names = self.sensitive_fields
        return [
            {"release_id": self.release_id, "class_id": ids[c], "qi": gens[c],
             "sensitive": dict(zip(names, sv)), "audit_token": tok}
            for c, sv, tok in zip(self.record_class.tolist(), self.record_sensitive, self.record_token)
        ]

    def record_payloads(self, dumps) -> list[bytes]:
        """:attr:`records` serialized with ``dumps`` (a compact JSON encoder such as orjson's), the same bytes as
        ``dumps(record)`` each, with each class's common prefix (release, class, generalization) encoded once,
        each distinct sensitive tuple once (:func:`_sensitive_payloads`) and the hex audit tokens quoted as they
        are (a JSON string of letters and digits is the text in quotes)."""
        prefixes = [dumps({"release_id": self.release_id, "class_id": c.class_id, "qi": c.generalization})[:-1]
                    + b',"sensitive":' for c in self.classes]
        sensitive = _sensitive_payloads(self.sensitive_fields, self.record_sensitive, dumps)
        tokens = self.record_token
        joined = "\0".join(tokens).encode()
        quoted = joined.split(b"\0") if joined.isascii() and not joined.translate(None, _ALNUM_OR_NUL) else ()
        if tokens and len(quoted) == len(tokens):
            return [b"".join((prefixes[c], sv, b',"audit_token":"', tok, b'"}'))
                    for c, sv, tok in zip(self.record_class.tolist(), sensitive, quoted)]
        return [prefixes[c] + sv + b',"audit_token":' + dumps(tok) + b"}"
                for c, sv, tok in zip(self.record_class.tolist(), sensitive, tokens)]

    def manifest(self, extra: dict | None = None) -> dict:
        """The release's manifest (docs/contracts.md section 5), built here only. ``extra``: the fields the worker
        adds (stream_anon.render.Renderer.release: ``settings_fingerprint``, ``privacy_unit``, ``input_digest``,
        ``settings_changed``, and notes such as ``lineage_started``), after the engine's."""
        ratio = self.suppression_ratio
        classes = [{"class_id": c.class_id, "generalization": c.generalization, "individuals": c.individuals,
                    "records": c.records, "ncp": round(c.ncp, 6), "reused": c.reused} for c in self.classes]
        doc: dict = {
            "release_id": self.release_id, "stream": self.stream, "partition": self.partition, "seq": self.seq,
            "window_start": _iso(self.window_start), "window_end": _iso(self.window_end),
            "watermark": _iso(self.published_watermark), "k": self.k,
            "classes": classes,
            "published": self.published, "individuals": self.individuals, "suppressed": self.suppressed,
            "suppressed_tokens": self.suppressed_tokens, "deferred": len(self.deferred_tokens),
            "deferred_tokens": self.deferred_tokens, "ncp_mean": round(self.ncp_mean, 6),
            "suppression_ratio": round(ratio, 6),
            "suppression_limit_exceeded": ratio > self.max_suppression_ratio,
            "created_at": datetime.now(timezone.utc).isoformat(),
        }
        if self.flushed:
            doc["flushed"] = True
        if self.kid is not None:
            doc["kid"] = self.kid
        if self.lineage is not None:
            doc["lineage"] = self.lineage
        if self.m is not None:
            # m-invariance: only the numbers of counterfeits are published (per class and in total), never which
            # records they are; "published" counts real records, the records topic holds published + these.
            doc["m"] = self.m
            for entry, c in zip(classes, self.classes):
                entry["counterfeit_individuals"] = c.counterfeit_individuals
                entry["counterfeit_records"] = c.counterfeit_records
            doc["counterfeit_individuals"] = self.counterfeit_individuals
            doc["counterfeit_records"] = self.counterfeit_records
        doc.update(extra or {})
        return doc


@dataclass
class StepResult:
    releases: list[Release] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    windows: list = field(default_factory=list)        # stream_anon.engine.engine.ClosedWindow, one per release

    def extend(self, other: "StepResult") -> "StepResult":
        self.releases += other.releases
        self.rejected += other.rejected
        self.windows += other.windows
        return self


_ALNUM_OR_NUL = b"\0" + bytes(range(48, 58)) + bytes(range(65, 91)) + bytes(range(97, 123))
_EXACT_KEYS = frozenset({str, type(None), int, bool})


def _sensitive_payloads(names: tuple, values: list, dumps) -> list[bytes]:
    """``dumps(dict(zip(names, v)))`` for each tuple ``v`` of ``values``, each distinct tuple encoded once when
    equal tuples are sure to encode alike: every field's values are text, null and one of integers or booleans
    (not 1 and true, or 0.0 and -0.0, which are equal keys with different JSON)."""
    if len(values) > 1 and names:
        for column in zip(*values):
            types = set(map(type, column))
            if not types <= _EXACT_KEYS or (int in types and bool in types):
                break
        else:
            encoded = {v: dumps(dict(zip(names, v))) for v in dict.fromkeys(values)}
            return list(map(encoded.__getitem__, values))
    return [dumps(dict(zip(names, v))) for v in values]


def _iso(ts: float | None) -> str | None:
    if ts is None or not np.isfinite(ts):
        return None
    return iso(ts)

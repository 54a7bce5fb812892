"""A stream's **lineage**: one unbroken history of its state. Every release id, DP row id and state record names
it (``<stream>-<lineage>-p<p>-<seq>``), so ids never repeat across lineages, and a consumer that dedupes by
release id (or ``row_id``) never drops the output of a new lineage as a copy of an old one.

Where a lineage is declared. The app's lineage topic ``<app-id>-lineage`` (one partition, compacted) holds the
stream's declarations ``{"lineage", "supersedes": [...], "reason", "created_at", "by"}`` under the keys
``<stream>/lineage/<id>``. The log decides: the stream's **current** lineage is its first declaration, then
repeatedly the first later one that supersedes the current one; two workers declaring at once therefore agree (each
reads the topic up to a barrier it wrote after its own declaration, so it sees the one that came first). The
**known** lineages are every declared and every superseded id.

When a worker recovers a partition that has no state (:func:`stream_anon.worker.state.choose_state` found none, or
halted it as ``state_topic_reset`` because the local cache knows more), it looks for **earlier lineages** of the
stream: those its state directory's committed headers name (every app id under ``--state-dir``) and those the
manifests on ``anon.releases`` name. Then (:func:`decide`):

* nothing declared and nothing found: a first lineage is declared (a new stream; logged as a WARNING, alert
  ``lineage_started``, and in the partitions' first manifests as ``lineage_started``);
* an earlier lineage found that the topic does not know (the broker or the state topic was reset, or the app id
  changed), or the partition's own state was lost (``state_topic_reset``): the partition **halts**
  (``lineage_lost``, one line naming the lineage and where it was found), unless the worker runs with
  ``--new-lineage``: then a new lineage superseding the lost ones is declared (ERROR log line, alert
  ``lineage_started``, ``lineage_started`` in the manifests with what it supersedes) and the partition starts
  empty in it, with a fresh DP budget: the lost lineage's spending cannot be known;
* a partition whose state topic holds no record at all while the stream's manifests show releases of it in the
  current lineage lost its state too (its ids would repeat): it halts the same way (a broker such as Tansu that
  shows aborted transactions to read-committed readers can make this halt a false alarm after a kill -9 inside a
  partition's very first transaction: it fails closed);
* otherwise the partition starts empty in the current lineage (a partition without input so far). Every
  partition's first manifest in a lineage says ``lineage_started`` (the declaration's words, so a release
  re-produced after a crash is identical).

What cannot be detected: a broker reset together with the loss of every state directory leaves no trace of the
earlier lineage; the worker then declares a first lineage (WARNING). Its release ids are still new (a lineage id
is random), and the audit reports each lineage apart, but the DP budget spent by the lost lineage is not known to
the worker: docs/operations.md (Lineage) says what an operator does then.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import cast

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from stream_anon.connection import FIRST_OFFSET, REPLICATION_FACTOR
from stream_anon.kafka.state_cache import POLL_S
from stream_anon.render import TOPICS, json_bytes

log = logging.getLogger("stream_anon.worker")
client_log = logging.getLogger("stream_anon.kafka.client")

HALT_LINEAGE_LOST = "lineage_lost"
READ_WAIT_S = 60.0


LINEAGE_TOPIC_CONFIG = {"cleanup.policy": "compact"}


def lineage_topic(app_id: str) -> str:
    return f"{app_id}-lineage"


def new_lineage_id() -> str:
    """``L`` and 8 random hex digits: two lineages of a stream share an id with probability ~n^2 / 2^33."""
    return "L" + secrets.token_hex(4)


def current_lineage(declarations: list[dict]) -> tuple[str | None, set[str]]:
    """(the current lineage, every known one) of the stream's declarations in log order (module docstring).

    >>> d = [{"lineage": "La", "supersedes": []}, {"lineage": "Lb", "supersedes": []},
    ...      {"lineage": "Lc", "supersedes": ["La"]}, {"lineage": "Ld", "supersedes": ["La"]}]
    >>> current, known = current_lineage(d)
    >>> current, sorted(known)
    ('Lc', ['La', 'Lb', 'Lc', 'Ld'])
    """
    current = None
    for d in declarations:
        if current is None or current in d.get("supersedes", ()):
            current = d["lineage"]
    known = {d["lineage"] for d in declarations} | {s for d in declarations for s in d.get("supersedes", ())}
    return current, known


@dataclass
class Decision:
    """What happens to the partitions without state: all start in ``lineage`` (with ``notes`` for their first
    manifests) or all halt (``halt`` set, ``detail`` one line); ``declare``: the declaration to write first."""
    lineage: str | None = None
    notes: dict = field(default_factory=dict)
    declare: dict | None = None
    halt: str | None = None
    detail: str = ""


def decide(current: str | None, known: set[str], found: dict[str, str], reset: dict[int, tuple],
           new_lineage: bool, fresh_id: str | None = None) -> Decision:
    """Pure decision for the partitions without state (module docstring). ``found``: earlier lineage -> where it
    was found; ``reset``: partition -> (the lineage its lost state was in, where that was seen); ``fresh_id``:
    the id a declaration would take.

    >>> decide(None, set(), {}, {}, False, "Lnew").declare["reason"][:13]
    'first lineage'
    >>> d = decide("Lb", {"Lb"}, {"La": "manifests on anon.releases"}, {}, False)
    >>> d.halt, d.detail[:60]
    ('lineage_lost', 'manifests on anon.releases name lineage La of this stream, t')
    >>> d = decide("Lb", {"Lb"}, {"La": "manifests on anon.releases"}, {}, True, "Lc")
    >>> d.lineage, d.declare["supersedes"]
    ('Lc', ['La', 'Lb'])
    >>> decide("Lb", {"La", "Lb"}, {"La": "manifests"}, {}, False).lineage
    'Lb'
    """
    fresh_id = fresh_id or new_lineage_id()
    lost = {name: where for name, where in found.items() if name not in known}
    for p, (name, where) in sorted(reset.items()):
        lost.setdefault(str(name), where)
    if not lost:
        if current is not None:
            return Decision(lineage=current)
        reason = ("first lineage of the stream: no state, no local state cache and no manifest names an earlier "
                  "lineage")
        return _declared(fresh_id, [], reason)
    named = "; ".join(f"{where} name{'s' if where.startswith(('local', 'the local')) else ''} lineage {name} of "
                      "this stream" for name, where in sorted(lost.items()))
    if not new_lineage:
        return Decision(halt=HALT_LINEAGE_LOST, detail=(
            f"{named}, the lineage topic {'declares ' + current if current else 'declares none'} and the "
            "partition has no state: resuming would repeat that lineage's release ids and spend its DP budget "
            "again; start a new lineage with --new-lineage (docs/operations.md, Lineage)"))
    supersedes = sorted(set(lost) | ({current} if current else set()))
    return _declared(fresh_id, supersedes, f"new lineage after a loss (--new-lineage): {named}")


def _declared(lineage: str, supersedes: list[str], reason: str) -> Decision:
    declaration = {"lineage": lineage, "supersedes": supersedes, "reason": reason,
                   "created_at": time.time(), "by": f"{socket.gethostname()}:{os.getpid()}"}
    note = {"lineage": lineage, "supersedes": supersedes, "reason": reason}
    return Decision(lineage=lineage, notes={"lineage_started": note}, declare=declaration)


class LineageTopic:
    """The app's lineage topic for one stream: read its declarations (to a barrier), write one."""

    def __init__(self, client_config: dict, app_id: str, stream: str):
        self.cfg, self.stream = dict(client_config), stream
        self.topic = lineage_topic(app_id)
        self._producer: Producer | None = None
        self.fatal: KafkaError | None = None     # the producer's fatal error: it cannot be used again

    def ensure(self, admin) -> None:
        """Create the topic (one partition, compacted) unless it exists, and the producer: an idempotent producer
        takes its producer id in the background (about a second on the Tansu broker) while the worker joins its
        consumer group, instead of when the first recovery writes its barrier. An existing topic is not created
        again: a broker with ACLs refuses CreateTopics to a worker without Create rights even for a topic that
        exists (TOPIC_AUTHORIZATION_FAILED), and such a worker uses the topic `topics apply --app-id` made."""
        if self.topic in admin.list_topics(timeout=30).topics:
            self._producer_ready()
            return
        fut = admin.create_topics([NewTopic(self.topic, 1, REPLICATION_FACTOR, config=LINEAGE_TOPIC_CONFIG)])
        for f in fut.values():
            try:
                f.result(30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        self._producer_ready()

    def _producer_ready(self) -> Producer:
        if self._producer is None:
            # an error_cb of its own: without one, confluent-kafka raises a fatal error (an idempotent producer's
            # sequence numbers after a broker reset) out of a call of the worker's loop as an object that is no
            # exception class, which no ``except`` catches: the loop died and the worker exited 0
            self._producer = Producer({**self.cfg, "enable.idempotence": True, "acks": "all", "logger": client_log,
                                       "error_cb": self._on_error})
        return self._producer

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
        elif err.code() not in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):   # the watchdog's to report
            client_log.warning("lineage producer: %s", err)

    def raise_fatal(self) -> None:
        """Raise the producer's fatal error, if it had one (the worker's loop ends on it: exit 70)."""
        if self.fatal is not None:
            raise KafkaException(self.fatal)

    def _produce(self, key: str, doc: dict) -> None:
        self.raise_fatal()
        prod = self._producer_ready()
        prod.produce(self.topic, json_bytes(doc), key.encode(), partition=0)
        unsent = prod.flush(30)
        self.raise_fatal()
        if unsent != 0:
            raise RuntimeError(f"lineage topic {self.topic}: a record was not acknowledged within 30 s")

    def declare(self, declaration: dict) -> None:
        self._produce(f"{self.stream}/lineage/{declaration['lineage']}", {"type": "lineage", "stream": self.stream,
                                                                          **declaration})

    def read(self) -> list[dict]:
        """The stream's declarations in log order: everything committed before a barrier written now."""
        nonce = uuid.uuid4().hex
        self._produce(f"{self.stream}/barrier", {"type": "barrier", "stream": self.stream, "nonce": nonce})
        reader = Consumer({**self.cfg, "group.id": f"{self.topic}-reader", "enable.auto.commit": False,
                           "auto.offset.reset": "earliest", "logger": client_log})
        out: list[dict] = []
        try:
            reader.list_topics(self.topic, timeout=30)    # leader known: no 500 ms wait before the first fetch
            reader.assign([TopicPartition(self.topic, 0, FIRST_OFFSET)])
            deadline = time.monotonic() + READ_WAIT_S
            while time.monotonic() < deadline:
                for m in reader.consume(num_messages=500, timeout=POLL_S):
                    value = m.value()
                    if m.error() is not None or not value:
                        continue
                    try:
                        doc = orjson.loads(value)
                    except ValueError:
                        continue
                    if not isinstance(doc, dict) or doc.get("stream") != self.stream:
                        continue
                    if doc.get("type") == "barrier" and doc.get("nonce") == nonce:
                        return out
                    if doc.get("type") == "lineage" and isinstance(doc.get("lineage"), str):
                        out.append(doc)
            raise RuntimeError(f"lineage topic {self.topic}: the barrier did not come back within {READ_WAIT_S} s")
        finally:
            reader.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)


def manifest_lineages(client_config: dict, stream: str, quiet_s: float = 0.5, max_s: float = 60.0
                      ) -> dict[str, set[int]]:
    """Lineage -> the partitions with releases in it, for every lineage the stream's manifests name (``"None"`` for
    manifests from before lineages). Reads the topic to its end: until the consumer's position in each partition is at
    or past its high watermark (a lower bound on the Tansu broker) and a poll of ``quiet_s`` brings nothing."""
    prefix = f"{stream}-".encode()
    topic = TOPICS.releases
    reader = Consumer({**client_config, "group.id": f"stream-anon-lineage-scan-{uuid.uuid4().hex[:8]}",
                       "enable.auto.commit": False, "isolation.level": "read_committed",
                       "auto.offset.reset": "earliest", "logger": client_log})
    found: dict[str, set[int]] = {}
    try:
        md = reader.list_topics(topic, timeout=30).topics.get(topic)
        _refuse_unauthorized(md.error if md is not None else None, topic)
        if md is None or md.error is not None:
            return found
        parts = list(md.partitions)
        ends = {}
        for p in parts:
            try:
                ends[p] = reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            except KafkaException:
                ends[p] = 0
        tps = [TopicPartition(topic, p, FIRST_OFFSET) for p in parts]
        reader.assign(tps)
        quiet_since = time.monotonic()
        deadline = quiet_since + max_s
        while time.monotonic() < deadline:
            # short polls (a poll lasts its whole timeout unless 1000 messages come): quiet_s is measured from the
            # last message, not waited out once per poll
            msgs = reader.consume(num_messages=1000, timeout=min(quiet_s, POLL_S))
            if msgs:
                quiet_since = time.monotonic()
            for m in msgs:
                key, value = m.key() or b"", m.value()
                _refuse_unauthorized(m.error(), topic)
                # a tombstone (None) is no manifest (orjson would refuse it too)
                if m.error() is not None or not key.startswith(prefix) or value is None:
                    continue
                try:
                    doc = orjson.loads(value)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("stream") == stream:     # a manifest (its partition: an int)
                    found.setdefault(str(doc.get("lineage")), set()).add(cast(int, doc.get("partition")))
            # the consumer's position passes transaction markers, which no message shows
            if not msgs and time.monotonic() - quiet_since >= quiet_s and \
                    all(ends[tp.partition] <= 0 or tp.offset >= ends[tp.partition] for tp in reader.position(tps)):
                return found
        log.warning("stream %s: anon.releases not read to its end within %s s: lineages of the stream found so far: "
                    "%s", stream, max_s, sorted(found) or "none")
        return found
    finally:
        reader.close()


def _refuse_unauthorized(err: KafkaError | None, topic: str) -> None:
    """Stop on an ACL refusal: a worker that may not read the stream's manifests would find no earlier lineage
    and start a new one where a lost state must halt (fail closed)."""
    if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        raise RuntimeError(f"not authorized to read {topic}: the worker needs Read and Describe on it to find the "
                           "stream's lineages (docs/operations.md, ACLs)")


class StreamLineage:
    """The worker's side: places the partitions a recovery found without state (:meth:`place`)."""

    def __init__(self, client_config: dict, app_id: str, stream: str, cache, new_lineage: bool = False):
        self.cfg, self.stream, self.cache, self.new_lineage = client_config, stream, cache, new_lineage
        self.topic = LineageTopic(client_config, app_id, stream)

    def place(self, recs: dict, raise_alert=None, counters: dict | None = None, empty: set | None = None) -> None:
        """For each :class:`~stream_anon.worker.state.Recovery` without state (none found, or halted as
        ``state_topic_reset``): the lineage it starts in (``rec.lineage``, ``rec.notes``), or a halt
        (``lineage_lost``; a ``state_topic_reset`` keeps its reason, with the lineage named). A lineage this worker
        declares is logged, counted (``counters["lineages_started"]``) and sent as alert ``lineage_started``
        (``raise_alert(name, partition, **fields)``). ``empty``: the partitions whose state topic holds no record at all: releases of theirs in
        the current lineage mean their state was lost (a partition whose first transaction was aborted has that
        transaction's state record beside the releases a broker like Tansu shows of it)."""
        from stream_anon.worker.state import HALT_STATE_RESET, Recovery
        fresh = {p: rec for p, rec in recs.items() if rec.doc is None and rec.halt in (None, HALT_STATE_RESET)}
        if not fresh:
            return
        reset = {p: ((self.cache.read(p) or {}).get("lineage"), f"the local state cache of partition {p} (its "
                     "state in the state topic is gone)") for p, rec in fresh.items() if rec.halt == HALT_STATE_RESET}
        # the manifests first, then the declarations: a lineage is declared (acknowledged) before any manifest of it
        # is written, so every lineage the scan finds is declared in a read of the topic made after it. Read the
        # other way round, another worker's first lineage declared between the two reads looks lost.
        released = manifest_lineages(self.cfg, self.stream)
        declarations = self.topic.read()
        current, known = current_lineage(declarations)
        found = dict(self.cache.lineages())
        found.update({name: "manifests on anon.releases" for name in released if name not in found})
        for p in sorted(set(fresh) & set(empty or ()) & released.get(str(current), set())):
            reset.setdefault(p, (current, f"manifests of partition {p} on anon.releases (its state is gone)"))
        decision = decide(current, known, found, reset, self.new_lineage)
        if decision.declare is not None:
            self.topic.declare(decision.declare)
            declarations = self.topic.read()
            current, _ = current_lineage(declarations)      # the log decides (another worker may have won)
            if current == decision.lineage:
                d = decision.declare
                if counters is not None:
                    counters["lineages_started"] = counters.get("lineages_started", 0) + 1
                if raise_alert is not None:
                    raise_alert("lineage_started", None, lineage=d["lineage"], supersedes=d["supersedes"],
                                reason=d["reason"])
                log.log(logging.ERROR if decision.declare["supersedes"] else logging.WARNING,
                        "stream %s: lineage %s started (%s)%s", self.stream, current, decision.declare["reason"],
                        f"; it supersedes {', '.join(decision.declare['supersedes'])}"
                        if decision.declare["supersedes"] else "")
            decision = Decision(lineage=current)
        if decision.halt is None:
            # every partition's first manifest in a lineage says so, whoever declared it: the same words after a
            # restart, so a release re-produced after a crash keeps its one content
            won = next(d for d in declarations if d["lineage"] == decision.lineage)
            decision.notes = {"lineage_started": {"lineage": decision.lineage, "supersedes": won.get("supersedes", []),
                                                  "reason": won.get("reason")}}
        for p, rec in fresh.items():
            if decision.halt is not None:
                if rec.halt is None:
                    rec.halt, rec.detail = decision.halt, decision.detail
                else:
                    rec.detail += f" (lineage {reset[p][0]}); {decision.detail}"
                continue
            recs[p] = Recovery(lineage=decision.lineage, notes=dict(decision.notes))

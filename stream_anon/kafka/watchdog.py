"""Whether the worker can reach its broker: a metadata request every ``probe_interval_s`` from a client of its own
(the loop's thread may be blocked in a transaction meanwhile) and the client library's error callbacks. One
WARNING when the connection is lost and one when it is back; the idle flush counts quiet time only from the end of
an outage and from answers the broker gave (``answered_at``). The loop may ask for a probe at a given time
(:meth:`BrokerWatch.probe_by`: when the partitions' quiet time is up) so that the idle flush does not wait up to an
interval more for the next one."""
from __future__ import annotations

import logging
import math
import threading
import time

from confluent_kafka import KafkaError, KafkaException  # noqa: F401  (what a probe raises)
from confluent_kafka.admin import AdminClient

log = logging.getLogger("stream_anon.worker")
client_log = logging.getLogger("stream_anon.kafka.client")

PROBE_INTERVAL_S = 2.0                 # the metadata request, every ...
PROBE_TIMEOUT_S = 4.0                  # ... unanswered after this: the broker is lost
ASKED_WITHIN_S = 0.05                  # a probe asked for (probe_by) is sent within this of its time
ANSWER_POLL_S = 0.02                   # while that probe is awaited, the loop looks for its answer this often


class BrokerWatch:
    def __init__(self, client_config: dict, topic: str, stopping: threading.Event, counters: dict):
        self.cfg, self.topic, self.stopping, self.counters = client_config, topic, stopping, counters
        self.connected = True
        self.answered_at = -math.inf           # when the last answered probe was sent
        self.outage_ended_at = -math.inf
        self.sent_at = -math.inf               # when the last probe was sent
        self.asked_at = math.inf               # a probe is wanted from this time on (probe_by)
        self.probe_interval_s, self.probe_timeout_s = PROBE_INTERVAL_S, PROBE_TIMEOUT_S
        self._lock = threading.Lock()

    def on_error(self, err: KafkaError) -> None:
        """The client library's error callback."""
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.lost(err.str())
        else:
            client_log.warning("kafka: %s", err)

    def lost(self, why: str) -> None:
        with self._lock:
            if self.connected:
                self.connected = False
                self.counters["broker_lost"] += 1
                log.warning("broker connection lost (%s): processing waits; nothing is committed meanwhile", why)

    def restored(self) -> None:
        with self._lock:
            if not self.connected:
                self.connected = True
                self.outage_ended_at = time.monotonic()
                log.warning("broker connection restored")

    def probe_by(self, when: float) -> None:
        """Have a probe sent at ``when`` (monotonic time) if the next one would come later (none is asked for a
        time a probe was already sent after)."""
        if when > self.sent_at:
            self.asked_at = min(self.asked_at, when)

    def input_wait(self, due: float, longest: float) -> float:
        """How long the loop may wait for input (at most ``longest``) when an idle flush falls due at ``due``
        (monotonic time; inf: none): until the probe asked for at ``due`` may have been answered, then every
        ``ANSWER_POLL_S`` while it is asked for, under way, or answered within ``longest``, so that the flush follows
        the quiet time by a probe's round trip, not by up to ``longest``."""
        now = time.monotonic()
        if not self.connected or due == math.inf:
            return longest
        if now < due:
            return min(longest, due - now + ASKED_WITHIN_S + ANSWER_POLL_S)
        probing = self.asked_at < math.inf or (
            self.sent_at >= due and (self.answered_at < self.sent_at or now - self.answered_at < longest))
        return min(longest, ANSWER_POLL_S) if probing else longest

    def run(self) -> None:
        """The probing thread's target, until ``stopping`` is set."""
        admin = AdminClient({**self.cfg, "logger": client_log})  # type: ignore[dict-item]  # hint omits logger
        self.sent_at = time.monotonic()        # the first probe an interval after the start
        while not self.stopping.wait(min(self.probe_interval_s, ASKED_WITHIN_S)):
            sent = time.monotonic()
            if sent < min(self.sent_at + self.probe_interval_s, self.asked_at):
                continue
            self.sent_at = sent
            if self.asked_at <= sent:
                self.asked_at = math.inf
            try:
                admin.list_topics(topic=self.topic, timeout=self.probe_timeout_s)
            except Exception as exc:  # noqa: BLE001 - KafkaException (timeout, transport) or anything else
                self.lost(f"no answer to a metadata request within {self.probe_timeout_s:g} s: "
                          f"{type(exc).__name__}")
                continue
            self.restored()
            self.answered_at = sent

"""The DP aggregates of a worker's partitions in a second process.

Why: the worker's loop is one thread on one core; on the 2-core machine of the benchmarks that thread was busy
100% of the processing span while the broker used ~10% of the other core. Releasing the closed windows' aggregates
(cells, contribution bounds, noise, ledger, rows: ~3.5 us of CPU per event of the Oyster stream) cost the DP run
a fifth of its throughput. In a child process that work runs beside the engine's instead of after it.

What does not change: the aggregates of a partition are the same :class:`~stream_anon.worker.aggregates.
PartitionAggregates` object, only living in the child; every row, ledger entry and state record is the one the
worker computes without the child (``tests/dp/test_aggregates_process.py`` compares them byte for byte); the
partition's DP state still goes into the same Kafka transaction as its output and offsets (the loop asks the child
for it when it writes the state record, which waits for the releases sent before).

Protocol: requests ``(op, partition, args)`` go to the child in order through a :mod:`multiprocessing` queue;
each gets one reply, in the same order. A release is sent and not waited for (:class:`Pending`): the loop goes on
with the next partition's engine and collects the rows before it commits (``WorkerCore.complete``).

Failures:

- a release that raises in the child comes back as that exception; ``WorkerCore.complete`` puts the partition back
  to its committed state and processes the batch again with the releases waited for, so that the failure is one
  batch's failure and the isolation path finds the events (as without the child);
- a child that is gone (killed, out of memory) raises :class:`AggregatesProcessLost`, which no event handler
  catches: the loop stops, the worker exits non-zero, nothing of the batch was committed, and the next worker
  recovers the partitions (DP state included) from Kafka. The child exits by itself when its parent is gone.
"""
from __future__ import annotations

import collections
import logging
import multiprocessing
import pickle
import queue
import sys
import traceback
from typing import Any

from stream_anon import checkpoint
from stream_anon.worker import aggregates
from stream_anon.worker.aggregates import Pending

log = logging.getLogger("stream_anon.worker")

POLL_S = 1.0          # how often a waiting side checks that the other process is still there
PIPE_BYTES = 1 << 20  # Linux's largest pipe without privileges (/proc/sys/fs/pipe-max-size)
CHILD_SWITCH_S = 0.001    # the child's GIL switch interval (Python's default: 5 ms)


class AggregatesProcessLost(BaseException):
    """The aggregates' child process is gone. A ``BaseException``: no handler of one event's failure may take it
    for that event's fault (the partition's DP state went with the process)."""


class RemoteError(RuntimeError):
    """An exception raised in the child that could not be sent back as itself."""


class AggregatesProcess:
    """The child process holding the :class:`~stream_anon.worker.aggregates.PartitionAggregates` of the worker's
    partitions; :meth:`open` gives a partition's :class:`RemoteAggregates`. Used from one thread (the loop's).

    ``dumps``: the worker's serializer of the rows (bytes); ``setup``: called in the child first (the worker's
    garbage collector tuning); both module-level functions (sent by name). ``serve``: the child's main function
    (tests give one that fails on purpose); it must be importable by name.
    """

    def __init__(self, config, secret: bytes, dumps, setup=None, serve=None):
        ctx = multiprocessing.get_context("spawn")     # no fork of a process running librdkafka's threads
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        # never wait at exit for requests a dead child cannot read (this process holds the pipe's both ends: the
        # write would block for ever once the pipe is full)
        self._requests.cancel_join_thread()
        for q in (self._requests, self._replies):
            _widen(q)
        self._proc = ctx.Process(target=serve or serve_requests, args=(self._requests, self._replies),
                                 name="stream-anon-aggregates", daemon=True)
        self._proc.start()
        self._outstanding: collections.deque[Pending] = collections.deque()
        self.closed = False
        # not waited for here: the child imports (~2 s) while the worker joins its consumer group; the first call
        # that waits for a reply (a partition's open) waits for it first and raises its error
        self._init: Pending | None = self.send("init", None, config, secret, dumps, setup)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def send(self, op: str, partition: int | None, *args) -> Pending:
        """Send a request; its reply comes later (:meth:`Pending.result`). The request is pickled here, at once:
        what it holds may change after this returns."""
        if self.closed:
            raise AggregatesProcessLost("the aggregates process was closed")
        reply = Pending(self)
        self._outstanding.append(reply)
        self._requests.put(pickle.dumps((op, partition, args), protocol=pickle.HIGHEST_PROTOCOL))
        return reply

    def call(self, op: str, partition: int | None, *args):
        reply = self.send(op, partition, *args)
        if self._init is not None:
            init, self._init = self._init, None
            init.result()
        return reply.result()

    def wait(self, reply: Pending) -> None:
        while not reply.done:
            try:
                status, value = pickle.loads(self._replies.get(timeout=POLL_S))
            except queue.Empty:
                if not self._proc.is_alive():
                    self.closed = True
                    raise AggregatesProcessLost(f"the aggregates process exited (code {self._proc.exitcode}); the "
                                                "partitions' DP state is recovered from Kafka by the next worker")
                continue
            head = self._outstanding.popleft()
            head.done = True
            if status == "ok":
                head.value = value
            else:
                head.error = value

    def open(self, config, partition: int, core: dict | None, tables: dict | None, lineage: str | None = None
             ) -> "RemoteAggregates":
        """The partition's aggregates, new (``core`` None) or restored, in the child (replacing any it held)."""
        carried = self.call("open", partition, core, tables, lineage)
        return RemoteAggregates(self, config, partition, carried, core)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the child (pending replies are dropped)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._requests.put(pickle.dumps(("stop", None, ())))
        except (OSError, ValueError):
            pass
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout_s)


class RemoteAggregates:
    """A partition's aggregates held by the child: the interface ``WorkerCore`` uses of
    :class:`~stream_anon.worker.aggregates.PartitionAggregates`, whose :meth:`messages` returns the same
    :class:`~stream_anon.worker.aggregates.Pending`, filled in when the child replies."""

    def __init__(self, process: AggregatesProcess, config, partition: int, carried: tuple, core: dict | None):
        self.process, self.partition, self.carried = process, partition, tuple(carried)
        self.dp = config.dp
        # the last window released, as the child's aggregator counts it (PartitionAggregates.released_through)
        last = ((core or {}).get("aggregator") or {}).get("last_window")
        start = self.dp.start_window
        self.released_through = last if last is not None else None if start is None else start - 1
        # the ledger's and the aggregator's position as of the last state record, noted together (one assignment:
        # the metrics endpoint reads them from its own thread) and read into a ledger when asked (_ledger_view)
        self._noted = ((core or {}).get("ledger"), (core or {}).get("aggregator"))
        self._ledger_view = None
        # record states asked since the last state record, in order: a release after one makes it stale, but its
        # table changes (the child's change tracking was reset with them) still go into the next record
        self._record_states: list[Pending] = []
        self._fresh = False                   # the last of them was asked after the last release

    def messages(self, windows, dumps, metrics_topic: str, through: int | None = None) -> Pending:
        """Release ``windows``, then the empty ones up to ``through``, in the child (``dumps`` is the child's own:
        the worker's serializer)."""
        self._fresh = False                      # a state record must see this release
        last = self.released_through
        for w in windows:
            last = w.index if last is None else max(last, w.index)
        if through is not None and last is not None:
            last = max(last, through)
        self.released_through = last
        return self.process.send("release", self.partition, windows, metrics_topic, through)

    def prefetch_record_state(self) -> None:
        """Request :meth:`record_state` now (after the releases sent so far), for the next state record: its reply
        follows them, where a request made when the record is written waits behind the releases sent since."""
        if not self._fresh:
            self._record_states.append(self.process.send("record_state", self.partition))
            self._fresh = True

    def record_state(self) -> tuple[dict, dict | None, int]:
        """(state core, state changes, table rows) for a state record: the latest reply asked after the last
        release (asked now when there is none), with the table changes of every reply since the last record."""
        if not self._fresh:
            self.prefetch_record_state()
        replies, self._record_states, self._fresh = self._record_states, [], False
        core, changes, rows = replies[-1].result()
        for earlier in reversed(replies[:-1]):
            changes = checkpoint.changes_then(earlier.result()[1], changes)
        self._note(core)
        return core, changes, rows

    def state_core(self) -> dict:
        doc = self.process.call("state_core", self.partition)
        self._note(doc)
        return doc

    def _note(self, core: dict) -> None:
        """Keep the ledger and the aggregator's position of a state core (not the counters)."""
        aggregator = {k: core["aggregator"].get(k) for k in ("period", "last_window", "carry")}
        self._noted = (core["ledger"], aggregator)

    def full_tables(self) -> dict:
        return self.process.call("full_tables", self.partition)

    def close(self) -> None:
        if not self.process.closed:
            self.process.send("close", self.partition)

    @property
    def ledger(self):
        """The ledger as of the last state record (for the metrics endpoint, read from its own thread: never a
        request to the child)."""
        return self.budget_view()[0]

    def budget_view(self):
        """(the ledger, the aggregator's :class:`~stream_anon.dp.outlook.AggregatorPosition`) as of the last state
        record, for :func:`~stream_anon.dp.outlook.budget_outlook`."""
        from stream_anon.dp.outlook import position_of
        noted, view = self._noted, self._ledger_view
        if view is None or view[0] is not noted:
            from stream_anon.dp import BudgetLedger
            state = noted[0]
            # the budget in force (an accepted change may keep another one until the period ends)
            ledger = BudgetLedger(None, (state or {}).get("epsilon_budget", self.dp.epsilon_budget))
            if state is not None:
                ledger.load_state(state, {})
            view = self._ledger_view = (noted, ledger, position_of(noted[1]))
        return view[1], view[2]


# ---- the child --------------------------------------------------------------------------------------------------
def serve_requests(requests, replies) -> None:
    """The child's loop: one request at a time, one reply each, until ``stop`` or the parent is gone."""
    parent = multiprocessing.parent_process()
    replies.cancel_join_thread()        # a parent that is gone reads no reply: exit without waiting to send it
    # the queue's thread sends each reply while the next release computes: it gets the GIL within 1 ms, not 5
    sys.setswitchinterval(CHILD_SWITCH_S)
    config: Any = None                  # set by the first request, "init"
    secret: bytes = b""
    dumps: Any = None
    parts: dict[int, aggregates.PartitionAggregates] = {}
    value: Any
    while True:
        try:
            raw = requests.get(timeout=POLL_S)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        op, p, args = pickle.loads(raw)
        if op == "stop":
            return
        try:
            if op == "init":
                config, secret, dumps, setup = args
                if setup is not None:
                    setup()
                value = None
            elif op == "open":
                core, tables, lineage = args
                parts[p] = aggregates.PartitionAggregates(config, p, secret, lineage)
                if core is not None:
                    parts[p].load_state(core, tables or {})
                else:
                    parts[p].open_new()
                value = parts[p].carried
            elif op == "release":
                windows, topic, through = args
                value = parts[p].messages(windows, dumps, topic, through).result()
            elif op == "close":
                value = parts.pop(p, None) is not None
            elif op in ("state_core", "full_tables", "record_state"):
                value = getattr(parts[p], op)(*args)
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as exc:  # noqa: BLE001 - sent back to the parent, which decides
            log.exception("aggregates process: %s of partition %s failed", op, p)
            value, status = _sendable(exc), "error"
        else:
            status = "ok"
        # pickled here, before the next request changes what the reply holds (the queue's own thread would pickle
        # it later)
        replies.put(pickle.dumps((status, value), protocol=pickle.HIGHEST_PROTOCOL))


def _widen(q) -> None:
    """Give the queue's pipe :data:`PIPE_BYTES` (Linux; elsewhere, or when refused, it keeps its size). Why: a
    queue's own thread writes a message in pipe-sized pieces and must take the GIL back between two pieces, which
    the busy main thread of its process gives up only every switch interval (5 ms): with 64 KB pipes, a window's
    ~300 KB of rows took ~25 ms to cross and the loop waited for them."""
    try:
        import fcntl
        for conn in (q._reader, q._writer):      # noqa: SLF001 - the queue's pipe has no public handle
            fcntl.fcntl(conn.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


def _sendable(exc: Exception) -> BaseException:
    """``exc`` itself when it survives pickling (the parent then sees the same class), else a :class:`RemoteError`
    with its class name and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RemoteError(f"{type(exc).__name__} in the aggregates process:\n{traceback.format_exc()}")

"""The worker's test and benchmark harness that no production module may import (tests/cli/test_architecture.py): a
worker that SIGKILLs itself at the worst moments (run as a script by :func:`start_worker_process`) and the fuzzer's
hostile messages (tests/worker/test_fuzz_worker.py, bench/chaos.py).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import orjson

from stream_anon.kafka import supervise

KILL_AFTER_ENV = "STREAM_ANON_TEST_KILL_AFTER_BATCHES"
KILL_IN_FLUSH_ENV = "STREAM_ANON_TEST_KILL_IN_FLUSH"


def start_worker_process(config_path, bootstrap: str, state_dir, app_id: str | None = None,
                         flush_when_idle_s: float | None = None, log_path=None, env=None, extra=None):
    """:func:`stream_anon.kafka.supervise.start_worker_process`, or this module's crashing wrapper
    (:func:`crash_main`) when ``env`` asks for it: ``STREAM_ANON_TEST_KILL_AFTER_BATCHES=N`` or
    ``STREAM_ANON_TEST_KILL_IN_FLUSH=1``."""
    env = env or os.environ.copy()
    return supervise.start_worker_process(config_path, bootstrap, state_dir, app_id, flush_when_idle_s, log_path,
                                          env, extra, harness_entry(env))


def harness_entry(env: dict, hold_before_commit=None) -> tuple[str, ...]:
    """What ``python`` runs for a worker: the worker, or :func:`crash_main` with the options ``env`` asks for
    (``STREAM_ANON_TEST_KILL_AFTER_BATCHES``, ``STREAM_ANON_TEST_KILL_IN_FLUSH``) or ``hold_before_commit``."""
    kill_after = int(env.get(KILL_AFTER_ENV, "0") or 0)
    kill_in_flush = env.get(KILL_IN_FLUSH_ENV) == "1"
    if not (kill_after or kill_in_flush or hold_before_commit):
        return supervise.WORKER
    return (str(Path(__file__).resolve()), *(["--kill-in-flush"] if kill_in_flush else []),
            *(["--kill-after-batches", str(kill_after)] if kill_after else []),
            *(["--hold-before-commit", str(hold_before_commit)] if hold_before_commit else []))


POISON_TIMES = ("9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59")   # schema-valid; year 10000 / 0 in UTC


def _deep(depth: int) -> bytes:
    """JSON text nested ``depth`` levels (objects or arrays), built as text: encoders refuse such depths."""
    return (b'{"a":' * depth + b'"x"' + b"}" * depth) if depth % 2 else (b"[" * depth + b'"x"' + b"]" * depth)


EXTREME_TIMES = [*POISON_TIMES, "0001-01-01T00:00:00+00:00", "9999-12-31T23:59:59+00:00", "2009-11-09T07:00:00",
                 "2009-13-45T99:99:99+00:00", "", "2009-11-09T07:00:00+99:00", 1e308, -1e308, 10 ** 30, 2 ** 63,
                 -(2 ** 63), 0, 1257750000, 1.5e9, True, "NaN", "\ud800", "2009-11-09T07:00:00.123456789+00:00"]


EXTREME_VALUES = [1e308, -1e308, 10 ** 18, 2 ** 63 - 1, -(2 ** 63), -1, 0.5, 1e-308, 5e-324, True, False, None, "",
                  "<script>alert(1)</script>", "'; DROP TABLE fares; --", "a\x00b", "\ud800", "\udfff\ud800",
                  "x" * 10_000, "\u202e\u0000", [], {}, [1, [2, [3]]], {"$ne": None}, "LUL Travelcard-7 Day"]


def mutate(event: dict, rng: random.Random) -> bytes:
    """One hostile message derived from a real event."""
    e = json.loads(json.dumps(event))
    kind = rng.randrange(9)
    keys = list(e)
    if kind == 0:       # random byte flips in the serialized message
        raw = bytearray(orjson.dumps(e))
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 1:       # field deletions
        for k in rng.sample(keys, rng.randint(1, 3)):
            del e[k]
    elif kind == 2:     # type swaps
        for k in rng.sample(keys, rng.randint(1, 3)):
            e[k] = rng.choice([[e[k]], {"v": e[k]}, 7, "7", 7.5, True, None, str(e[k])])
    elif kind == 3:     # extreme times
        e["event_time"] = rng.choice(EXTREME_TIMES)
    elif kind == 4:     # extreme numbers and hostile values in any field
        for k in rng.sample(keys, rng.randint(1, 2)):
            e[k] = rng.choice(EXTREME_VALUES)
    elif kind == 5:     # deep nesting
        e[rng.choice(keys + ["extra"])] = "__deep__"
        return orjson.dumps(e).replace(b'"__deep__"', _deep(rng.choice([10, 201, 254, 300, 999, 1000, 1100])))
    elif kind == 6:     # lone surrogates (JSON escapes: valid JSON, not valid Unicode text)
        k = rng.choice(["event_id", "journey_id", "station", "fare_product", "bus_route", "event_type"])
        e[k] = f"{e.get(k) or ''}\ud800"
        return json.dumps(e, ensure_ascii=True).encode()
    elif kind == 7:     # huge strings (some over the size limit)
        e[rng.choice(keys)] = "A" * rng.choice([1000, 60_000, 70_000])
    else:               # structural: not an object, duplicate keys, trailing garbage
        return rng.choice([b"[]", b"null", b"1e999", b'{"a":NaN}', orjson.dumps(e) + b"}", b"",
                           orjson.dumps(e)[:-1], b'{"event_id":"x","event_id":"y"}', b"\xff\xfe",
                           orjson.dumps([e])])
    try:
        return orjson.dumps(e)
    except orjson.JSONEncodeError:    # lone surrogates, integers beyond 64 bits
        return json.dumps(e).encode()


def crash_main(argv=None) -> int:
    """A worker that SIGKILLs itself at the worst moments (tests of restarts), then the usual worker options:

    ``--kill-after-batches N``: inside its N-th transaction, after the output and state records reached the
    broker and before the commit (the transaction stays open until the restarted worker fences it);
    ``--kill-in-flush``: inside the transaction that carries an idle flush's output, after the decision to flush
    was committed; ``--hold-before-commit PATH``: while the file PATH exists, each transaction waits before its
    commit (output and state sent) and ``PATH.held`` exists (a test cuts the worker off there: its transactions
    are then in flight)."""
    from stream_anon.kafka import app
    from stream_anon.kafka.loop import KafkaLoop

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--kill-after-batches", type=int, default=0)
    ap.add_argument("--kill-in-flush", action="store_true")
    ap.add_argument("--hold-before-commit", default=None)
    args, rest = ap.parse_known_args(argv)
    end, flush = KafkaLoop._end_transaction, KafkaLoop._flush

    def end_or_die(self, prod, offsets, *more):
        if args.hold_before_commit and os.path.exists(args.hold_before_commit):
            # a step's partitions commit side by side (kafka/transactions.py): each commit thread may hold here,
            # so PATH.held is replaced whole (a reader never sees it half written) and removed by the first
            prod.flush(10)
            held = Path(args.hold_before_commit + ".held")
            partial = held.with_name(f"{held.name}.{offsets[0].partition}")
            partial.write_text(" ".join(str(tp.partition) for tp in offsets[:1]))
            os.replace(partial, held)
            while os.path.exists(args.hold_before_commit):
                time.sleep(0.05)
            held.unlink(missing_ok=True)
        due = (args.kill_after_batches and self.counters["transactions"] + 1 >= args.kill_after_batches) or \
            (args.kill_in_flush and getattr(self, "_flushing", False) and not self._flush_decided_now)
        if due:
            prod.flush(10)
            os.kill(os.getpid(), signal.SIGKILL)
        self._flush_decided_now = False
        return end(self, prod, offsets, *more)

    def flush_marked(self, ps):
        self._flushing, self._flush_decided_now = True, not ps.flush_pending
        try:
            return flush(self, ps)
        finally:
            self._flushing = False

    KafkaLoop._end_transaction, KafkaLoop._flush = end_or_die, flush_marked
    return app.worker_main(rest)


if __name__ == "__main__":
    sys.exit(crash_main(sys.argv[1:]))

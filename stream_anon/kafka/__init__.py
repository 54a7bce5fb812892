"""Kafka side of stream-anon: topic provisioning, replay, the faust worker and its checkpoints.

- ``stream_anon.kafka.topics``: ``load_topic_definitions(dir)``, ``apply_topics(bootstrap, defs)`` (idempotent).
- ``stream_anon.kafka.replay``: ``replay(bootstrap, topic, events, key_fn)``, ``replay_file(path, topic, ...)``.
- ``stream_anon.kafka.core``: ``WorkerCore``, the worker without faust or a Kafka client (batch in -> output
  messages + checkpoint), and the input checks.
- ``stream_anon.kafka.app``: ``make_app(...)`` (faust), ``run_worker(...)``, ``worker_main(argv)``
  (``stream-anon worker``).
- ``stream_anon.kafka.harness``: tests and benchmarks only: worker subprocesses, the output reader,
  ``run_until_accounted(...)``, the demo's DP figures.
- ``stream_anon.kafka.checkpoint``: a local snapshot + delta-log store of engine state (core and keyed-table
  changes; benchmarks of checkpoint cost). The worker keeps its state in Kafka (``state.py``, ``loop.py``).

Importing this package does not import faust or kafka-python; the submodules do.
"""

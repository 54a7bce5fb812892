"""Kafka side of stream-anon: topic provisioning, replay, the faust worker and its checkpoints.

- ``stream_anon.kafka.topics``: ``load_topic_definitions(dir)``, ``apply_topics(bootstrap, defs)`` (idempotent).
- ``stream_anon.kafka.replay``: ``replay(bootstrap, topic, events, key_fn)``, ``replay_file(path, topic, ...)``.
- ``stream_anon.kafka.worker``: ``make_app(...)`` (faust), ``run_worker(...)``, ``run_until_accounted(...)``,
  ``worker_main(argv)`` (``stream-anon worker``).
- ``stream_anon.kafka.checkpoint``: atomic per-partition checkpoints (docs/contracts.md section 6).

Importing this package does not import faust or kafka-python; the submodules do.
"""

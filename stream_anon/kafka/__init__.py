"""Kafka side of stream-anon: the connection's clients, topic provisioning, replay, the worker's loop and its state
in Kafka. The worker's processing itself is Kafka-free (:mod:`stream_anon.worker`).

- ``stream_anon.kafka.topics``: ``load_topic_definitions(dir)``, ``apply_topics(bootstrap, defs)`` (idempotent).
- ``stream_anon.kafka.replay``: ``replay(bootstrap, topic, events, key_fn)``, ``replay_file(path, topic, ...)``.
- ``stream_anon.kafka.loop``: the batch loop (confluent-kafka): output, state record and offsets in one
  transaction per partition batch.
- ``stream_anon.kafka.transactions``: a partition's transactional producer, what its transaction holds (state
  records in parts), and the commits of a step's partitions side by side.
- ``stream_anon.kafka.app``: ``make_app(...)`` (faust), ``run_worker(...)``, ``worker_main(argv)``
  (``stream-anon worker``).
- ``stream_anon.kafka.supervise``: a worker run and watched from outside (the demo, tests, benchmarks): worker
  subprocesses, the output reader, ``run_until_accounted(...)``.

Importing this package does not import faust or kafka-python; the submodules do.
"""

"""The worker without Kafka: a partition's batch of input messages in, its output messages and new state out.

No module here imports a Kafka client or faust (tests/cli/test_architecture.py checks it): :mod:`stream_anon.kafka`
moves what this package produces through Kafka, and tests, benchmarks and the fingerprint runs drive it directly.

- ``stream_anon.worker.core``: ``WorkerCore``, the batch of one partition -> output messages + the state record.
- ``stream_anon.worker.input_checks``: size, JSON, kind and schema checks before the engine's reader.
- ``stream_anon.worker.placement``: one privacy unit, one input partition (misplaced events are dead-lettered).
- ``stream_anon.worker.isolation``: a batch that raised is cut down to the events that fail alone.
- ``stream_anon.worker.partition``: one partition's pipeline and its state as a chain of state records.
- ``stream_anon.worker.state``: the state topic's records and the fail-closed decision at recovery.
- ``stream_anon.worker.aggregates`` and ``aggregates_process``: the DP aggregates per partition, in or beside the
  worker's process.
- ``stream_anon.worker.stats``: the worker's counters.
"""

"""stream-anon: a streaming anonymizer for vehicle telemetry and public-transport fare events.

Parts (see docs/contracts.md):
- ``stream_anon.config``: validated stream configuration (TOML).
- ``stream_anon.engine``: the incremental anonymization engine (no Kafka, no faust).
- ``stream_anon.strategies``: pluggable class-forming strategies.
- ``stream_anon.audit``: independent verification of published output.
- ``stream_anon.kafka``: the thin faust adapter, topic provisioning and replay.
"""

__version__ = "0.1.0"

"""stream-anon: a streaming anonymizer for vehicle telemetry and public-transport fare events.

Raw events in on Kafka topics; k-anonymous records (k in distinct individuals, m-invariant with
``anonymization.m``), release manifests that account for every event, and differentially private aggregates out;
an independent audit checks the outputs. Parts (interfaces in docs/contracts.md, modules in docs/developers.md):

- ``stream_anon.config``: the stream configuration (TOML), validated at load.
- ``stream_anon.engine``: the window core: event-time windows, releases, suppression (no Kafka client, no faust).
- ``stream_anon.formers`` and ``stream_anon.strategies``: how a window's records become classes (k-anonymous with
  a pluggable strategy, or m-invariant).
- ``stream_anon.dp``: the differentially private aggregates of the closed windows and their budget ledger.
- ``stream_anon.audit``: independent verification of the published output.
- ``stream_anon.anonymize`` and ``stream_anon.audit_result`` (:mod:`stream_anon.api`, docs/api.md): the worker's
  pipeline and the audit in process, on a list of events or a DataFrame, without Kafka.
- ``stream_anon.worker``: the worker without Kafka: a partition's batch in, its output messages and new state out.
- ``stream_anon.kafka``: the worker on Kafka (a confluent-kafka batch loop: one transaction per partition batch holding the
  output, the partition's state record and the consumer offsets; faust runs the process, its signals and the
  ``/metrics``, ``/livez`` and ``/readyz`` endpoints), topic provisioning and replay.
"""

from stream_anon.version import __version__

# the in-process API, imported on first use: ``import stream_anon`` stays light and imports no Kafka client
_API = ("Result", "anonymize", "audit_result")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from stream_anon import api
        return getattr(api, name)
    raise AttributeError(f"module 'stream_anon' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_API})

"""Independent audit of stream-anon outputs (imports nothing from the engine or strategies).

``audit(raw_events, outputs, secret, AuditConfig)`` re-derives k (in distinct individuals), coverage, leaks and
event-by-event accounting from the raw input, the secret and the published outputs; see :mod:`.checks`.
``stream_anon.audit.kafka_source`` reads the same from a broker.
"""
from .checks import AuditConfig, AuditOutputs, AuditReport, Hierarchy, QISpec, audit

__all__ = ["AuditConfig", "AuditOutputs", "AuditReport", "Hierarchy", "QISpec", "audit"]

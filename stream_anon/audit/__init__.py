"""Independent audit of stream-anon outputs (imports nothing from the engine, the strategies, the criteria or their
config).

``audit(raw_events, outputs, secret, AuditConfig)`` re-derives k (in distinct individuals), the configured
l-diversity and severity criteria, coverage, leaks, event-by-event accounting, output consistency and, for a stream
with m, m-invariance from the raw input, the secret and the published outputs (:mod:`.run`; one module per check in :mod:`.checks`).
``check_m_invariance`` runs the m-invariance criterion on its own. :mod:`.primitives` is the toolkit the
attacks share; ``stream_anon.audit.kafka_source`` reads the same input from a broker.
"""
from .check import AuditContext, Check
from .checks.m_invariance import MInvarianceReport, check_m_invariance
from .config import AuditConfig, MInvarianceConfig
from .inputs import AuditOutputs
from .measures import counterfeit_lower_bound
from .primitives import Hierarchy, QISpec
from .report import AuditReport
from .run import audit, audit_with_context

__all__ = ["AuditConfig", "AuditContext", "AuditOutputs", "AuditReport", "Check", "Hierarchy", "MInvarianceConfig",
           "MInvarianceReport", "QISpec", "audit", "audit_with_context", "check_m_invariance", "counterfeit_lower_bound"]

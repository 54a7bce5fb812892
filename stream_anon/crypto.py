"""Keyed HMAC-SHA256 pseudonyms and audit tokens.

Both are keyed with one secret held outside the data (env ``STREAM_ANON_SECRET``): without it nobody can map a
token back to an event or a key back to an individual. Pseudonyms are used for Kafka keys and in state only;
no pseudonym is ever published, because a stable per-individual pseudonym would link an individual across
releases.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets

SECRET_ENV = "STREAM_ANON_SECRET"
_MIN_SECRET_BYTES = 16


class SecretError(RuntimeError):
    """Raised when no usable secret is configured."""


def load_secret(env: str = SECRET_ENV) -> bytes:
    """Read the HMAC secret from the environment; refuse to run without one."""
    value = os.environ.get(env, "")
    if len(value.encode()) < _MIN_SECRET_BYTES:
        raise SecretError(
            f"{env} is not set or shorter than {_MIN_SECRET_BYTES} bytes: set a random secret, e.g. "
            f"`export {env}=$(python -c 'import secrets; print(secrets.token_hex(32))')`"
        )
    return value.encode()


def throwaway_secret() -> bytes:
    """A random secret for demos: tokens made with it can never be mapped back once the process ends."""
    return secrets.token_hex(32).encode()


def _hmac_hex(secret: bytes, label: bytes, value: str) -> str:
    return hmac.new(secret, label + value.encode(), hashlib.sha256).hexdigest()


def audit_token(secret: bytes, event_id: str) -> str:
    """Opaque token of one event: only a holder of the secret and the raw input can map it back."""
    return _hmac_hex(secret, b"audit:", event_id)


class AuditTokenizer:
    """``audit_token`` for many events: the keyed HMAC state is built once and copied per event (hot path)."""

    def __init__(self, secret: bytes):
        self._base = hmac.new(secret, b"audit:", hashlib.sha256)

    def __call__(self, event_id: str) -> str:
        h = self._base.copy()
        h.update(event_id.encode())
        return h.hexdigest()


def pseudonym(secret: bytes, unit: str) -> str:
    """Keyed pseudonym of a privacy unit (for partitioning keys and state, never for output)."""
    return _hmac_hex(secret, b"unit:", unit)


def dp_noise_seed(secret: bytes, stream: str, partition: int) -> bytes:
    """Secret seed of the differential-privacy noise of one stream partition (HMAC of the stream secret).

    The aggregator derives each window's noise from it with a second HMAC over (aggregate, component, output,
    window), so a restarted worker re-publishes identical noise for a window and never fresh noise for the same
    data (which would let an observer average the noise away). Without the secret the noise is unpredictable.
    """
    return hmac.new(secret, f"dp-noise:{stream}:{partition}".encode(), hashlib.sha256).digest()

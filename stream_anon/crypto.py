"""Keyed HMAC-SHA256 pseudonyms and audit tokens.

Both are keyed with one secret held outside the data (a file named by env ``STREAM_ANON_SECRET_FILE``, e.g. a
mounted Kubernetes/Docker secret, or env ``STREAM_ANON_SECRET``): without it nobody can map a token back to an
event or a key back to an individual. A weak secret is refused (:func:`check_secret`). Manifests and dead letters
carry the secret's key id (:func:`key_id`), so tokens made under different secrets can be told apart when the
secret is rotated (docs/contracts.md section 8). Pseudonyms are used for Kafka keys and in state only;
no pseudonym is ever published, because a stable per-individual pseudonym would link an individual across
releases.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
from collections import Counter
from pathlib import Path

SECRET_ENV = "STREAM_ANON_SECRET"
SECRET_FILE_ENV = "STREAM_ANON_SECRET_FILE"
# the secret before a rotation (``stream-anon worker --rotate-key``, ``stream-anon audit``): read only, to recognise
# the state and the tokens it made (docs/operations.md, Key rotation)
PREVIOUS_SECRET_ENV = "STREAM_ANON_PREVIOUS_SECRET"
PREVIOUS_SECRET_FILE_ENV = "STREAM_ANON_PREVIOUS_SECRET_FILE"
_MIN_SECRET_BYTES = 16
_MIN_SECRET_BITS = 80.0     # estimated entropy (see estimated_bits); a random 32-byte hex secret has ~230
_HOW = "e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`"


class SecretError(RuntimeError):
    """Raised when no usable secret is configured."""


def estimated_bits(secret: bytes) -> float:
    """A simple entropy estimate: length x the empirical Shannon entropy of the secret's bytes (bits). An upper
    bound for anything a person types (it sees no words or sequences); it catches repeated characters and short
    alphabets, not a weak passphrase.

    >>> estimated_bits(b" " * 16), estimated_bits(b"abab"), round(estimated_bits(b"0123456789abcdef"))
    (0.0, 4.0, 64)
    """
    n = len(secret)
    if n == 0:
        return 0.0
    return n * -sum(c / n * math.log2(c / n) for c in Counter(secret).values()) + 0.0


def check_secret(secret: bytes, where: str) -> bytes:
    """The secret, or SecretError when it is too weak: under 16 bytes, or under 80 estimated bits."""
    if len(secret) < _MIN_SECRET_BYTES:
        raise SecretError(f"{where}: the secret is missing or shorter than {_MIN_SECRET_BYTES} bytes; use a random "
                          f"secret, {_HOW}")
    bits = estimated_bits(secret)
    if bits < _MIN_SECRET_BITS:
        raise SecretError(f"{where}: the secret is too weak (about {bits:.0f} bits estimated, at least "
                          f"{_MIN_SECRET_BITS:.0f} needed); use a random secret, {_HOW}")
    return secret


def load_secret(env: str = SECRET_ENV, file_env: str = SECRET_FILE_ENV) -> bytes:
    """The HMAC secret: the content of the file named by ``$STREAM_ANON_SECRET_FILE`` (one trailing newline
    removed) or ``$STREAM_ANON_SECRET``; refuse to run without one, with both, or with a weak one."""
    path, value = os.environ.get(file_env), os.environ.get(env)
    if path and value:
        raise SecretError(f"both {env} and {file_env} are set: set one")
    if path:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise SecretError(f"{file_env}: cannot read the secret file: {type(exc).__name__}") from None
        if data.endswith(b"\r\n"):
            data = data[:-2]
        elif data.endswith(b"\n"):
            data = data[:-1]
        return check_secret(data, file_env)
    return check_secret((value or "").encode(), env)


def key_id(secret: bytes) -> str:
    """Public id of a secret: the first 8 hex digits of HMAC-SHA256(secret, "kid"). It tells which secret made a
    token (for rotation) and reveals nothing usable about the secret.

    >>> key_id(b"test-secret-0123456789abcdef0123456789")
    '51639562'
    """
    return hmac.new(secret, b"kid", hashlib.sha256).hexdigest()[:8]


def throwaway_secret() -> bytes:
    """A random secret for demos: tokens made with it can never be mapped back once the process ends."""
    return secrets.token_hex(32).encode()


def _hmac_hex(secret: bytes, label: bytes, value: str) -> str:
    return hmac.new(secret, label + value.encode(), hashlib.sha256).hexdigest()


def audit_token(secret: bytes, event_id: str) -> str:
    """Opaque token of one event: only a holder of the secret and the raw input can map it back."""
    return _hmac_hex(secret, b"audit:", event_id)


class HmacTokens:
    """Hex HMAC-SHA256 of ``label + text`` keyed with the secret, for many texts (hot paths: audit tokens, counterfeit
    tokens): 2-3x faster than one ``hmac`` object per text. The HMAC's inner and outer SHA-256 states are built once
    (RFC 2104) and copied per text.

    >>> HmacTokens(b"k" * 100, b"audit:")(["e1"]) == [audit_token(b"k" * 100, "e1")]
    True
    """

    BLOCK = 64     # SHA-256 block size

    def __init__(self, secret: bytes, label: bytes):
        key = hashlib.sha256(secret).digest() if len(secret) > self.BLOCK else secret
        key = key.ljust(self.BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._inner.update(label)
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def __call__(self, texts) -> list[str]:
        out: list[str] = []
        icopy, ocopy, append = self._inner.copy, self._outer.copy, out.append
        for text in texts:
            h = icopy()
            h.update(text.encode())
            o = ocopy()
            o.update(h.digest())
            append(o.hexdigest())
        return out


def pseudonym(secret: bytes, unit: str) -> str:
    """Keyed pseudonym of a privacy unit (for partitioning keys and state, never for output)."""
    return _hmac_hex(secret, b"unit:", unit)


def pseudonym_keys(secret: bytes, units) -> list[bytes]:
    """``pseudonym(secret, str(u)).encode()`` of each unit value: the Kafka keys a unit's events are produced
    under (:class:`HmacTokens`: the secret's HMAC states made once).

    >>> pseudonym_keys(b"s" * 32, [7, "c1"]) == [pseudonym(b"s" * 32, u).encode() for u in ("7", "c1")]
    True
    """
    return [t.encode() for t in HmacTokens(secret, b"unit:")([str(u) for u in units])]


def dp_noise_seed(secret: bytes, stream: str, partition: int, lineage: str | None = None) -> bytes:
    """Secret seed of the differential-privacy noise of one stream partition (HMAC of the stream secret).

    The aggregator derives each window's noise from it with a second HMAC over (aggregate, component, output,
    window), so a restarted worker re-publishes identical noise for a window and never fresh noise for the same
    data (which would let an observer average the noise away). Without the secret the noise is unpredictable. A new
    lineage (``lineage``) draws other noise: the same noise on other data would publish the data's difference.
    """
    where = f"{stream}:{partition}" if lineage is None else f"{stream}:{lineage}:{partition}"
    return hmac.new(secret, f"dp-noise:{where}".encode(), hashlib.sha256).digest()

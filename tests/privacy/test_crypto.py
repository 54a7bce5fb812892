"""Secret loading (file or environment), weak secrets refused, key id (issue 10 item 7)."""
from __future__ import annotations

import secrets

import pytest

from stream_anon import crypto


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(crypto.SECRET_ENV, raising=False)
    monkeypatch.delenv(crypto.SECRET_FILE_ENV, raising=False)
    return monkeypatch


@pytest.mark.parametrize("weak", [" " * 16, " " * 64, "a" * 16, "a" * 100, "abababababababababababab",
                                  "0123456789abcdef", "short", ""])
def test_weak_secrets_are_refused(env, weak):
    env.setenv(crypto.SECRET_ENV, weak)
    with pytest.raises(crypto.SecretError, match="STREAM_ANON_SECRET"):
        crypto.load_secret()


def test_random_secrets_pass(env):
    for _ in range(50):
        s = secrets.token_hex(32)
        env.setenv(crypto.SECRET_ENV, s)
        assert crypto.load_secret() == s.encode()
    env.setenv(crypto.SECRET_ENV, secrets.token_urlsafe(24))
    crypto.load_secret()


def test_secret_from_a_file(env, tmp_path):
    s = secrets.token_hex(32)
    path = tmp_path / "secret"
    path.write_text(s + "\n")
    env.setenv(crypto.SECRET_FILE_ENV, str(path))
    assert crypto.load_secret() == s.encode()          # one trailing newline removed
    path.write_text(" " * 40)
    with pytest.raises(crypto.SecretError, match="STREAM_ANON_SECRET_FILE.*too weak"):
        crypto.load_secret()
    env.setenv(crypto.SECRET_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(crypto.SecretError, match="cannot read the secret file: FileNotFoundError"):
        crypto.load_secret()


def test_file_and_environment_together_are_refused(env, tmp_path):
    path = tmp_path / "secret"
    path.write_text(secrets.token_hex(32))
    env.setenv(crypto.SECRET_FILE_ENV, str(path))
    env.setenv(crypto.SECRET_ENV, secrets.token_hex(32))
    with pytest.raises(crypto.SecretError, match="both"):
        crypto.load_secret()


def test_key_id_identifies_the_secret_without_revealing_it():
    a, b = secrets.token_hex(32).encode(), secrets.token_hex(32).encode()
    assert crypto.key_id(a) == crypto.key_id(a) and crypto.key_id(a) != crypto.key_id(b)
    assert len(crypto.key_id(a)) == 8 and crypto.key_id(a) not in a.decode()
    assert crypto.estimated_bits(b"0123456789abcdef" * 4) == 256.0      # an estimate: a repeated pattern fools it

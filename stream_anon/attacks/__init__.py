"""Attacks that measure what an adversary learns from published output (evaluation code, not enforcement).

Each attack works from the published records, the raw input and the secret only, so it can be run against any
anonymizer's output (ours or a naive one) and compared.
"""
from stream_anon.attacks.aoi import AOIResult, aoi_attack
from stream_anon.attacks.linkage import linkage_attack

__all__ = ["AOIResult", "aoi_attack", "linkage_attack"]

"""The contract checks shipped in the package (stream_anon.contract_checks) on every registered strategy,
criterion, former and DP aggregate kind, found from the registries; and the checks caught failing on a part built
to break its contract."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from stream_anon import contract_checks
from stream_anon.contract_checks import parts, registry

REGISTERED = [(kind, name) for kind, names in contract_checks.registered().items() for name in names]


@pytest.mark.parametrize("kind, name", REGISTERED, ids=[f"{k}-{n}" for k, n in REGISTERED])
def test_every_registered_part_keeps_its_contract(kind, name):
    parts.CHECKS[kind](name)


@pytest.mark.parametrize("name", sorted(registry.bundled()))
def test_every_bundled_streams_dead_letters_hold_no_more_than_its_output(name):
    assert contract_checks.check_deadletters(name) >= 3          # fields whose hostile value made a dead letter


def test_the_registries_are_read_not_listed():
    found = contract_checks.registered()
    from stream_anon.criteria.parse import KINDS as CRITERIA
    from stream_anon.dp.specs import KINDS as AGGREGATES
    from stream_anon.strategies import STRATEGIES
    assert found["strategy"] == sorted(STRATEGIES) and found["criterion"] == sorted(CRITERIA)
    assert found["aggregate"] == list(AGGREGATES)
    assert found["former"] == ["KAnonymousFormer", "MInvariantFormer"]        # Former itself is the protocol


class TooSmall:
    """A strategy breaking its contract: every record a class of its own (k = 1 whatever k)."""
    name = "too-small"
    uses_sensitive = False

    @dataclass(frozen=True)
    class Params:
        def check_config(self, sensitive, qi_names):
            pass

    def form_classes(self, X, units, k, space, rng, **extra):
        return [np.array([i]) for i in range(len(X))]


def test_a_strategy_forming_classes_below_k_fails_its_check(monkeypatch):
    from stream_anon.strategies import STRATEGIES
    monkeypatch.setitem(STRATEGIES, "too-small", TooSmall)
    assert "too-small" in contract_checks.registered()["strategy"]        # registered: checked, no list to edit
    with pytest.raises(AssertionError, match=r"strategy too-small: classes of \[1, 1"):
        contract_checks.check_strategy("too-small")


def test_a_criterion_without_a_sample_fails_its_check(monkeypatch):
    monkeypatch.delitem(registry.CRITERION_SAMPLES, "severity")
    with pytest.raises(AssertionError, match="criterion severity: no sample entry"):
        contract_checks.check_criterion("severity")

"""The :class:`~stream_anon.checkpoint.Checkpointable` contract on every stateful part: the package's own checks
(:mod:`stream_anon.contract_checks.checkpointable`: restore, change sets, no raw identifier, bounded core) on the
parts it finds from the registries (:func:`~stream_anon.contract_checks.checkpointable.factories`), and each check
caught failing on a part built to break it."""
from __future__ import annotations

import numpy as np
import pytest

from stream_anon.checkpoint import Checkpointable
from stream_anon.contract_checks.checkpointable import (CHECKS, Factory, check_changes_rebuild_the_full_state,
                                                        check_no_record_holds_a_raw_identifier,
                                                        check_restore_gives_the_same_next_output,
                                                        check_the_core_stays_bounded, factories, unit_id)

FACTORIES = factories()


def test_every_registered_former_and_aggregate_kind_has_a_part():
    from stream_anon.contract_checks import registered
    names = {f.name for f in FACTORIES}
    assert {f"engine/{former}" for former in registered()["former"]} <= names
    assert {f"dp-partition-aggregates/{kind}" for kind in registered()["aggregate"]} <= names


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: f.name)
def test_checkpointable_contract(factory: Factory, check) -> None:
    assert isinstance(factory.build(), Checkpointable)
    check(factory)


def test_the_checks_fail_on_a_part_that_breaks_the_contract():
    """Each check catches what it is for: a part keeping raw units in its core (c, d), a part whose restore forgets
    its position (a), a part whose change sets miss a deletion (b)."""
    from stream_anon.keyed_table import KeyedTable

    class Careless:
        def __init__(self, forget=False, hide_deletes=False):
            self.seen, self.n = [], 0
            self.table = KeyedTable([("n", "<u4")])
            self.forget, self.hide_deletes = forget, hide_deletes

        def state_core(self):
            return {"n": self.n, "seen": self.seen}

        def state_tables(self):
            return {"t": self.table}

        def load_state(self, core, tables):
            self.n, self.seen = (0 if self.forget else core["n"]), list(core["seen"])
            self.table.load(*tables.get("t", (np.empty(0, np.int64), np.empty(0, self.table.dtype))))

    def feed(part, batch):
        part.n += len(batch)
        part.seen = sorted(set(part.seen) | set(batch))
        keys = np.array([unit_id(u) for u in batch], dtype=np.int64)
        part.table.put(keys, np.ones(len(keys), dtype=part.table.dtype))
        if part.n > 100:
            gone = part.table.snapshot()[0][:3]
            if part.hide_deletes:             # removed behind the change tracking's back
                part.table.load(*[a[3:] for a in part.table.snapshot()])
                part.table.changes()
            else:
                part.table.delete(gone)
        return part.n

    batches = lambda pool: [pool[i::6] for i in range(6)]     # noqa: E731
    careless = Factory("careless", Careless, batches, feed, deletes=True)
    for check in (check_no_record_holds_a_raw_identifier, check_the_core_stays_bounded):
        with pytest.raises(AssertionError):
            check(careless)
    with pytest.raises(AssertionError):
        check_restore_gives_the_same_next_output(Factory("forgets", lambda: Careless(forget=True), batches, feed))
    with pytest.raises(AssertionError):
        check_changes_rebuild_the_full_state(Factory("hides", lambda: Careless(hide_deletes=True), batches, feed,
                                                     deletes=True))

"""The k each release was made under, read from the manifests alone.

A worker changes k only through an accepted configuration change (``stream-anon worker --accept-config-change``),
and writes the change into the next manifest of each partition (``settings_changed``: ``anonymization.k 10 -> 3``).
So the k in force is known per release without trusting the worker's ``k`` field: walking a partition's manifests
from the newest back, the k in force starts at the audit config's k and becomes the old side of every recorded
change. Each release is judged by that k; a manifest whose ``k`` differs from it (an unrecorded change, or the audit
given another config than the one in force) is a violation, and every recorded change is reported.

Published classes are never reused across an accepted change (the worker retires them), so a class is judged by the
k of the release that created it.

>>> ms = [{"release_id": "a", "partition": 0, "seq": 1, "k": 10},
...       {"release_id": "b", "partition": 0, "seq": 2, "k": 3, "settings_changed": ["anonymization.k 10 -> 3"]}]
>>> h = k_in_force(ms, 3)
>>> h.by_release, h.problems, h.changes[0]["change"]
({'b': 3, 'a': 10}, [], 'anonymization.k 10 -> 3')
>>> k_in_force(ms, 10).problems[0][0]
'manifest k differs from the k in force'
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

_K_CHANGE = re.compile(r"^anonymization\.k (\d+) -> (\d+)$")


@dataclass
class KInForce:
    """``by_release``: release id -> the k it was made under; ``changes``: the recorded k changes (partition,
    release id, change line); ``problems``: (violation name, details) for :class:`~.check.ViolationLog`."""

    by_release: dict = field(default_factory=dict)
    changes: list = field(default_factory=list)
    problems: list = field(default_factory=list)


def _seq(manifest: dict) -> float:
    seq = manifest.get("seq")
    return seq if isinstance(seq, (int, float)) and not isinstance(seq, bool) else float("inf")


def k_in_force(manifests, config_k: int) -> KInForce:
    """The k in force for every manifest's release (see the module docstring)."""
    out = KInForce()
    by_partition: dict = defaultdict(list)
    for m in manifests:
        by_partition[(m.get("stream"), m.get("partition"))].append(m)
    for (_, partition), ms in by_partition.items():
        current = config_k
        for m in sorted(ms, key=_seq, reverse=True):
            rid = m.get("release_id")
            if m.get("k") is not None and m.get("k") != current:
                out.problems.append(("manifest k differs from the k in force",
                                     {"release_id": rid, "manifest_k": m.get("k"), "k": current}))
            out.by_release[rid] = current
            for line in m.get("settings_changed") or []:
                match = _K_CHANGE.match(str(line))
                if match is None:
                    continue
                before, after = int(match.group(1)), int(match.group(2))
                out.changes.append({"partition": partition, "release_id": rid, "change": line})
                if after != current:
                    out.problems.append(("recorded k change does not lead to the k in force",
                                         {"release_id": rid, "change": line, "k": current}))
                current = before
    out.changes.reverse()
    return out

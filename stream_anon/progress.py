"""Progress on a terminal for the commands that read or compute for long (``audit``, ``report``): a tqdm bar on
stderr only when stderr is a terminal, nothing at all in a file or a pipe (a log or CI output stays clean)."""
from __future__ import annotations

import sys


def bar(desc: str, total: int | None = None, unit: str = "it"):
    """A tqdm bar on stderr, disabled (a no-op with the same methods) unless stderr is a terminal. Cleared when
    closed: the command's own output follows it."""
    from tqdm import tqdm
    return tqdm(desc=desc, total=total, unit=unit, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False,
                mininterval=0.2, dynamic_ncols=True)


def steps(items, desc: str, unit: str = "step"):
    """``items`` with a bar of their progress (:func:`bar`)."""
    items = list(items)
    with bar(desc, len(items), unit) as b:
        for item in items:
            yield item
            b.update(1)

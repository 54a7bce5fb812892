"""The audit's checks, one module each, all behind :class:`stream_anon.audit.check.Check`.

Privacy criteria judge measured numbers against the configured guarantee: :mod:`.k_individuals` (k in distinct
individuals), :mod:`.l_diversity` (distinct, entropy and frequency l-diversity), :mod:`.severity` (seed 003's
severity rule) and :mod:`.m_invariance` (m-uniqueness, one signature per individual). Integrity checks judge the
output against the input: :mod:`.leaks`, :mod:`.coverage`, :mod:`.accounting`, :mod:`.consistency` and
:mod:`.config_sanity`.
"""

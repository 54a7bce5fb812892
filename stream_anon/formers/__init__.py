"""Class formers: how a window's buffered records become a release's classes (``stream_anon.formers.base`` is the
contract with the engine's window core).

- :class:`~stream_anon.formers.kanon.KAnonymousFormer`: k distinct individuals per class, with a strategy from
  ``stream_anon.strategies``;
- :class:`~stream_anon.formers.minvariant.MInvariantFormer`: m-invariant classes with counterfeits (Xiao & Tao,
  SIGMOD 2007; the counterfeit arithmetic is in ``stream_anon.formers.counterfeits``).
"""

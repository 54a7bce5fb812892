"""Lookup tables of the [input] mapping (``lookup = "../lookups/<file>.csv"``): source value -> result."""

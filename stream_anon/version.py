"""The package's version, in a module of its own: the worker's modules name it without importing the package's
public face (``stream_anon/__init__.py`` sits on the top floor, tests/cli/test_architecture.py)."""
__version__ = "0.1.0"

"""The epctx version (in a module of its own, so any layer can read it)."""

__version__ = "0.1.0"

"""Execution providers: the EP API (base), the registry, and one folder per backend."""

"""A skip for tests whose packages are not installed, decided without importing them (``pytest.importorskip`` at
module level imports torch or IREE's compiler while collecting, even for `make test-fast`, which runs none of
those tests)."""

from __future__ import annotations

import importlib.util

import pytest


def requires(*modules: str) -> pytest.MarkDecorator:
    """Skip unless every module is installed (found, not imported)."""
    missing = [m for m in modules if _missing(m)]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True

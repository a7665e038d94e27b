"""CPU kernels: quant (see registry.kernel)."""

from __future__ import annotations

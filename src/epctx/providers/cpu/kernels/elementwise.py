"""CPU kernels: elementwise (see registry.kernel)."""

from __future__ import annotations

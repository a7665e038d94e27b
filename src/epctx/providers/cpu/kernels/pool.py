"""CPU kernels: pool (see registry.kernel)."""

from __future__ import annotations

"""CPU kernels: conv (see registry.kernel)."""

from __future__ import annotations

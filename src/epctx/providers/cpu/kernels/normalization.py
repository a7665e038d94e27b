"""CPU kernels: normalization (see registry.kernel)."""

from __future__ import annotations

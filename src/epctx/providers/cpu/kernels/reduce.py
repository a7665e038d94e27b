"""CPU kernels: reduce (see registry.kernel)."""

from __future__ import annotations

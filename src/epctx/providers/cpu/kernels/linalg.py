"""CPU kernels: linalg (see registry.kernel)."""

from __future__ import annotations

"""CPU kernels: resize (see registry.kernel)."""

from __future__ import annotations

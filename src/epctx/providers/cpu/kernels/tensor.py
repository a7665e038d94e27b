"""CPU kernels: tensor (see registry.kernel)."""

from __future__ import annotations

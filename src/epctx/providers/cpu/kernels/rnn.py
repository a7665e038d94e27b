"""CPU kernels: rnn (see registry.kernel)."""

from __future__ import annotations

"""The CPU execution provider: numpy kernels for every standard op."""

from epctx.providers.cpu.provider import CPUExecutionProvider

__all__ = ["CPUExecutionProvider"]

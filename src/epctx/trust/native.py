"""Which context payloads carry native code, decided from the EPContext node's ``source`` (no byte is read).

IREE's llvm-cpu modules hold machine code the runtime maps and runs. OpenVINO blobs may hold device kernels
(GPU / NPU) and are counted as native. The Example EP's payloads are programs its interpreter runs: data.
An EP epctx does not know is native: ``require-native`` never guesses in an attacker's favour."""

from __future__ import annotations

__all__ = ["carries_native_code"]

_DATA_ONLY = frozenset({"ExampleExecutionProvider", "CPUExecutionProvider"})


def carries_native_code(source: str | None) -> bool:
    return (source or "") not in _DATA_ONLY

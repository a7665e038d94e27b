"""Provider options of the OpenVINO EP, parsed and checked once, and the OpenVINO properties they give.

| option | default | meaning |
|---|---|---|
| ``device_type`` | ``CPU`` | OpenVINO device (``CPU``, ``GPU``, ``GPU.1``, ``NPU``); must be in ``Core.available_devices`` |
| ``precision`` | ``f32`` on CPU, the device's own otherwise | ``f32``, ``f16``, ``bf16`` (``INFERENCE_PRECISION_HINT``) |
| ``num_streams`` | OpenVINO's | ``NUM_STREAMS`` (a positive integer) |
| ``num_of_threads`` | OpenVINO's | ``INFERENCE_NUM_THREADS`` (a positive integer) |
| ``cache_dir`` | off | OpenVINO's own model cache folder (``CACHE_DIR``), passed through when compiling |
| ``weightless`` | ``0`` | 1: blobs reference their weights, entries of the context binary mapped in place at load |
| ``disabled_ops`` | none | comma-separated op types never claimed (they fall back to the next EP) |

The precision and the stream / thread settings are recorded in the context binary and passed again on
import, so a loaded blob computes as the compiled one did; ``num_streams`` / ``num_of_threads`` given to the
loading EP override the recorded ones (they tune speed, not results).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from epctx.errors import InvalidArgument

__all__ = ["OPTIONS", "OpenVINOOptions", "parse_options"]

OPTIONS = (
    "device_type",
    "precision",
    "num_streams",
    "num_of_threads",
    "cache_dir",
    "weightless",
    "disabled_ops",
)
_PRECISIONS = {"f32": "f32", "fp32": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"}
_NAME = "OpenVINOExecutionProvider"


@dataclasses.dataclass(frozen=True, slots=True)
class OpenVINOOptions:
    device: str = "CPU"
    precision: str | None = "f32"  # None: the device's default
    num_streams: int | None = None
    num_threads: int | None = None
    cache_dir: str | None = None
    weightless: bool = False
    disabled_ops: frozenset[str] = frozenset()

    def runtime_config(self) -> dict[str, Any]:
        """Properties that shape how a compiled model runs: given to compile_model and import_model alike."""
        config: dict[str, Any] = {}
        if self.precision is not None:
            config["INFERENCE_PRECISION_HINT"] = self.precision
        if self.num_streams is not None:
            config["NUM_STREAMS"] = self.num_streams
        if self.num_threads is not None:
            config["INFERENCE_NUM_THREADS"] = self.num_threads
        return config

    def compile_config(self) -> dict[str, Any]:
        config = self.runtime_config()
        if self.cache_dir is not None:
            config["CACHE_DIR"] = self.cache_dir
        if self.weightless:
            config["CACHE_MODE"] = "OPTIMIZE_SIZE"
        return config


def _positive(options: Mapping[str, str], key: str) -> int | None:
    raw = options.get(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidArgument(f"{_NAME} option {key!r}: expected a positive integer, got {raw!r}")
    return value


def _flag(options: Mapping[str, str], key: str) -> bool:
    raw = options.get(key, "0").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off", ""):
        return False
    raise InvalidArgument(f"{_NAME} option {key!r}: expected 0 or 1, got {options[key]!r}")


def parse_options(options: Mapping[str, str]) -> OpenVINOOptions:
    """Check the provider options (all str); an unknown option or a bad value is InvalidArgument."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidArgument(
            f"{_NAME}: unknown provider option(s) {unknown}; valid options: {list(OPTIONS)}"
        )
    device = options.get("device_type", "CPU").strip().upper() or "CPU"
    if "precision" in options:
        key = options["precision"].strip().lower()
        if key not in _PRECISIONS:
            raise InvalidArgument(
                f"{_NAME} option 'precision': expected one of {sorted(set(_PRECISIONS.values()))}, "
                f"got {options['precision']!r}"
            )
        precision: str | None = _PRECISIONS[key]
    else:
        precision = "f32" if device == "CPU" else None  # bf16 on CPUs that have it drifts up to 1e-2
    cache_dir = options.get("cache_dir") or None
    disabled = frozenset(op.strip() for op in options.get("disabled_ops", "").split(",") if op.strip())
    return OpenVINOOptions(
        device=device,
        precision=precision,
        num_streams=_positive(options, "num_streams"),
        num_threads=_positive(options, "num_of_threads"),
        cache_dir=cache_dir,
        weightless=_flag(options, "weightless"),
        disabled_ops=disabled,
    )

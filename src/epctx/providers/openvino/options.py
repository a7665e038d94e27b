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

from epctx.ep import Option
from epctx.ep import parse_options as parse_declared

__all__ = ["OPTIONS", "OpenVINOOptions", "parse_options"]

_NAME = "OpenVINOExecutionProvider"
OPTIONS = (
    Option("device_type", "str", default="CPU", doc="OpenVINO device (CPU, GPU, GPU.1, NPU)", field="device"),
    Option(
        "precision",
        "choice",
        choices={"f32": "f32", "fp32": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"},
        doc="INFERENCE_PRECISION_HINT; default f32 on CPU, the device's own otherwise",
    ),
    Option("num_streams", "int", doc="NUM_STREAMS (a positive integer)"),
    Option("num_of_threads", "int", doc="INFERENCE_NUM_THREADS (a positive integer)", field="num_threads"),
    Option("cache_dir", "str", doc="OpenVINO's own model cache folder (CACHE_DIR), when compiling"),
    Option("weightless", "bool", default=False, doc="blobs reference their weights, entries of the binary"),
    Option("disabled_ops", "list", default=frozenset(), doc="op types never claimed"),
)


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


def parse_options(options: Mapping[str, str]) -> OpenVINOOptions:
    """Check the provider options (all str); an unknown option or a bad value is InvalidArgument."""
    config = parse_declared(_NAME, options, OPTIONS, into=OpenVINOOptions)
    device = config.device.upper()
    precision = config.precision
    if precision is None:
        precision = "f32" if device == "CPU" else None  # bf16 on CPUs that have it drifts up to 1e-2
    return dataclasses.replace(config, device=device, precision=precision)

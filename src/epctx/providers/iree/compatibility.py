"""The IREE EP's compatibility string and verdicts (no IREE import: the version comes from the installed
runtime's ``dist-info`` name, the CPU's features from the OS).

The string (``ep_compatibility_info.IREEExecutionProvider``)::

    sdk=iree-3.13.0;triple=x86_64-unknown-linux-gnu;features=avx,avx2,...;target=host;opt_level=O2;
    channels_last=1;fast_codegen=auto;depthwise_rewrite=1;flags=<sha-256 prefix of the extra iree-compile flags, or empty>

Verdicts against one device (the worst over several):

- another IREE release: UNSUPPORTED (a ``.vmfb`` loads only in the runtime release that compiled it);
- another triple (aarch64 code on x86-64), or CPU features the device lacks: UNSUPPORTED (IREE does not check:
  the code would die on an illegal instruction);
- features the device has and the code does not use (x86-64-v2 code on an AVX-512 CPU):
  SUPPORTED_PREFER_RECOMPILATION (it runs, slower);
- otherwise SUPPORTED_OPTIMAL.

A device is this machine's CPU, or a virtual CPU of the IREE library (metadata ``target`` names a preset).
The older ``sdk=...;hardware=<triple>;<features>`` string (context models written before) is read too.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from epctx.ep import (
    CompatibilityVerdict,
    DeviceIncompatibility,
    HardwareDevice,
    HardwareDeviceType,
    OrtDeviceEpIncompatibilityReason,
    format_info,
    installed_version,
    parse_info,
    parse_own_info,
)
from epctx.errors import InvalidGraph
from epctx.providers.iree.targets import PRESETS, Target, host_features, host_triple, parse_hardware

__all__ = ["compatibility_info", "device_incompatibility", "iree_version", "options_from_info", "validate"]

_SDK = "iree-"
_RECOMPILE_HERE = "recompile the context from its source model on this machine (IREE option target=host)"


@functools.cache
def iree_version() -> str:
    """The installed IREE runtime's version, from its package's ``dist-info`` name (nothing of IREE is
    imported; ``importlib.metadata`` costs a few ms of imports on the load path), else ``importlib.metadata``."""
    found = installed_version("iree", "iree-base-runtime", "iree-runtime")
    if found is not None:
        return found
    from importlib import metadata

    for name in ("iree-base-runtime", "iree-runtime"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def compatibility_info(
    target: Target,
    opt_level: str,
    channels_last: bool,
    compile_flags: str,
    fast_codegen: str = "auto",
    depthwise_rewrite: bool = True,
) -> str:
    """The string written at compile: the SDK, the target and every option that changes the code."""
    flags = hashlib.sha256(compile_flags.encode()).hexdigest()[:16] if compile_flags.strip() else ""
    return format_info(
        {
            "sdk": f"{_SDK}{iree_version()}",
            "triple": target.triple,
            "features": ",".join(sorted(target.features)),
            "target": target.name,
            "opt_level": opt_level,
            "channels_last": "1" if channels_last else "0",
            "fast_codegen": fast_codegen,
            "depthwise_rewrite": "1" if depthwise_rewrite else "0",
            "flags": flags,
        }
    )


def validate(info: str, devices: Sequence[HardwareDevice]) -> CompatibilityVerdict:
    """The verdict for ``info`` on ``devices`` (none: this machine's CPU)."""
    fields, foreign = parse_own_info(info, _SDK, "IREE")
    if foreign is not None:
        return foreign
    sdk = fields["sdk"]
    here = iree_version()
    if sdk != f"{_SDK}{here}":
        return CompatibilityVerdict.unsupported(
            f"compiled by IREE {sdk.removeprefix(_SDK)}, this is IREE {here}",
            advice=f"IREE modules load only in the release that compiled them: {_RECOMPILE_HERE}",
        )
    try:
        triple, features = _target_of(fields)
    except InvalidGraph as exc:
        return CompatibilityVerdict.unsupported(str(exc))
    target = fields.get("target", "")
    judged: list[HardwareDevice | None] = [*devices] or [None]  # none given: this machine
    return CompatibilityVerdict.worst(_judge(triple, features, target, d) for d in judged)


def _target_of(fields: dict[str, str]) -> tuple[str, frozenset[str]]:
    if "triple" in fields:
        return fields["triple"], frozenset(f for f in fields.get("features", "").split(",") if f)
    return parse_hardware(fields.get("hardware", ""), "IREE compatibility info")


def _judge(
    triple: str, features: frozenset[str], target: str, device: HardwareDevice | None
) -> CompatibilityVerdict:
    where, here_triple, here_features = "this CPU", host_triple(), host_features()
    if device is not None:
        if device.type != HardwareDeviceType.CPU:
            return CompatibilityVerdict.unsupported(
                f"the device is a {device.type.name}: IREE's llvm-cpu code runs on CPUs"
            )
        preset = PRESETS.get(device.metadata.get("target", "")) if device.is_virtual else None
        if preset is not None:
            where, here_triple, here_features = (
                f"the virtual {preset.name} CPU",
                preset.triple,
                preset.features,
            )
    compiled_for = f"target {target}" if target else "its target"
    if triple != here_triple:
        return CompatibilityVerdict.unsupported(
            f"compiled for {triple}, {where} is {here_triple}",
            advice=f"run it on a CPU of that triple, or {_RECOMPILE_HERE}",
        )
    lacking = sorted(features - here_features)
    if lacking:
        return CompatibilityVerdict.unsupported(
            f"needs {', '.join(lacking)} which {where} lacks ({compiled_for})",
            advice=f"{_RECOMPILE_HERE}, or compile for a target preset this CPU has",
        )
    unused = sorted(here_features - features)
    if unused:
        return CompatibilityVerdict.prefer_recompilation(
            f"compiled for {compiled_for} ({len(features)} CPU features); {where} also has "
            f"{', '.join(unused)}, which the code does not use",
            advice=f"it runs, slower than it could: {_RECOMPILE_HERE}",
        )
    return CompatibilityVerdict.optimal()


def device_incompatibility(device: HardwareDevice) -> DeviceIncompatibility:
    if device.type != HardwareDeviceType.CPU:
        return DeviceIncompatibility(
            int(OrtDeviceEpIncompatibilityReason.DEVICE_INCOMPATIBLE),
            f"IREEExecutionProvider compiles for CPUs (llvm-cpu); this device is a {device.type.name}",
        )
    return DeviceIncompatibility()


def options_from_info(info: str) -> dict[str, str]:
    """The provider options the string records (target, opt_level, channels_last,
    fast_codegen, depthwise_rewrite); the extra compile flags are
    recorded as a digest only, so they cannot be recovered."""
    fields = parse_info(info)
    return {
        k: fields[k]
        for k in ("target", "opt_level", "channels_last", "fast_codegen", "depthwise_rewrite")
        if fields.get(k)
    }

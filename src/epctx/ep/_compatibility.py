"""Compatibility verdicts: how an EP judges a context it (or another build of it) compiled, against devices.

ONNX Runtime's model (1.23+): at compile each EP writes a *compatibility string* as model metadata
``ep_compatibility_info.<EP>``; later, given that string and the devices a session would use, the EP answers
one of :class:`OrtCompiledModelCompatibility`. epctx's verdicts also say *why*: each reason names what differs,
what the context was compiled with and what is here ("compiled by IREE 3.12.0, this is IREE 3.13.0"), and
the advice says what to do. A verdict reads only the string (and the devices): never a payload, never a backend.

The strings epctx's EPs write are ``key=value`` items joined by ``;`` (:func:`format_info` /
:func:`parse_info`); any other EP may write what it likes: only its own validator reads it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "METADATA_PREFIX",
    "CompatibilityVerdict",
    "DeviceIncompatibility",
    "OrtCompiledModelCompatibility",
    "OrtDeviceEpIncompatibilityReason",
    "format_info",
    "installed_version",
    "judge_node",
    "node_info",
    "parse_info",
    "parse_own_info",
]

# (compatibility string, hardware devices) -> verdict: an EP's validate_compatibility_info
Validator = Callable[[str, Sequence[Any]], "CompatibilityVerdict"]

METADATA_PREFIX = "ep_compatibility_info."  # onnxruntime's kOrtModelMetadata_EpCompatibilityInfoPrefix


class OrtCompiledModelCompatibility(enum.IntEnum):
    """onnxruntime's ``OrtCompiledModelCompatibility`` (same names and values; larger is worse)."""

    __str__ = enum.Enum.__str__  # "OrtCompiledModelCompatibility.EP_UNSUPPORTED", as onnxruntime prints it

    EP_NOT_APPLICABLE = 0
    EP_SUPPORTED_OPTIMAL = 1
    EP_SUPPORTED_PREFER_RECOMPILATION = 2
    EP_UNSUPPORTED = 3


class OrtDeviceEpIncompatibilityReason(enum.IntEnum):
    """onnxruntime's ``OrtDeviceEpIncompatibilityReason`` (same names and values; bits of a mask)."""

    __str__ = enum.Enum.__str__

    NONE = 0
    DRIVER_INCOMPATIBLE = 1
    DEVICE_INCOMPATIBLE = 2
    MISSING_DEPENDENCY = 4
    UNKNOWN = -(2**31)  # the high bit, as onnxruntime's Python binding reports it


_SHORT = {
    OrtCompiledModelCompatibility.EP_NOT_APPLICABLE: "not applicable",
    OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL: "optimal",
    OrtCompiledModelCompatibility.EP_SUPPORTED_PREFER_RECOMPILATION: "runs, recompiling is better",
    OrtCompiledModelCompatibility.EP_UNSUPPORTED: "unsupported",
}


@dataclasses.dataclass(frozen=True, slots=True)
class CompatibilityVerdict:
    """An EP's answer for one compatibility string: the state, what differs (``reasons``: one sentence each,
    compiled -> here), and what to do (``advice``; empty when nothing is to be done)."""

    status: OrtCompiledModelCompatibility
    reasons: tuple[str, ...] = ()
    advice: str = ""

    @classmethod
    def optimal(cls, *notes: str) -> CompatibilityVerdict:
        return cls(OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL, tuple(notes))

    @classmethod
    def not_applicable(cls, why: str = "") -> CompatibilityVerdict:
        return cls(OrtCompiledModelCompatibility.EP_NOT_APPLICABLE, (why,) if why else ())

    @classmethod
    def unsupported(cls, *reasons: str, advice: str = "") -> CompatibilityVerdict:
        return cls(OrtCompiledModelCompatibility.EP_UNSUPPORTED, tuple(reasons), advice)

    @classmethod
    def prefer_recompilation(cls, *reasons: str, advice: str = "") -> CompatibilityVerdict:
        return cls(OrtCompiledModelCompatibility.EP_SUPPORTED_PREFER_RECOMPILATION, tuple(reasons), advice)

    @property
    def name(self) -> str:
        """The state's name without ``EP_`` (``SUPPORTED_OPTIMAL``), as onnxruntime logs it."""
        return self.status.name.removeprefix("EP_")

    def summary(self) -> str:
        """The state and the reasons: ``UNSUPPORTED: compiled by IREE 3.12.0, this is IREE 3.13.0``."""
        return f"{self.name}: {'; '.join(self.reasons)}" if self.reasons else self.name

    def explain(self) -> str:
        """One line: the state, the reasons, the advice."""
        text = self.summary() if self.reasons else f"{self.name} ({_SHORT[self.status]})"
        return f"{text} (what to do: {self.advice})" if self.advice else text

    @staticmethod
    def worst(verdicts: Iterable[CompatibilityVerdict]) -> CompatibilityVerdict:
        """The worst of several verdicts (one per device), with the reasons of every verdict of that state."""
        items = list(verdicts)
        if not items:
            return CompatibilityVerdict.not_applicable("no device to judge against")
        status = max(v.status for v in items)
        same = [v for v in items if v.status == status]
        reasons = tuple(dict.fromkeys(r for v in same for r in v.reasons))
        advice = next((v.advice for v in same if v.advice), "")
        return CompatibilityVerdict(status, reasons, advice)


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceIncompatibility:
    """Why an EP cannot use a hardware device (``OrtDeviceEpIncompatibilityDetails``): ``reasons`` is a mask
    of :class:`OrtDeviceEpIncompatibilityReason` (0: no known incompatibility)."""

    reasons: int = 0
    notes: str = ""
    error_code: int = 0

    def as_dict(self) -> dict[str, object]:
        """As onnxruntime's ``get_hardware_device_ep_incompatibility_details`` returns it."""
        return {"reasons_bitmask": self.reasons, "notes": self.notes, "error_code": self.error_code}


def format_info(fields: Mapping[str, str]) -> str:
    """``key=value;key=value`` in the order given; values must not hold ``;``."""
    for key, value in fields.items():
        if ";" in key or "=" in key or ";" in value:
            raise ValueError(f"compatibility info item {key!r}={value!r} holds a separator")
    return ";".join(f"{k}={v}" for k, v in fields.items())


def parse_info(info: str) -> dict[str, str]:
    """The items of a ``key=value;...`` string. An item without ``=`` continues the value before it (the
    older ``sdk=...;hardware=<triple>;<features>`` form epctx wrote, whose hardware holds a ``;``)."""
    fields: dict[str, str] = {}
    last: str | None = None
    for item in info.split(";"):
        key, sep, value = item.partition("=")
        if sep and key:
            fields[key] = value
            last = key
        elif last is not None:
            fields[last] += f";{item}"
    return fields


def parse_own_info(
    info: str, sdk_prefix: str, ep_label: str
) -> tuple[dict[str, str], CompatibilityVerdict | None]:
    """``info``'s items, and UNSUPPORTED when its ``sdk`` item is not this EP's (``sdk_prefix``): the first step
    of every EP's judge."""
    fields = parse_info(info)
    sdk = fields.get("sdk", "")
    if sdk.startswith(sdk_prefix):
        return fields, None
    return fields, CompatibilityVerdict.unsupported(
        f"not an {ep_label} compatibility string (sdk {sdk or 'missing'!r})",
        advice="it was written by another EP: load it with that EP",
    )


@functools.cache
def installed_version(package: str, *distributions: str) -> str | None:
    """The version of the installed distribution that provides ``package``, read from the name of its
    ``<distribution>-<version>.dist-info`` folder (nothing of the package is imported); None if not found."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if spec is not None and spec.origin and not locations:
        locations = [spec.origin]
    for location in locations:
        try:
            names = os.listdir(os.path.dirname(location))
        except OSError:
            continue
        for dist in distributions:
            prefix = dist.replace("-", "_") + "-"
            found = sorted(n for n in names if n.startswith(prefix) and n.endswith(".dist-info"))
            if len(found) == 1:
                return found[0][len(prefix) : -len(".dist-info")]
    return None


def node_info(ep_name: str, metadata: Mapping[str, str], sdk_version: str, hardware: str) -> tuple[str, bool]:
    """(the string to judge a node by, whether it comes from the model's metadata)."""
    recorded = metadata.get(METADATA_PREFIX + ep_name)
    if recorded is not None:
        return recorded, True
    return f"sdk={sdk_version};hardware={hardware}", False


def judge_node(
    info: str, from_metadata: bool, binary_sdk: str, validate: Validator, devices: Sequence[Any]
) -> CompatibilityVerdict:
    """The verdict of one node's binary (made with ``binary_sdk``, from its header) for ``devices``."""
    recorded = parse_info(info).get("sdk") if from_metadata else None
    if recorded is not None and binary_sdk and recorded != binary_sdk:
        return CompatibilityVerdict.unsupported(
            f"the binary was made by {binary_sdk}, the model's metadata says {recorded} (was the binary replaced?)",
            advice="regenerate the context model together with its binary",
        )
    return validate(info, devices)

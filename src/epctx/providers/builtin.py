"""Built-in EPs, found by their folder under ``epctx/providers/`` (see ``registry.py`` for the declaration), and
``ClassEpFactory``, the factory that wraps an EP class (built-in or ``register_provider_class``)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx.errors import InvalidArgument

if TYPE_CHECKING:
    from epctx.ep import (
        CompatibilityVerdict,
        DeviceIncompatibility,
        EpDevice,
        ExecutionProvider,
        HardwareDevice,
    )

__all__ = [
    "BuiltinDeclaration",
    "ClassEpFactory",
    "builtin",
    "builtin_class",
    "builtin_declarations",
    "builtin_factory",
    "resolve",
    "resolve_lazily",
]


@dataclasses.dataclass(frozen=True)
class BuiltinDeclaration:
    """What a folder under ``epctx/providers/`` declares in its ``__init__.py`` (no import of the backend)."""

    folder: str
    name: str
    cls: str  # "module:Class"
    vendor: str = "epctx"
    requires: tuple[str, ...] = ()
    devices: str | None = None  # "module:function": (ep_name, ep_vendor, hardware) -> list[EpDevice]
    hardware: str | None = None  # "module:function": () -> list[HardwareDevice]
    by_policy: bool = True  # False: selection policies never pick it (it is used when asked for by name)
    payloads: str | None = None  # "module:function": (data: memoryview) -> PayloadInfo | None (epctx inspect)
    library: str | None = (
        None  # module of a plugin library bringing this EP: registered, it replaces the folder
    )
    # module with validate(info, devices) and optionally device_incompatibility(device): the EP's verdicts,
    # reached without importing the EP's class (the class's classmethods are used when absent)
    compatibility: str | None = None

    def missing(self) -> list[str]:
        """Required modules that are not installed."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


@functools.cache
def builtin_declarations() -> tuple[BuiltinDeclaration, ...]:
    """The built-in EPs, one per folder, in folder order (imports each folder's import-free ``__init__``)."""
    folders = list(sys.modules[__package__].__path__)  # this folder (tests may extend the package's path)
    found = []
    for info in sorted(pkgutil.iter_modules(folders), key=lambda i: i.name):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        name = getattr(module, "EP_NAME", None)
        if name is None:
            continue  # a helper package, not an EP
        target = getattr(module, "EP_CLASS", None)
        if not isinstance(name, str) or not isinstance(target, str) or ":" not in target:
            raise InvalidArgument(
                f"EP folder {module.__name__!r}: EP_NAME must be a string and EP_CLASS 'module:Class', got "
                f"{name!r} and {target!r}"
            )
        found.append(
            BuiltinDeclaration(
                folder=info.name,
                name=name,
                cls=target,
                vendor=str(getattr(module, "EP_VENDOR", "epctx")),
                requires=tuple(getattr(module, "EP_REQUIRES", ())),
                devices=getattr(module, "EP_DEVICES", None),
                hardware=getattr(module, "EP_HARDWARE", None),
                by_policy=bool(getattr(module, "EP_BY_POLICY", True)),
                payloads=getattr(module, "EP_PAYLOADS", None),
                library=getattr(module, "EP_LIBRARY", None),
                compatibility=getattr(module, "EP_COMPATIBILITY", None),
            )
        )
    return tuple(found)


def resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def builtin(name: str) -> BuiltinDeclaration | None:
    return next((d for d in builtin_declarations() if d.name == name), None)


# -- factories -------------------------------------------------------------------------------------------
class ClassEpFactory:
    """The default factory of an EP class (built-in or ``register_provider_class``): serves the CPU unless a
    ``devices`` hook says otherwise; ``create_ep`` passes the chosen device's ``ep_options`` then the session's
    options to the class."""

    def __init__(
        self,
        ep_name: str,
        ep_vendor: str,
        load_class: Callable[[], type[ExecutionProvider]],
        devices: Callable[[str, str, Sequence[HardwareDevice]], list[EpDevice]] | None = None,
        compatibility: str | None = None,
    ) -> None:
        self._name = ep_name
        self._vendor = ep_vendor
        self._load_class = load_class
        self._devices = devices
        self._compatibility = compatibility

    @property
    def ep_name(self) -> str:
        return self._name

    @property
    def ep_vendor(self) -> str:
        return self._vendor

    def get_supported_devices(self, hardware_devices: Sequence[HardwareDevice]) -> list[EpDevice]:
        if self._devices is not None:
            return list(self._devices(self._name, self._vendor, hardware_devices))
        from epctx._version import __version__
        from epctx.ep import EpDevice, HardwareDeviceType

        return [
            EpDevice(self._name, self._vendor, {"version": __version__}, {}, hw)
            for hw in hardware_devices
            if hw.type == HardwareDeviceType.CPU and not hw.is_virtual
        ]

    def create_ep(self, ep_devices: Sequence[EpDevice], ep_options: Mapping[str, str]) -> ExecutionProvider:
        options: dict[str, str] = {}
        for device in ep_devices:
            for key, value in device.ep_options.items():
                if options.get(key, value) != value:
                    raise InvalidArgument(
                        f"{self._name} runs on one device per session: devices with {key}={options[key]!r} "
                        f"and {key}={value!r} were both selected"
                    )
                options[key] = value
        options.update({k: str(v) for k, v in ep_options.items()})
        return self._load_class()(options)

    def validate_compatibility_info(
        self, info: str, devices: Sequence[HardwareDevice]
    ) -> CompatibilityVerdict:
        """The EP's verdict on a compatibility string (its folder's ``EP_COMPATIBILITY`` module, else its
        class's classmethod)."""
        if self._compatibility is not None:
            return resolve(f"{self._compatibility}:validate")(info, devices)  # type: ignore[no-any-return]
        return self._load_class().validate_compatibility_info(info, devices)

    def device_incompatibility(self, device: HardwareDevice) -> DeviceIncompatibility:
        if self._compatibility is not None:
            module = importlib.import_module(self._compatibility)
            hook = getattr(module, "device_incompatibility", None)
            if hook is not None:
                return hook(device)  # type: ignore[no-any-return]
        return self._load_class().device_incompatibility(device)

    def __repr__(self) -> str:
        return f"ClassEpFactory({self._name!r})"


@functools.cache
def builtin_factory(decl: BuiltinDeclaration) -> ClassEpFactory:
    devices = resolve_lazily(decl.devices) if decl.devices else None
    return ClassEpFactory(decl.name, decl.vendor, lambda: builtin_class(decl), devices, decl.compatibility)


def resolve_lazily(target: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return resolve(target)(*args)

    return call


def builtin_class(decl: BuiltinDeclaration) -> type[ExecutionProvider]:
    missing = decl.missing()
    if missing:
        raise InvalidArgument(
            f"execution provider {decl.name!r} needs the Python package(s) {', '.join(missing)}, which are not "
            "installed (pip install 'epctx[...]' with the matching extra)"
        )
    cls: type[ExecutionProvider] = resolve(decl.cls)
    return cls

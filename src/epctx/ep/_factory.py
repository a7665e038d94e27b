"""The version of the EP authors' API (``EP_API_VERSION``), the check a plugin library's factories pass at
registration, and ``PluginEpFactory``, the base that holds what every plugin factory would otherwise copy.

**Compatibility rule.** ``EP_API_VERSION`` is ``"major.minor"``. A minor release of the API only adds (a new
optional hook, a new export, a new field with a default); a major release changes or removes something. A
factory declares the version it was written for (``ep_api_version``); it is registered when its major is this
API's major and its minor is not newer than this API's minor ("2.0" loads in 2.0, 2.1, 2.7; not in 1.x, not
in 3.0). Anything else is ``epctx.errors.IncompatibleEPApi`` when the library is registered, naming both
versions, never a failure later in a session."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from epctx.ep._devices import device_options
from epctx.errors import IncompatibleEPApi

if TYPE_CHECKING:
    from epctx.ep._contract import ExecutionProvider
    from epctx.ep._devices import EpDevice, HardwareDevice

__all__ = [
    "EP_API_VERSION",
    "PluginEpFactory",
    "check_api_version",
]

EP_API_VERSION = "2.0"


def _parsed(version: object) -> tuple[int, int] | None:
    if not isinstance(version, str):
        return None
    major, dot, minor = version.partition(".")
    if not dot or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def check_api_version(declared: object, where: str) -> None:
    """IncompatibleEPApi unless ``declared`` (a factory's ``ep_api_version``) is one this API serves."""
    ours = _parsed(EP_API_VERSION)
    assert ours is not None
    theirs = _parsed(declared)
    if declared is None:
        raise IncompatibleEPApi(
            f"{where} declares no EP API version: set ep_api_version = {EP_API_VERSION!r} on the factory "
            "(epctx.ep.EP_API_VERSION when written; epctx.ep.PluginEpFactory asks for it)"
        )
    if theirs is None:
        raise IncompatibleEPApi(f"{where}: ep_api_version must be a 'major.minor' string, got {declared!r}")
    if theirs[0] != ours[0] or theirs[1] > ours[1]:
        raise IncompatibleEPApi(
            f"{where} was written for EP API {declared}, this epctx serves EP API {EP_API_VERSION} "
            f"(a library written for {ours[0]}.0 to {EP_API_VERSION} loads): "
            + ("update epctx" if theirs > ours else "port the library to this API (docs/ep-authors.md)")
        )


class PluginEpFactory:
    """The base of a plugin library's factory (``epctx.ep.EpFactory``). A subclass sets four class attributes
    and the library exports the classmethod:

        class MyFactory(PluginEpFactory):
            ep_name = "MyExecutionProvider"
            ep_vendor = "Me"
            ep_api_version = "2.0"          # the EP_API_VERSION this was written for (required)
            ep_class = "my_ep.provider:MyExecutionProvider"   # or the class itself

        create_ep_factories = MyFactory.create_ep_factories

    What it does: one factory per library, ``allow_virtual`` from the registration (a name ending in
    ``.virtual``), one ``EpDevice`` per real CPU (``devices`` to say otherwise, ``device_metadata`` for their
    metadata), ``virtual_devices()`` added when virtual devices are allowed, and ``create_ep`` merging the
    chosen devices' ``ep_options`` under the session's before ``make_ep(options, devices)`` (default: the EP
    class with the options; the class, when named by a string, is imported then). The optional verdict hooks
    (``validate_compatibility_info``, ``device_incompatibility``) and ``detect_payload`` stay optional: define
    them on the subclass to have them."""

    ep_name: ClassVar[str]
    ep_vendor: ClassVar[str]
    ep_api_version: ClassVar[str]
    ep_class: ClassVar[str | type[ExecutionProvider]]
    device_metadata: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, registration_name: str = "", env_config: Mapping[str, str] | None = None) -> None:
        from epctx.ep._devices import ALLOW_VIRTUAL_DEVICES

        self.registration_name = registration_name
        self.env_config: Mapping[str, str] = MappingProxyType(dict(env_config or {}))
        self.allow_virtual = self.env_config.get(ALLOW_VIRTUAL_DEVICES) == "1"

    @classmethod
    def create_ep_factories(
        cls, registration_name: str, env_config: Mapping[str, str]
    ) -> list[PluginEpFactory]:
        """The library's ``create_ep_factories``: one factory of this class."""
        return [cls(registration_name, env_config)]

    def get_supported_devices(self, hardware_devices: Sequence[HardwareDevice]) -> list[EpDevice]:
        found = self.devices(hardware_devices)
        return found + self.virtual_devices() if self.allow_virtual else found

    def devices(self, hardware_devices: Sequence[HardwareDevice]) -> list[EpDevice]:
        """The devices served among ``hardware_devices`` (default: each real CPU)."""
        from epctx.ep._devices import EpDevice, HardwareDeviceType

        return [
            EpDevice(self.ep_name, self.ep_vendor, dict(self.device_metadata), {}, hw)
            for hw in hardware_devices
            if hw.type == HardwareDeviceType.CPU and not hw.is_virtual
        ]

    def virtual_devices(self) -> list[EpDevice]:
        """Virtual devices (cross-compilation targets) offered when registered as ``<name>.virtual``."""
        return []

    def create_ep(self, ep_devices: Sequence[EpDevice], ep_options: Mapping[str, str]) -> ExecutionProvider:
        devices = tuple(ep_devices)
        return self.make_ep(device_options(self.ep_name, devices, ep_options), devices)

    def make_ep(self, options: dict[str, str], ep_devices: tuple[EpDevice, ...]) -> ExecutionProvider:
        """The EP for ``options`` (devices' options and the session's, merged) on ``ep_devices``."""
        return self.provider_class()(options)

    def provider_class(self) -> type[ExecutionProvider]:
        target = self.ep_class
        if isinstance(target, str):
            import importlib

            module, _, attr = target.partition(":")
            return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
        return target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ep_name!r}, EP API {self.ep_api_version})"

"""Which EPs exist, how to build them, and which devices they serve. Nothing here runs at ``import epctx``.

Three sources of EPs, each wrapped by an :class:`~epctx.ep.EpFactory` (ONNX Runtime's ``OrtEpFactory``):

- **built-in EPs**, found by their folder: every package under ``epctx/providers/`` whose ``__init__.py``
  declares ``EP_NAME`` (and ``EP_CLASS = "module:Class"``, optionally ``EP_VENDOR``, ``EP_REQUIRES`` (modules
  that must be importable), ``EP_DEVICES = "module:function"`` (``(ep_name, ep_vendor, hardware) ->
  [EpDevice]``; default: the CPU) and ``EP_HARDWARE = "module:function"`` (``() -> [HardwareDevice]``, devices
  the backend discovers beyond the OS's CPU), ``EP_BY_POLICY = False`` (selection policies skip it),
  ``EP_PAYLOADS = "module:function"`` (:data:`~epctx.ep.PayloadDetector`: recognises its own payloads for
  ``epctx inspect``), ``EP_LIBRARY = "module"`` (a plugin library bringing the same EP, e.g. with virtual
  devices: registered by that module name, it replaces the folder's declaration)). The declaration imports
  nothing: adding an EP = one folder;
- **plugin EP libraries** of installed packages, by the ``epctx.execution_providers`` entry-point group (each
  entry point names a module exposing ``create_ep_factories``), loaded on the first discovery;
- **registered libraries**: :func:`register_execution_provider_library` (a Python file or an importable module
  exposing ``create_ep_factories(registration_name, env_config)``).

EP instances a library's factory creates are tracked with weak references: a library is in use while a
session or a ModelCompiler holds one, and cannot be unregistered then. Folders: ``builtin.py``; libraries:
``libraries.py``; this module: discovery, devices and creation over all three.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx.errors import Fail, InvalidArgument, NoSuchFile
from epctx.providers.builtin import (
    BuiltinDeclaration,
    ClassEpFactory,
    builtin,
    builtin_class,
    builtin_declarations,
    builtin_factory,
    resolve,
    resolve_lazily,
)
from epctx.providers.libraries import (
    ALLOW_VIRTUAL_DEVICES,
    ENTRY_POINT_GROUP,
    LIBRARIES,
    LOCK,
    VIRTUAL_SUFFIX,
    Library,
    forget_entry_points,
    import_library,
    load_entry_points,
    load_library,
)

if TYPE_CHECKING:
    from epctx.ep import EpDevice, EpFactory, ExecutionProvider, HardwareDevice
    from epctx.ep._payloads import PayloadDetector

__all__ = [
    "ALLOW_VIRTUAL_DEVICES",
    "CPU_EP",
    "ENTRY_POINT_GROUP",
    "VIRTUAL_SUFFIX",
    "BuiltinDeclaration",
    "ClassEpFactory",
    "available_providers",
    "builtin_declarations",
    "create_provider",
    "create_provider_for_devices",
    "discover_hardware",
    "factories",
    "payload_detectors",
    "get_ep_devices",
    "register_execution_provider_library",
    "register_provider_class",
    "registered_libraries",
    "unregister_execution_provider_library",
]

logger = logging.getLogger("epctx")

CPU_EP = "CPUExecutionProvider"
_LOCK = LOCK
_REGISTERED: dict[str, type[ExecutionProvider]] = {}  # register_provider_class: in-process EP classes


def payload_detectors(source: str | None = None) -> list[tuple[str, PayloadDetector]]:
    """(EP name, detector) of every EP that recognises its own payloads (``epctx inspect``; see
    :mod:`epctx.ep._payloads`), the EP that accepts ``source`` (an EPContext node's) first: built-in folders'
    ``EP_PAYLOADS`` (imported on the first call, installed backend or not: detectors read bytes only), classes'
    ``detect_payload`` (``register_provider_class``), plugin factories' optional ``detect_payload``."""
    found: list[tuple[str, PayloadDetector, bool]] = []
    wanted = (source or "").lower()
    with _LOCK:
        _load_entry_points()
        for name, cls in _REGISTERED.items():
            found.append((name, cls.detect_payload, bool(source) and cls.accepts_source(source or "")))
        for decl in builtin_declarations():
            if decl.payloads and decl.name not in _REGISTERED:
                found.append((decl.name, resolve_lazily(decl.payloads), decl.name.lower() == wanted))
        for library in LIBRARIES.values():
            for factory in library.factories:
                detect = getattr(factory, "detect_payload", None)
                if callable(detect):
                    found.append((factory.ep_name, detect, factory.ep_name.lower() == wanted))
    return [(name, detect) for name, detect, _ in sorted(found, key=lambda f: not f[2])]


def register_execution_provider_library(registration_name: str, path: str | os.PathLike[str]) -> None:
    """Load a plugin EP library: ``path`` is a Python file or an importable module name exposing
    ``create_ep_factories(registration_name, env_config)``. A name ending in ``.virtual`` lets the library
    create virtual devices (``env_config["allow_virtual_devices"] == "1"``) for cross-compilation."""
    if not isinstance(registration_name, str) or not registration_name:
        raise InvalidArgument(f"registration_name must be a non-empty string, got {registration_name!r}")
    path = os.fspath(path)
    if not path:
        raise InvalidArgument(f"EP library {registration_name!r}: the path is empty")
    with LOCK:
        _load_entry_points()
        if registration_name in LIBRARIES:
            known = LIBRARIES[registration_name]
            raise InvalidArgument(
                f"an EP library is already registered as {registration_name!r} ({known.origin})"
            )
        module, key = import_library(registration_name, path)
        # A built-in EP's own library (its folder's EP_LIBRARY, by module name) may bring the built-in's name.
        own = {
            d.name for d in builtin_declarations() if d.library is not None and d.library == module.__name__
        }
        try:
            library = load_library(registration_name, path, module, key, _ep_names() - own)
        except BaseException:
            if key is not None:
                sys.modules.pop(key, None)
            raise
        LIBRARIES[registration_name] = library
        _clear_device_cache()
    logger.info(
        "registered EP library %r (%s): %s",
        registration_name,
        path,
        ", ".join(f.ep_name for f in library.factories),
    )


def unregister_execution_provider_library(registration_name: str) -> None:
    """Unload a library registered under ``registration_name``. Fails while a session or ModelCompiler holds
    one of its EPs (release them first)."""
    with LOCK:
        _load_entry_points()
        library = LIBRARIES.get(registration_name)
        if library is None:
            raise InvalidArgument(
                f"no EP library is registered as {registration_name!r}; registered: {sorted(LIBRARIES)}"
            )
        if len(library.eps):
            gc.collect()  # sessions released in a reference cycle
        if len(library.eps):
            names = sorted({ep.name for ep in library.eps})
            raise Fail(
                f"EP library {registration_name!r} is still in use: {len(library.eps)} instance(s) of "
                f"{', '.join(names)} are held by a session or ModelCompiler; release them before unregistering"
            )
        del LIBRARIES[registration_name]
        if library.module_key is not None:
            sys.modules.pop(library.module_key, None)
        _clear_device_cache()


def registered_libraries() -> dict[str, list[str]]:
    """Registration name -> EP names, for every library loaded (entry points included)."""
    with LOCK:
        _load_entry_points()
        return {name: [f.ep_name for f in lib.factories] for name, lib in LIBRARIES.items()}


def _reset_for_tests() -> None:
    """Forget entry points and cached discoveries (tests that install entry points)."""
    with _LOCK:
        forget_entry_points()
        _clear_device_cache()


def _load_entry_points() -> None:
    load_entry_points(_ep_names)


def _ep_names() -> set[str]:
    """EP names that exist already (a library may not bring another EP of one of these names)."""
    return {f.ep_name for f in factories()}


# -- discovery -------------------------------------------------------------------------------------------
def register_provider_class(cls: type[ExecutionProvider]) -> None:
    """Make a Python EP class selectable by its ``name`` in ``providers=[...]`` (serves the CPU)."""
    if not getattr(cls, "name", None):
        raise InvalidArgument(f"{cls.__qualname__} has no 'name'")
    _REGISTERED[cls.name] = cls


def factories() -> list[EpFactory]:
    """Every EP factory: registered classes, installed built-ins (CPU last), then plugin libraries."""
    with _LOCK:
        _load_entry_points()
        found: list[EpFactory] = [
            ClassEpFactory(name, "epctx", functools.partial(lambda c: c, cls))
            for name, cls in _REGISTERED.items()
            if name != CPU_EP
        ]
        from_libraries = {f.ep_name for library in LIBRARIES.values() for f in library.factories}
        decls = [
            d
            for d in builtin_declarations()
            if d.name not in _REGISTERED and d.name not in from_libraries and not d.missing()
        ]
        found += [builtin_factory(d) for d in decls if d.name != CPU_EP]
        for library in LIBRARIES.values():
            found += library.factories
        cpu = _REGISTERED.get(CPU_EP)
        if cpu is not None:
            found.append(ClassEpFactory(CPU_EP, "epctx", functools.partial(lambda c: c, cpu)))
        else:
            found += [builtin_factory(d) for d in decls if d.name == CPU_EP]
        return found


def available_providers() -> list[str]:
    """EPs usable on this machine, in default precedence order (CPU last)."""
    names = [f.ep_name for f in factories()]
    return [n for n in names if n != CPU_EP] + [CPU_EP]


def all_providers() -> list[str]:
    """Every EP this installation of epctx can support, usable here or not (onnxruntime's ``get_all_providers``):
    the available ones, then built-in EPs whose backend package is not installed, CPU last."""
    names = [n for n in available_providers() if n != CPU_EP]
    names += [d.name for d in builtin_declarations() if d.name not in names and d.name != CPU_EP]
    return names + [CPU_EP]


def _library_of(ep_name: str) -> Library | None:
    return next((lib for lib in LIBRARIES.values() if any(f.ep_name == ep_name for f in lib.factories)), None)


def _factory(ep_name: str) -> EpFactory | None:
    return next((f for f in factories() if f.ep_name == ep_name), None)


_HARDWARE: tuple[HardwareDevice, ...] | None = None
_EP_DEVICES: dict[int, tuple[EpDevice, ...]] = {}


def _clear_device_cache() -> None:
    _EP_DEVICES.clear()


def discover_hardware() -> list[HardwareDevice]:
    """The devices of this machine: the CPU from the OS, then what installed backends discover (OpenVINO's GPU
    and NPU). Discovered once per process."""
    global _HARDWARE
    with _LOCK:
        if _HARDWARE is None:
            from epctx.ep._hardware import cpu_device

            found = [cpu_device()]
            for decl in builtin_declarations():
                if decl.hardware is None or decl.missing():
                    continue
                try:
                    extra = list(resolve(decl.hardware)())
                except Exception as exc:  # a backend that cannot list its devices serves none
                    logger.warning("%s: device discovery failed: %s", decl.name, exc)
                    continue
                found += [hw for hw in extra if hw not in found]
            _HARDWARE = tuple(found)
        return list(_HARDWARE)


def _supported(factory: EpFactory, hardware: Sequence[HardwareDevice]) -> tuple[EpDevice, ...]:
    from epctx.ep import EpDevice

    library = _library_of(factory.ep_name)
    where = f"EP library {library.registration_name!r}" if library else factory.ep_name
    try:
        devices = list(factory.get_supported_devices(list(hardware)))
    except Exception as exc:
        raise Fail(f"{where}: get_supported_devices failed: {exc}") from exc
    allow_virtual = library is not None and library.env_config.get(ALLOW_VIRTUAL_DEVICES) == "1"
    kept = []
    for device in devices:
        if not isinstance(device, EpDevice) or device.ep_name != factory.ep_name:
            raise InvalidArgument(
                f"{where}: get_supported_devices returned {device!r}; expected EpDevice objects of "
                f"{factory.ep_name!r}"
            )
        if device.device.is_virtual and not allow_virtual:
            logger.warning(
                "%s offered a virtual device but was not allowed to (register it as '<name>%s'); dropped",
                where,
                VIRTUAL_SUFFIX,
            )
            continue
        kept.append(device)
    return tuple(kept)


def get_ep_devices() -> list[EpDevice]:
    """Every (EP, device) pair usable here, EPs in :func:`factories` order (``onnxruntime.get_ep_devices``)."""
    hardware = discover_hardware()
    result: list[EpDevice] = []
    with _LOCK:
        for factory in factories():
            key = id(factory)
            if not isinstance(factory, ClassEpFactory):
                if key not in _EP_DEVICES:
                    _EP_DEVICES[key] = _supported(factory, hardware)
                result += _EP_DEVICES[key]
            else:
                result += _supported(factory, hardware)
    return result


# -- creation --------------------------------------------------------------------------------------------
def _track(factory: EpFactory, ep: Any) -> ExecutionProvider:
    from epctx.ep import ExecutionProvider

    library = _library_of(factory.ep_name)
    where = f"EP library {library.registration_name!r}" if library else factory.ep_name
    if not isinstance(ep, ExecutionProvider):
        raise InvalidArgument(f"{where}: create_ep returned {ep!r}, not an epctx.ep.ExecutionProvider")
    if ep.name != factory.ep_name:
        raise InvalidArgument(f"{where}: factory {factory.ep_name!r} created an EP named {ep.name!r}")
    if library is not None:
        library.eps.add(ep)
    return ep


def create_provider_for_devices(
    ep_devices: Sequence[EpDevice], options: Mapping[str, str] | None = None
) -> ExecutionProvider:
    """An EP for ``ep_devices`` (all of one EP), built by the factory that offered them."""
    names = sorted({d.ep_name for d in ep_devices})
    if len(names) != 1:
        raise InvalidArgument(f"the devices of one provider must belong to one EP, got {names or 'none'}")
    with _LOCK:
        factory = _factory(names[0])
        if factory is None:
            raise InvalidArgument(
                f"execution provider {names[0]!r} of the selected device(s) is not registered (was its library "
                f"unregistered?); available: {', '.join(available_providers())}"
            )
        offered = set(get_ep_devices())
        for device in ep_devices:
            if device not in offered:
                raise InvalidArgument(
                    f"{names[0]} does not offer device {device.device!r} (get_ep_devices() lists what it offers)"
                )
        try:
            ep = factory.create_ep(list(ep_devices), dict(options or {}))
        except (InvalidArgument, NoSuchFile):
            raise
        except Exception as exc:
            if _library_of(names[0]) is None:
                raise
            raise Fail(f"{names[0]}: create_ep failed: {exc}") from exc
        return _track(factory, ep)


def provider_class(name: str) -> type[ExecutionProvider] | None:
    """The class of a built-in or in-process EP (None for a plugin library's EP, or a name nobody knows)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    decl = builtin(name)
    if decl is None or decl.missing():
        return None
    return builtin_class(decl)


def create_provider(name: str, options: Mapping[str, str] | None = None) -> ExecutionProvider:
    """An EP by name: a class registered in-process, a built-in (its class with ``options``), or an EP of a
    plugin library (on every real device it offers here)."""
    if name in _REGISTERED:
        return _REGISTERED[name](options)
    decl = builtin(name)
    if decl is not None:
        return builtin_class(decl)(options)
    with _LOCK:
        factory = _factory(name)
        if factory is None:
            raise InvalidArgument(
                f"unknown execution provider {name!r}; available: {', '.join(available_providers())}"
            )
        devices = [d for d in get_ep_devices() if d.ep_name == name]
        real = [d for d in devices if not d.device.is_virtual]
        if not devices:
            raise InvalidArgument(f"execution provider {name!r} offers no device on this machine")
        return create_provider_for_devices(real or devices[:1], options)

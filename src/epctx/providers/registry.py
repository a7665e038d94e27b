"""Which EPs exist, how to build them, and which devices they serve. Nothing here runs at ``import epctx``.

Three sources of EPs, each wrapped by an :class:`~epctx.ep.EpFactory` (ONNX Runtime's ``OrtEpFactory``):

- **built-in EPs**, found by their folder: every package under ``epctx/providers/`` whose ``__init__.py``
  declares ``EP_NAME`` (and ``EP_CLASS = "module:Class"``, optionally ``EP_VENDOR``, ``EP_REQUIRES`` (modules
  that must be importable), ``EP_DEVICES = "module:function"`` (``(ep_name, ep_vendor, hardware) ->
  [EpDevice]``; default: the CPU) and ``EP_HARDWARE = "module:function"`` (``() -> [HardwareDevice]``, devices
  the backend discovers beyond the OS's CPU), ``EP_BY_POLICY = False`` (selection policies skip it),
  ``EP_PAYLOADS = "module:function"`` (:data:`~epctx.ep.PayloadDetector`: recognises its own payloads for
  ``epctx inspect``)). The declaration imports nothing: adding an EP = one folder;
- **plugin EP libraries** of installed packages, by the ``epctx.execution_providers`` entry-point group (each
  entry point names a module exposing ``create_ep_factories``), loaded on the first discovery;
- **registered libraries**: :func:`register_execution_provider_library` (a Python file or an importable module
  exposing ``create_ep_factories(registration_name, env_config)``).

EP instances a library's factory creates are tracked with weak references: a library is in use while a
session or a ModelCompiler holds one, and cannot be unregistered then.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib
import importlib.util
import logging
import os
import pkgutil
import re
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from epctx.errors import Fail, InvalidArgument, NoSuchFile

if TYPE_CHECKING:
    from epctx.ep import EpDevice, EpFactory, ExecutionProvider, HardwareDevice, PayloadDetector

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
ENTRY_POINT_GROUP = "epctx.execution_providers"
ALLOW_VIRTUAL_DEVICES = "allow_virtual_devices"  # env_config key (kOrtEnvAllowVirtualDevices)
VIRTUAL_SUFFIX = ".virtual"  # a registration name ending in it allows virtual devices

_LOCK = threading.RLock()
_REGISTERED: dict[str, type[ExecutionProvider]] = {}  # register_provider_class: in-process EP classes


# -- built-in EPs, found by folder -------------------------------------------------------------------------
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
            )
        )
    return tuple(found)


def payload_detectors(source: str | None = None) -> list[tuple[str, PayloadDetector]]:
    """(EP name, detector) of every EP that recognises its own payloads (``epctx inspect``; see
    :mod:`epctx.ep.payloads`), the EP that accepts ``source`` (an EPContext node's) first: built-in folders'
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
                found.append((decl.name, _resolve_lazily(decl.payloads), decl.name.lower() == wanted))
        for library in _LIBRARIES.values():
            for factory in library.factories:
                detect = getattr(factory, "detect_payload", None)
                if callable(detect):
                    found.append((factory.ep_name, detect, factory.ep_name.lower() == wanted))
    return [(name, detect) for name, detect, _ in sorted(found, key=lambda f: not f[2])]


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _builtin(name: str) -> BuiltinDeclaration | None:
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
    ) -> None:
        self._name = ep_name
        self._vendor = ep_vendor
        self._load_class = load_class
        self._devices = devices

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

    def __repr__(self) -> str:
        return f"ClassEpFactory({self._name!r})"


@functools.cache
def _builtin_factory(decl: BuiltinDeclaration) -> ClassEpFactory:
    devices = _resolve_lazily(decl.devices) if decl.devices else None
    return ClassEpFactory(decl.name, decl.vendor, lambda: _builtin_class(decl), devices)


def _resolve_lazily(target: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return _resolve(target)(*args)

    return call


def _builtin_class(decl: BuiltinDeclaration) -> type[ExecutionProvider]:
    missing = decl.missing()
    if missing:
        raise InvalidArgument(
            f"execution provider {decl.name!r} needs the Python package(s) {', '.join(missing)}, which are not "
            "installed (pip install 'epctx[...]' with the matching extra)"
        )
    cls: type[ExecutionProvider] = _resolve(decl.cls)
    return cls


# -- plugin libraries ------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Library:
    registration_name: str
    origin: str  # the file, module or entry point it came from
    module: ModuleType
    env_config: dict[str, str]
    factories: list[EpFactory]
    module_key: str | None  # sys.modules key to drop on unregister (a library loaded from a file)
    eps: weakref.WeakSet[ExecutionProvider] = dataclasses.field(default_factory=weakref.WeakSet)


_LIBRARIES: dict[str, _Library] = {}
_ENTRY_POINTS_LOADED = False


def _env_config(registration_name: str) -> dict[str, str]:
    config: dict[str, str] = {}
    if registration_name.endswith(VIRTUAL_SUFFIX):
        config[ALLOW_VIRTUAL_DEVICES] = "1"
    return config


def _import_library(registration_name: str, path: str) -> tuple[ModuleType, str | None]:
    """The library module: a Python file (or a package folder) when ``path`` names one, else a module name."""
    looks_like_path = path.endswith(".py") or "/" in path or os.sep in path or Path(path).exists()
    if not looks_like_path:
        try:
            return importlib.import_module(path), None
        except ModuleNotFoundError as exc:
            if exc.name is not None and (path == exc.name or path.startswith(f"{exc.name}.")):
                raise NoSuchFile(
                    f"EP library {registration_name!r}: {path!r} is neither a file nor an importable module"
                ) from exc
            raise Fail(f"EP library {registration_name!r}: importing module {path!r} failed: {exc}") from exc
        except Exception as exc:
            raise Fail(f"EP library {registration_name!r}: importing module {path!r} failed: {exc}") from exc
    file = Path(path)
    if file.is_dir():
        file = file / "__init__.py"
    if not file.is_file():
        raise NoSuchFile(f"EP library {registration_name!r}: no such file {path!r}")
    key = "epctx_ep_library_" + re.sub(r"\W", "_", registration_name)
    spec = importlib.util.spec_from_file_location(key, file)
    if spec is None or spec.loader is None:
        raise InvalidArgument(f"EP library {registration_name!r}: {path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # dataclasses and pickling look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(key, None)
        raise Fail(f"EP library {registration_name!r}: running {path!r} failed: {exc}") from exc
    return module, key


def _load_library(registration_name: str, origin: str, module: ModuleType, key: str | None) -> _Library:
    create = getattr(module, "create_ep_factories", None)
    where = f"EP library {registration_name!r} ({origin})"
    if not callable(create):
        raise InvalidArgument(f"{where} has no create_ep_factories(registration_name, env_config) function")
    env_config = _env_config(registration_name)
    try:
        made = create(registration_name, dict(env_config))
    except Exception as exc:
        raise Fail(f"{where}: create_ep_factories failed: {exc}") from exc
    made = list(made or [])
    if not made:
        raise InvalidArgument(f"{where}: create_ep_factories returned no EP factories")
    taken = {f.ep_name for f in factories()}
    for factory in made:
        for attr in ("ep_name", "ep_vendor", "get_supported_devices", "create_ep"):
            if not hasattr(factory, attr):
                raise InvalidArgument(
                    f"{where}: factory {factory!r} has no {attr!r} (see epctx.ep.EpFactory)"
                )
        if not isinstance(factory.ep_name, str) or not factory.ep_name:
            raise InvalidArgument(f"{where}: factory {factory!r} has no EP name")
        if factory.ep_name in taken:
            raise InvalidArgument(f"{where}: an execution provider named {factory.ep_name!r} exists already")
        taken.add(factory.ep_name)
    return _Library(registration_name, origin, module, env_config, made, key)


def register_execution_provider_library(registration_name: str, path: str | os.PathLike[str]) -> None:
    """Load a plugin EP library: ``path`` is a Python file or an importable module name exposing
    ``create_ep_factories(registration_name, env_config)``. A name ending in ``.virtual`` lets the library
    create virtual devices (``env_config["allow_virtual_devices"] == "1"``) for cross-compilation."""
    if not isinstance(registration_name, str) or not registration_name:
        raise InvalidArgument(f"registration_name must be a non-empty string, got {registration_name!r}")
    path = os.fspath(path)
    if not path:
        raise InvalidArgument(f"EP library {registration_name!r}: the path is empty")
    with _LOCK:
        _load_entry_points()
        if registration_name in _LIBRARIES:
            known = _LIBRARIES[registration_name]
            raise InvalidArgument(
                f"an EP library is already registered as {registration_name!r} ({known.origin})"
            )
        module, key = _import_library(registration_name, path)
        try:
            library = _load_library(registration_name, path, module, key)
        except BaseException:
            if key is not None:
                sys.modules.pop(key, None)
            raise
        _LIBRARIES[registration_name] = library
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
    with _LOCK:
        _load_entry_points()
        library = _LIBRARIES.get(registration_name)
        if library is None:
            raise InvalidArgument(
                f"no EP library is registered as {registration_name!r}; registered: {sorted(_LIBRARIES)}"
            )
        if len(library.eps):
            gc.collect()  # sessions released in a reference cycle
        if len(library.eps):
            names = sorted({ep.name for ep in library.eps})
            raise Fail(
                f"EP library {registration_name!r} is still in use: {len(library.eps)} instance(s) of "
                f"{', '.join(names)} are held by a session or ModelCompiler; release them before unregistering"
            )
        del _LIBRARIES[registration_name]
        if library.module_key is not None:
            sys.modules.pop(library.module_key, None)
        _clear_device_cache()


def registered_libraries() -> dict[str, list[str]]:
    """Registration name -> EP names, for every library loaded (entry points included)."""
    with _LOCK:
        _load_entry_points()
        return {name: [f.ep_name for f in lib.factories] for name, lib in _LIBRARIES.items()}


def _entry_points() -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def _load_entry_points() -> None:
    """Load the plugin libraries of installed packages once (a broken one is skipped with a warning)."""
    global _ENTRY_POINTS_LOADED
    with _LOCK:
        if _ENTRY_POINTS_LOADED:
            return
        _ENTRY_POINTS_LOADED = True
        for ep in _entry_points():
            if ep.name in _LIBRARIES:
                logger.warning("EP library entry point %r: the name is registered already; skipped", ep.name)
                continue
            origin = f"entry point {ep.name} = {ep.value}"
            try:
                module = ep.load()
                if not isinstance(module, ModuleType):
                    raise InvalidArgument(f"{ep.value!r} is not a module")
                _LIBRARIES[ep.name] = _load_library(ep.name, origin, module, None)
            except Exception as exc:
                logger.warning("EP library %s could not be loaded and is skipped: %s", origin, exc)


def _reset_for_tests() -> None:
    """Forget entry points and cached discoveries (tests that install entry points)."""
    global _ENTRY_POINTS_LOADED
    with _LOCK:
        for name in [n for n, lib in _LIBRARIES.items() if lib.origin.startswith("entry point ")]:
            del _LIBRARIES[name]
        _ENTRY_POINTS_LOADED = False
        _clear_device_cache()


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
        decls = [d for d in builtin_declarations() if d.name not in _REGISTERED and not d.missing()]
        found += [_builtin_factory(d) for d in decls if d.name != CPU_EP]
        for library in _LIBRARIES.values():
            found += library.factories
        cpu = _REGISTERED.get(CPU_EP)
        if cpu is not None:
            found.append(ClassEpFactory(CPU_EP, "epctx", functools.partial(lambda c: c, cpu)))
        else:
            found += [_builtin_factory(d) for d in decls if d.name == CPU_EP]
        return found


def available_providers() -> list[str]:
    """EPs usable on this machine, in default precedence order (CPU last)."""
    names = [f.ep_name for f in factories()]
    return [n for n in names if n != CPU_EP] + [CPU_EP]


def _library_of(ep_name: str) -> _Library | None:
    return next(
        (lib for lib in _LIBRARIES.values() if any(f.ep_name == ep_name for f in lib.factories)), None
    )


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
            from epctx.providers.hardware import cpu_device

            found = [cpu_device()]
            for decl in builtin_declarations():
                if decl.hardware is None or decl.missing():
                    continue
                try:
                    extra = list(_resolve(decl.hardware)())
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


def create_provider(name: str, options: Mapping[str, str] | None = None) -> ExecutionProvider:
    """An EP by name: a class registered in-process, a built-in (its class with ``options``), or an EP of a
    plugin library (on every real device it offers here)."""
    if name in _REGISTERED:
        return _REGISTERED[name](options)
    decl = _builtin(name)
    if decl is not None:
        return _builtin_class(decl)(options)
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

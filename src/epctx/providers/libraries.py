"""Plugin EP libraries: loaded from a file or module (``register_execution_provider_library``) or from the
``epctx.execution_providers`` entry points of installed packages; each exposes
``create_ep_factories(registration_name, env_config)``. EP instances a library's factories create are tracked
with weak references (``Library.eps``): a library is in use while a session or ModelCompiler holds one."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from epctx.ep._devices import ALLOW_VIRTUAL_DEVICES
from epctx.errors import Fail, InvalidArgument, NoSuchFile

if TYPE_CHECKING:
    from epctx.ep import EpFactory, ExecutionProvider

__all__ = [
    "ALLOW_VIRTUAL_DEVICES",
    "ENTRY_POINT_GROUP",
    "LIBRARIES",
    "LOCK",
    "VIRTUAL_SUFFIX",
    "Library",
    "env_config_for",
    "forget_entry_points",
    "import_library",
    "load_entry_points",
    "load_library",
]

logger = logging.getLogger("epctx")

ENTRY_POINT_GROUP = "epctx.execution_providers"
VIRTUAL_SUFFIX = ".virtual"  # a registration name ending in it allows virtual devices
LOCK = threading.RLock()  # guards the libraries and every registry state built on them


@dataclasses.dataclass
class Library:
    registration_name: str
    origin: str  # the file, module or entry point it came from
    module: ModuleType
    env_config: dict[str, str]
    factories: list[EpFactory]
    module_key: str | None  # sys.modules key to drop on unregister (a library loaded from a file)
    eps: weakref.WeakSet[ExecutionProvider] = dataclasses.field(default_factory=weakref.WeakSet)


LIBRARIES: dict[str, Library] = {}
_entry_points_loaded = False


def env_config_for(registration_name: str) -> dict[str, str]:
    config: dict[str, str] = {}
    if registration_name.endswith(VIRTUAL_SUFFIX):
        config[ALLOW_VIRTUAL_DEVICES] = "1"
    return config


def import_library(registration_name: str, path: str) -> tuple[ModuleType, str | None]:
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


def load_library(
    registration_name: str, origin: str, module: ModuleType, key: str | None, taken: set[str]
) -> Library:
    """The library's factories, checked (``taken``: EP names that exist already)."""
    create = getattr(module, "create_ep_factories", None)
    where = f"EP library {registration_name!r} ({origin})"
    if not callable(create):
        raise InvalidArgument(f"{where} has no create_ep_factories(registration_name, env_config) function")
    env_config = env_config_for(registration_name)
    try:
        made = create(registration_name, dict(env_config))
    except Exception as exc:
        raise Fail(f"{where}: create_ep_factories failed: {exc}") from exc
    made = list(made or [])
    if not made:
        raise InvalidArgument(f"{where}: create_ep_factories returned no EP factories")
    taken = set(taken)
    from epctx.ep._factory import check_api_version  # registration only: not on a session's load path

    for factory in made:
        for attr in ("ep_name", "ep_vendor", "get_supported_devices", "create_ep"):
            if not hasattr(factory, attr):
                raise InvalidArgument(
                    f"{where}: factory {factory!r} has no {attr!r} (see epctx.ep.EpFactory)"
                )
        if not isinstance(factory.ep_name, str) or not factory.ep_name:
            raise InvalidArgument(f"{where}: factory {factory!r} has no EP name")
        check_api_version(
            getattr(factory, "ep_api_version", None), f"{where}: factory of {factory.ep_name!r}"
        )
        if factory.ep_name in taken:
            raise InvalidArgument(f"{where}: an execution provider named {factory.ep_name!r} exists already")
        taken.add(factory.ep_name)
    return Library(registration_name, origin, module, env_config, made, key)


def _installed_entry_points() -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def load_entry_points(taken: Callable[[], set[str]]) -> None:
    """Load the plugin libraries of installed packages once (a broken one is skipped with a warning)."""
    global _entry_points_loaded
    with LOCK:
        if _entry_points_loaded:
            return
        _entry_points_loaded = True
        for ep in _installed_entry_points():
            if ep.name in LIBRARIES:
                logger.warning("EP library entry point %r: the name is registered already; skipped", ep.name)
                continue
            origin = f"entry point {ep.name} = {ep.value}"
            try:
                module = ep.load()
                if not isinstance(module, ModuleType):
                    raise InvalidArgument(f"{ep.value!r} is not a module")
                LIBRARIES[ep.name] = load_library(ep.name, origin, module, None, taken())
            except Exception as exc:
                logger.warning("EP library %s could not be loaded and is skipped: %s", origin, exc)


def forget_entry_points() -> None:
    """Unload the libraries of entry points and look for entry points again on the next discovery (tests)."""
    global _entry_points_loaded
    with LOCK:
        for name in [n for n, lib in LIBRARIES.items() if lib.origin.startswith("entry point ")]:
            del LIBRARIES[name]
        _entry_points_loaded = False

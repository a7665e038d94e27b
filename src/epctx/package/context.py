"""What a session over a package uses: the selected variant resolved, and ``InferenceSession(package_folder)``'s
arguments (onnxruntime's API names, ``ModelPackageContext`` and the rest, are in ``epctx.session.package``).

The selected variant's ``executor_info["ort"]`` is honoured as onnxruntime does: ``model_file`` (relative to the
variant's folder, or ``sha256:<hex>/<path>`` in a shared asset), ``session_options`` (applied to fresh session
options; path-valued keys resolved in the package, and carried over to the caller's options when not set there)
and ``provider_options`` (for the variant's EP when the caller gives no providers).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from epctx import options as opt
from epctx.errors import InvalidArgument, InvalidGraph
from epctx.package.layout import MANIFEST, Component, Package, read_package
from epctx.package.select import Ranked, select_variant

__all__ = ["Resolved", "is_package", "open_for_session", "provider_names", "resolve", "session_arguments"]

_TRUST_PREFIX = "epctx.trust."
PATH_OPTIONS = (opt.EXTERNAL_INITIALIZERS_FOLDER, opt.EP_CONTEXT_FILE_PATH)
# output files a package may not set (onnxruntime refuses them too)
_FORBIDDEN = ("session.debug_layout_transformation", "session.collect_node_memory_stats_to_file",
              "session.enable_profiling", "session.optimized_model_filepath")  # fmt: skip


def is_package(source: object) -> bool:
    return (
        isinstance(source, (str, os.PathLike))
        and Path(source).is_dir()
        and (Path(source) / MANIFEST).is_file()
    )


def provider_names(
    providers: Sequence[Any] | None, sess_options: opt.SessionOptions | None
) -> list[str] | None:
    """The EP names a session asks for (its argument, else its options' ``add_provider`` list), or None."""
    specs: list[Any] = list(providers or [])
    if not specs and sess_options is not None:
        specs = [spec for spec, _ in getattr(sess_options, "_providers", [])]
    names = []
    for spec in specs:
        if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
            names.append(spec[0])
        elif isinstance(spec, tuple):  # add_provider_for_devices: EP devices
            names.append(spec[0].ep_name)
        else:
            names.append(str(spec))
    return names or None


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The selected variant, its model file and its ``executor_info["ort"]`` options, resolved."""

    component: str
    chosen: Ranked
    model: Path
    session_options: Mapping[str, str]
    provider_options: Mapping[str, str]
    root: Path  # the package's root: what its signature (``model.sig`` there) covers


def _strings(value: Any, what: str, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidGraph(f"{where}: executor_info['ort'][{what!r}] must map strings to strings")
    return dict(value)


def resolve(package: Package, component: Component, chosen: Ranked) -> Resolved:
    variant = chosen.variant
    where = f"package {str(package.root)!r} component {component.name!r} variant {variant.name!r}"
    ort = variant.executor_info.get("ort") or {}
    model_file = ort.get("model_file")
    if not isinstance(model_file, str):
        raise InvalidGraph(f"{where}: executor_info['ort'] has no 'model_file'")
    options = _strings(ort.get("session_options"), "session_options", where)
    for key in _FORBIDDEN:
        if key in options:
            raise InvalidGraph(f"{where}: session option {key!r} writes a file; a package may not set it")
    for key in options:  # the package under check must not choose how it is checked
        if key.startswith(_TRUST_PREFIX):
            raise InvalidGraph(
                f"{where}: session option {key!r} is the trust policy's; a package may not set it"
            )
    for key in PATH_OPTIONS:
        if key in options:
            options[key] = str(package.resolve(options[key], variant.directory, f"{where} {key}"))
    model = package.resolve(model_file, variant.directory, f"{where} model_file")
    if not model.is_file():
        raise InvalidGraph(f"{where}: model_file {model_file!r} is not a file in the package")
    providers = _strings(ort.get("provider_options"), "provider_options", where)
    return Resolved(component.name, chosen, model, options, providers, package.root)


def session_arguments(
    resolved: Resolved,
    sess_options: opt.SessionOptions | None,
    providers: Sequence[Any] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
) -> tuple[str, opt.SessionOptions, Any, Any]:
    """(model path, session options, providers, provider options) for the session of a resolved variant."""
    ep = resolved.chosen.variant.ep
    if sess_options is None:
        so = opt.SessionOptions()
        for key, value in resolved.session_options.items():
            so.add_session_config_entry(key, value)
    else:
        carried = {k: v for k, v in resolved.session_options.items() if k in PATH_OPTIONS}
        so = opt.with_config(sess_options, {k: v for k, v in carried.items() if k not in sess_options.config})
    if providers is None and not so.has_providers():
        providers, provider_options = [ep], [dict(resolved.provider_options)]
    return str(resolved.model), _trust_package(resolved, so), providers, provider_options


def _trust_package(resolved: Resolved, so: opt.SessionOptions) -> opt.SessionOptions:
    """Under a trust policy: the package's signature (``model.sig`` at its root, or ``epctx.trust.signature``)
    covers the variant, so the session's check of its context binaries uses the package's root; the manifest
    and the variant's model file are checked here, before the session reads a byte of the variant; what was
    verified is handed to the session's loader (one record look-up per session)."""
    if so.config.get(opt.TRUST_POLICY, "off") == "off":
        return so
    if opt.TRUST_ROOT not in so.config:
        so = opt.with_config(so, {opt.TRUST_ROOT: str(resolved.root)})
    from epctx.trust.policy import check_package_files

    check_package_files(resolved.root / MANIFEST, resolved.model, opt.SessionConfig(so.config))
    return so


def open_for_session(
    path: str | os.PathLike[str],
    sess_options: opt.SessionOptions | None,
    providers: Sequence[Any] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
) -> tuple[str, opt.SessionOptions, Any, Any]:
    """``InferenceSession(package_folder, ...)``: the arguments for the best variant of its one component."""
    package = read_package(path)
    if len(package.components) != 1:
        names = ", ".join(c.name for c in package.components)
        raise InvalidArgument(
            f"package {str(path)!r} has {len(package.components)} components ({names}): open one with "
            "ModelPackageContext(path).select_component(name).create_session()"
        )
    component = package.components[0]
    policy = getattr(sess_options, "_selection_policy", None)
    chosen = select_variant(component, provider_names(providers, sess_options), policy)
    return session_arguments(resolve(package, component, chosen), sess_options, providers, provider_options)

"""onnxruntime's model package format (``model_package/README.md`` in microsoft/onnxruntime), read and written.

A package is a folder with ``manifest.json``: ``schema_version`` (major 1), ``layout`` (epctx reads and writes
``portable`` packages: every path relative, POSIX, no ``..``, nothing resolving outside the folder, symlinks
included), ``components`` (inline bodies or external ``component.json`` paths), each with ``variants`` (``ep``,
``device``, ``compatibility_string``, ``variant_directory``, ``executor_info``: one JSON object per consumer,
inline or an external file in the variant's folder). Shared assets are folders ``shared_assets/sha256-<hex>``
named by :func:`directory_hash` (onnxruntime's ``ModelPackage.compute_directory_hash``) and referenced as
``sha256:<hex>[/sub/path]``. epctx keeps its own data under ``executor_info["epctx"]``; onnxruntime's slot
``executor_info["ort"]`` (``model_file``, ``session_options``, ``provider_options``) is honoured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from epctx.errors import InvalidArgument, InvalidGraph, NoSuchFile

__all__ = [
    "MANIFEST",
    "Component",
    "Package",
    "Variant",
    "asset_folder_name",
    "confined",
    "directory_hash",
    "manifest_json",
    "read_package",
]

MANIFEST = "manifest.json"
SCHEMA_VERSION = "1.0"
_URI = re.compile(r"sha256:([0-9a-f]{64})(?:/(.*))?\Z")
_TOP = {"schema_version", "package_name", "package_version", "description", "layout", "components",
        "shared_assets", "additional_metadata"}  # fmt: skip
_VARIANT = {
    "variant_directory",
    "ep",
    "device",
    "compatibility_string",
    "executor_info",
    "additional_metadata",
}
_COMPONENT = {"component_name", "variants", "additional_metadata"}
_DEVICES = ("cpu", "gpu", "npu")


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    directory: Path  # resolved, inside the package
    ep: str | None
    device: str | None
    compatibility: str | None
    executor_info: Mapping[str, Any]  # namespace -> its JSON object (external files read)
    metadata: Any = None


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    directory: Path
    variants: tuple[Variant, ...]
    metadata: Any = None


@dataclasses.dataclass(frozen=True)
class Package:
    root: Path
    components: tuple[Component, ...]
    assets: Mapping[str, Path]  # sha256:<hex> -> its folder
    name: str | None = None
    version: str | None = None
    description: str | None = None
    metadata: Any = None

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        names = ", ".join(c.name for c in self.components)
        raise InvalidArgument(f"package {str(self.root)!r} has no component {name!r} (it has: {names})")

    def resolve(self, ref: str, base: Path, where: str) -> Path:
        """A path of the package: ``sha256:<hex>[/sub]`` (a shared asset) or relative to ``base``."""
        found = _URI.match(ref)
        if found is None:
            return confined(self.root, base, ref, where)
        uri = f"sha256:{found.group(1)}"
        folder = self.assets.get(uri)
        if folder is None:
            raise InvalidGraph(f"{where}: shared asset {uri} is not in package {str(self.root)!r}")
        return confined(folder, folder, found.group(2) or ".", where) if found.group(2) else folder


def asset_folder_name(uri: str) -> str:
    return uri.replace(":", "-", 1)


def directory_hash(folder: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of a folder as onnxruntime computes it: sha256 of the lines
    ``<sha256 of the file>  <relative POSIX path>\\n`` sorted by path; symlinks are refused."""
    root = Path(folder)
    if not root.is_dir() or root.is_symlink():
        raise InvalidArgument(f"{str(root)!r} is not a folder")
    lines = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            if os.path.islink(os.path.join(dirpath, name)):
                raise InvalidGraph(
                    f"{os.path.join(dirpath, name)!r} is a symlink: shared assets hold no links"
                )
        for name in filenames:
            path = Path(dirpath, name)
            lines.append((path.relative_to(root).as_posix(), _file_sha256(path)))
    text = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(lines))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def confined(root: Path, base: Path, ref: object, where: str) -> Path:
    """``ref`` (relative to ``base``) as a path that stays in ``root``: relative, POSIX, no ``..``, and no
    symlink on the way leading out of ``root``."""
    if not isinstance(ref, str) or not ref:
        raise InvalidGraph(f"{where}: a path must be a non-empty string, found {ref!r}")
    posix = PurePosixPath(ref)
    if posix.is_absolute() or "\\" in ref or re.match(r"[A-Za-z]:", ref):
        raise InvalidGraph(f"{where}: path {ref!r} is absolute; a portable package holds relative paths only")
    if ".." in posix.parts:
        raise InvalidGraph(
            f"{where}: path {ref!r} has a '..' segment; a portable package stays in its folder"
        )
    path = base.joinpath(*posix.parts)
    real, top = os.path.realpath(path), os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
        raise InvalidGraph(
            f"{where}: path {ref!r} leads out of {str(root)!r} (through a symlink) to {real!r}"
        )
    return path


def _load_json(path: Path, where: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise NoSuchFile(f"{where}: {str(path)!r} not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidGraph(f"{where}: {str(path)!r} is not JSON: {exc}") from exc


def _object(value: Any, keys: set[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidGraph(f"{where} must be a JSON object, found {type(value).__name__}")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise InvalidGraph(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    return value


def _optional_str(body: Mapping[str, Any], key: str, where: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidGraph(f"{where}: {key!r} must be a string, found {value!r}")
    return value


def read_package(root: str | os.PathLike[str]) -> Package:
    """Parse and check the package at ``root`` (no model or binary is read)."""
    top = Path(root)
    if not top.is_dir():
        raise NoSuchFile(f"model package {str(top)!r} not found (a package is a folder with {MANIFEST})")
    where = f"package {str(top)!r}"
    manifest = _object(_load_json(top / MANIFEST, where), _TOP, f"{where} {MANIFEST}")
    version = str(manifest.get("schema_version", ""))
    if version.split(".")[0] != "1":
        raise InvalidGraph(f"{where}: schema_version {version!r} is not 1.x (the versions epctx reads)")
    layout = manifest.get("layout", "portable")
    if layout != "portable":
        raise InvalidGraph(f"{where}: layout {layout!r}: epctx reads portable packages only")
    components = manifest.get("components")
    if not isinstance(components, dict) or not components:
        raise InvalidGraph(f"{where}: 'components' must be an object with at least one component")
    assets = _assets(top, manifest.get("shared_assets") or {}, where)
    return Package(
        root=top,
        components=tuple(_component(top, n, v, where) for n, v in components.items()),
        assets=assets,
        name=_optional_str(manifest, "package_name", where),
        version=_optional_str(manifest, "package_version", where),
        description=_optional_str(manifest, "description", where),
        metadata=manifest.get("additional_metadata"),
    )


def _assets(root: Path, overrides: Any, where: str) -> dict[str, Path]:
    if not isinstance(overrides, dict):
        raise InvalidGraph(f"{where}: 'shared_assets' must be an object")
    found: dict[str, Path] = {}
    for uri, ref in overrides.items():
        if not isinstance(uri, str) or not _URI.fullmatch(uri) or "/" in uri:
            raise InvalidGraph(f"{where}: shared asset URI {uri!r} is not sha256:<64 hex digits>")
        found[uri] = confined(root, root, ref, f"{where} shared asset {uri}")
    folder = root / "shared_assets"
    if folder.is_dir():
        for entry in sorted(os.listdir(folder)):
            uri = entry.replace("-", ":", 1)
            if entry.startswith("sha256-") and _URI.fullmatch(uri) and uri not in found:
                found[uri] = confined(root, root, f"shared_assets/{entry}", f"{where} shared asset {uri}")
    return found


def _component(root: Path, name: str, value: Any, where: str) -> Component:
    here = f"{where} component {name!r}"
    base = root
    if isinstance(value, str):
        path = confined(root, root, value, here)
        path = path / "component.json" if path.is_dir() else path
        base = path.parent
        value = _load_json(path, here)
    body = _object(value, _COMPONENT, here)
    variants = body.get("variants")
    if not isinstance(variants, dict):
        raise InvalidGraph(f"{here}: 'variants' must be an object")
    return Component(
        name, base, tuple(_variant(root, base, v, b, here) for v, b in variants.items()),
        body.get("additional_metadata"),
    )  # fmt: skip


def _variant(root: Path, base: Path, name: str, value: Any, where: str) -> Variant:
    here = f"{where} variant {name!r}"
    body = _object(value, _VARIANT, here)
    directory = confined(root, base, body.get("variant_directory", name), here)
    device = _optional_str(body, "device", here)
    if device is not None and device not in _DEVICES:
        raise InvalidGraph(f"{here}: device {device!r} is not one of {', '.join(_DEVICES)}")
    info = body.get("executor_info") or {}
    if not isinstance(info, dict):
        raise InvalidGraph(f"{here}: 'executor_info' must be an object")
    payloads = {}
    for namespace, payload in info.items():
        if isinstance(payload, str):
            payload = _load_json(
                confined(root, directory, payload, here), f"{here} executor_info[{namespace!r}]"
            )
        if not isinstance(payload, dict):
            raise InvalidGraph(f"{here}: executor_info[{namespace!r}] must be a JSON object or a file of one")
        payloads[namespace] = payload
    return Variant(
        name, directory, _optional_str(body, "ep", here), device,
        _optional_str(body, "compatibility_string", here), payloads, body.get("additional_metadata"),
    )  # fmt: skip


def manifest_json(manifest: Mapping[str, Any]) -> bytes:
    """The manifest's bytes: fixed key order as given, two-space indent, a final newline (deterministic)."""
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

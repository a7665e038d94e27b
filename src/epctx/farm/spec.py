"""The SPEC of a package build, in TOML::

    [package]
    name = "llm-pair"          # optional: package_name / package_version / description
    version = "1"

    [components.prefill]       # one table per component: its source model (relative to the SPEC)
    model = "prefill.onnx"

    [[targets]]                # one per variant of every component
    name = "iree-x86-64-v3"    # the variant's name
    ep = "IREEExecutionProvider"
    device = "cpu"             # optional: cpu | gpu | npu
    options = { target = "x86-64-v3" }   # provider options (strings)

A target whose EP is ``CPUExecutionProvider`` ships the source model itself (nothing to compile).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from epctx.errors import InvalidArgument, NoSuchFile

__all__ = ["Spec", "Target", "read_spec"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    ep: str
    device: str | None
    options: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Spec:
    path: Path
    package: dict[str, str]
    components: tuple[tuple[str, Path], ...]  # (name, source model)
    targets: tuple[Target, ...]


def _name(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidArgument(f"{where}: {what} {value!r} must be letters, digits, '.', '_' or '-'")
    return value


def _target(raw: Any, where: str) -> Target:
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}: each [[targets]] entry must be a table")
    unknown = sorted(set(raw) - {"name", "ep", "device", "options"})
    if unknown:
        raise InvalidArgument(f"{where}: unknown target field(s) {', '.join(unknown)}")
    name = _name(raw.get("name"), "target name", where)
    ep = raw.get("ep")
    if not isinstance(ep, str) or not ep:
        raise InvalidArgument(f"{where}: target {name!r} needs 'ep' (an execution provider name)")
    device = raw.get("device")
    if device not in (None, "cpu", "gpu", "npu"):
        raise InvalidArgument(f"{where}: target {name!r}: device {device!r} is not cpu, gpu or npu")
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise InvalidArgument(f"{where}: target {name!r}: 'options' must be a table")
    pairs = tuple(sorted((str(k), v if isinstance(v, str) else str(v).lower()) for k, v in options.items()))
    return Target(name, ep, device, pairs)


def read_spec(path: str | Path) -> Spec:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]

    spec_path = Path(path)
    where = f"spec {str(spec_path)!r}"
    try:
        doc = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NoSuchFile(f"{where} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{where} is not TOML: {exc}") from exc
    unknown = sorted(set(doc) - {"package", "components", "targets"})
    if unknown:
        raise InvalidArgument(f"{where}: unknown table(s) {', '.join(unknown)}")
    components = doc.get("components")
    if not isinstance(components, dict) or not components:
        raise InvalidArgument(f"{where}: [components.<name>] tables are missing")
    found = []
    for name, body in components.items():
        _name(name, "component name", where)
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            raise InvalidArgument(f"{where}: component {name!r} needs 'model' (its source model)")
        source = (spec_path.parent / model).resolve()
        if not source.is_file():
            raise NoSuchFile(f"{where}: component {name!r}: source model {str(source)!r} not found")
        found.append((name, source))
    targets = tuple(_target(t, where) for t in doc.get("targets") or [])
    if not targets:
        raise InvalidArgument(f"{where}: [[targets]] entries are missing")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"{where}: target names repeat: {names}")
    package = {
        k: str(v) for k, v in (doc.get("package") or {}).items() if k in ("name", "version", "description")
    }
    return Spec(spec_path, package, tuple(found), targets)

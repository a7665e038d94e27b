"""``epctx package inspect`` / ``validate``: what a package holds, and whether it is whole.

Validation recomputes every shared asset's directory hash against its URI, resolves every variant's
``executor_info["ort"]`` model (confinement included) and verifies its context as ``epctx inspect --verify``
does (binaries present, checksums of every payload, identities).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from epctx.errors import EPCtxError
from epctx.package.context import resolve
from epctx.package.layout import Package, directory_hash, read_package
from epctx.package.select import Ranked

__all__ = ["inspect_package", "validate_package"]


def _bytes(folder: Path) -> tuple[int, int]:
    files = [Path(d, f) for d, _, names in os.walk(folder) for f in names]
    return len(files), sum(p.stat().st_size for p in files)


def _model_file(variant: Any) -> str:
    ort = variant.executor_info.get("ort") or {}
    return str(ort.get("model_file", "-"))


def inspect_package(root: str | os.PathLike[str]) -> dict[str, Any]:
    package = read_package(root)
    components = [
        {
            "name": c.name,
            "variants": [
                {
                    "name": v.name,
                    "ep": v.ep,
                    "device": v.device,
                    "compatibility_string": v.compatibility,
                    "model_file": _model_file(v),
                    "executor_info": sorted(v.executor_info),
                }
                for v in c.variants
            ],
        }
        for c in package.components
    ]
    assets = []
    for uri, folder in package.assets.items():
        count, size = _bytes(folder)
        assets.append({"uri": uri, "files": count, "bytes": size})
    return {
        "root": str(package.root),
        "name": package.name,
        "version": package.version,
        "components": components,
        "assets": assets,
        "bytes": _bytes(package.root)[1],
    }


def _check_assets(package: Package) -> list[str]:
    findings = []
    for uri, folder in package.assets.items():
        try:
            found = directory_hash(folder)
        except EPCtxError as exc:
            findings.append(f"shared asset {uri}: {exc}")
            continue
        if found != uri:
            findings.append(
                f"shared asset {uri}: its content hashes to {found} (changed after it was written)"
            )
    return findings


def validate_package(root: str | os.PathLike[str]) -> list[str]:
    """The findings (empty: the package is whole). A manifest that cannot be read raises."""
    from epctx.ep._compatibility import CompatibilityVerdict
    from epctx.tools.inspect import inspect_model

    package = read_package(root)
    findings = _check_assets(package)
    for component in package.components:
        for variant in component.variants:
            where = f"{component.name}/{variant.name}"
            chosen = Ranked(variant, CompatibilityVerdict.not_applicable("validated"), "-", "", ())
            try:
                model = resolve(package, component, chosen).model
                report = inspect_model(model, verify=True)
            except EPCtxError as exc:
                findings.append(f"{where}: {exc}")
                continue
            findings += [f"{where}: {f.severity}: {f.message}" for f in report.findings]
    return findings

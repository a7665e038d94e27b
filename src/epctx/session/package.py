"""onnxruntime's model package API over epctx (``ModelPackageContext``, ``ModelPackageOptions``,
``ModelPackageComponentContext``, same names and methods): selection ranks every variant over every EP and
device here (``epctx.package.select``), where onnxruntime's looks at the first EP only."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from epctx import options as opt
from epctx.errors import InvalidArgument
from epctx.package.context import Resolved, provider_names, resolve, session_arguments
from epctx.package.layout import Package, read_package
from epctx.package.select import select_variant
from epctx.session.inference import InferenceSession

__all__ = ["ModelPackageComponentContext", "ModelPackageContext", "ModelPackageOptions"]


class ModelPackageOptions:
    """What variant selection needs from session options: the providers asked for and the device policy."""

    def __init__(self, sess_options: opt.SessionOptions | None = None) -> None:
        self.providers = provider_names(None, sess_options)
        self.policy: int | None = getattr(sess_options, "_selection_policy", None)


class ModelPackageComponentContext:
    def __init__(self, package: Package, resolved: Resolved) -> None:
        self._package = package
        self.resolved = resolved

    def get_selected_variant_name(self) -> str:
        return self.resolved.chosen.variant.name

    def get_selected_variant_folder_path(self) -> str:
        return str(self.resolved.chosen.variant.directory)

    def create_session(
        self,
        sess_options: opt.SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
    ) -> Any:
        """An InferenceSession of the selected variant (``None``: the package's options, as onnxruntime)."""
        model, so, provs, popts = session_arguments(self.resolved, sess_options, providers, provider_options)
        return InferenceSession(model, so, providers=provs, provider_options=popts)


class ModelPackageContext:
    """An opened package (onnxruntime's ``ModelPackageContext``)."""

    def __init__(self, package_root: str | os.PathLike[str]) -> None:
        self.package = read_package(package_root)

    def get_schema_version(self) -> int:
        return 1

    def get_component_names(self) -> list[str]:
        return [c.name for c in self.package.components]

    def get_component_count(self) -> int:
        return len(self.package.components)

    def get_variant_names(self, component_name: str) -> list[str]:
        return [v.name for v in self.package.component(component_name).variants]

    def get_variant_count(self, component_name: str) -> int:
        return len(self.package.component(component_name).variants)

    def get_variant_ep_name(self, component_name: str, variant_name: str) -> str | None:
        for v in self.package.component(component_name).variants:
            if v.name == variant_name:
                return v.ep
        raise InvalidArgument(f"component {component_name!r} has no variant {variant_name!r}")

    def select_component(
        self, component_name: str, options: ModelPackageOptions | None = None
    ) -> ModelPackageComponentContext:
        options = options or ModelPackageOptions()
        component = self.package.component(component_name)
        chosen = select_variant(component, options.providers, options.policy)
        return ModelPackageComponentContext(self.package, resolve(self.package, component, chosen))

"""How the suite runs each EP: a ``Profile`` (options, tolerance, options for single cases), declared by each
EP folder next to its EP (``EP_CONFORMANCE`` in the folder's ``__init__.py``, import-free), so adding an EP
edits nothing outside its folder::

    EP_CONFORMANCE = {
        "atol": 1e-5, "rtol": 1e-5,                     # default 1e-4 each
        "options": {"precision": "f32"},                 # provider options of every session
        "case_options": {"partial_model": {"disabled_ops": "LayerNormalization"}},
    }

``conformance_profiles()`` is every compiling EP found here: the declared profiles of the built-in folders
whose packages are installed (declared means run: a folder whose EP cannot be created fails the suite rather
than drop out of it), then any other compiling EP (registered, entry point) with the default profile."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any

from epctx.errors import EPCtxError, InvalidArgument

__all__ = ["Profile", "compiling_providers", "conformance_profiles", "declared_profiles"]

_FIELDS = ("options", "atol", "rtol", "case_options")


@dataclasses.dataclass(frozen=True)
class Profile:
    """How the suite runs one EP: its options, its tolerance, options for single cases, and Python code run
    first in the fresh processes of the round-trip cases (an EP that such a process only finds once
    registered, e.g. a plugin library registered by path)."""

    ep: str
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    atol: float = 1e-4
    rtol: float = 1e-4
    case_options: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    fresh_process_setup: str = ""

    @classmethod
    def declared(cls, ep: str, declaration: Mapping[str, Any], where: str) -> Profile:
        """The profile an EP folder declares (``EP_CONFORMANCE``); an unknown key or a bad value is
        InvalidArgument naming ``where``."""
        if not isinstance(declaration, Mapping):
            raise InvalidArgument(f"{where}: EP_CONFORMANCE must be a dict, got {declaration!r}")
        unknown = sorted(set(declaration) - set(_FIELDS))
        if unknown:
            raise InvalidArgument(
                f"{where}: EP_CONFORMANCE has unknown key(s) {unknown}; known: {list(_FIELDS)}"
            )
        try:
            return cls(
                ep,
                options=_strings(declaration.get("options", {})),
                atol=float(declaration.get("atol", 1e-4)),
                rtol=float(declaration.get("rtol", 1e-4)),
                case_options=MappingProxyType(
                    {str(case): _strings(opts) for case, opts in declaration.get("case_options", {}).items()}
                ),
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgument(f"{where}: EP_CONFORMANCE: {exc}") from exc


def _strings(options: Mapping[str, Any]) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in dict(options).items()})


def declared_profiles() -> list[Profile]:
    """The profiles the built-in EP folders declare, for those whose required packages are installed."""
    from epctx.providers.builtin import builtin_declarations

    return [
        Profile.declared(d.name, d.conformance, f"EP folder epctx.providers.{d.folder}")
        for d in builtin_declarations()
        if d.conformance is not None and not d.missing()
    ]


def conformance_profiles() -> list[Profile]:
    """Every compiling EP here: the declared profiles, then the other compiling EPs with the default one."""
    declared = declared_profiles()
    names = {p.ep for p in declared}
    return declared + [Profile(name) for name in compiling_providers(skip=names)]


def compiling_providers(*, skip: Collection[str] = ()) -> list[str]:
    """The compiling EPs usable here (built-in, entry-point or registered), in precedence order (those in
    ``skip`` left out, not even created)."""
    from epctx.providers.registry import available_providers, create_provider

    found = []
    for name in available_providers():
        if name in skip:
            continue
        try:
            if create_provider(name).compiles:
                found.append(name)
        except EPCtxError:  # listed but not usable here (e.g. no device): nothing to test
            continue
    return found

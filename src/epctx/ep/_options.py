"""Provider options, declared once and parsed the same way by every EP.

An EP lists its options as :class:`Option` values and calls :func:`parse_options` on the (string) options it is
given; the result maps every declared option to its typed value (the default when absent). An unknown option,
or a value of the wrong kind, is InvalidArgument naming the EP, the option, the value and what is allowed: an
option an EP accepts is an option it honours.

    OPTIONS = (
        Option("device_type", "str", default="CPU", doc="OpenVINO device"),
        Option("precision", "choice", choices={"f32": "f32", "fp32": "f32", "f16": "f16"}),
        Option("num_streams", "int", doc="NUM_STREAMS (a positive integer)"),
        Option("weightless", "bool", default=False),
        Option("disabled_ops", "list", default=frozenset()),
    )
    values = parse_options("MyExecutionProvider", options, OPTIONS)  # a read-only mapping

or straight into a frozen dataclass with one field per option (``Option.field`` renames one):

    @dataclasses.dataclass(frozen=True)
    class MyOptions:
        device_type: str
        ...
    config = parse_options("MyExecutionProvider", options, OPTIONS, into=MyOptions)
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from epctx.errors import InvalidArgument

__all__ = ["RESERVED_OPTION_PREFIX", "Option", "parse_options"]

T = TypeVar("T")
OptionKind = Literal["str", "int", "bool", "choice", "list"]
# Provider option keys starting with this are the framework's: no EP may declare one.
RESERVED_OPTION_PREFIX = "epctx."
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclasses.dataclass(frozen=True)
class Option:
    """One provider option.

    ``kind``: ``str`` (stripped; empty is the default), ``int`` (a positive integer), ``bool`` (1/0, true/false,
    yes/no, on/off), ``choice`` (``choices`` maps each accepted spelling, compared case-insensitively, to the
    value), ``list`` (comma-separated, a frozenset; ``choices`` lists the allowed items when given)."""

    name: str
    kind: OptionKind
    default: Any = None
    choices: Mapping[str, Any] | Collection[str] | None = None
    doc: str = ""
    field: str = ""  # the attribute it fills with ``parse_options(..., into=...)``; default: ``name``

    def __post_init__(self) -> None:
        if self.name.startswith(RESERVED_OPTION_PREFIX):
            raise InvalidArgument(
                f"provider option {self.name!r}: keys starting with {RESERVED_OPTION_PREFIX!r} are reserved to the framework; "
                "an EP may not declare one"
            )

    def parse(self, ep_name: str, raw: str) -> Any:
        where = f"{ep_name} option {self.name!r}"
        text = str(raw).strip()
        if self.kind == "str":
            return text or self.default
        if self.kind == "int":
            try:
                value = int(text)
            except ValueError:
                value = 0
            if value < 1:
                raise InvalidArgument(f"{where}: expected a positive integer, got {raw!r}")
            return value
        if self.kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise InvalidArgument(f"{where}: expected 0 or 1, got {raw!r}")
        if self.kind == "choice":
            table = self.choices if isinstance(self.choices, Mapping) else {c: c for c in self.choices or ()}
            lowered = {str(k).lower(): v for k, v in table.items()}
            if text.lower() not in lowered:
                allowed = sorted({str(v) for v in table.values()})
                raise InvalidArgument(f"{where}: expected one of {allowed}, got {raw!r}")
            return lowered[text.lower()]
        items = frozenset(item.strip() for item in text.split(",") if item.strip())
        if self.choices is not None:
            bad = sorted(items - set(self.choices))
            if bad:
                raise InvalidArgument(
                    f"{where}: unsupported value(s) {bad}; supported: {sorted(self.choices)}"
                )
        return items


@overload
def parse_options(ep_name: str, options: Mapping[str, str], spec: Sequence[Option]) -> Mapping[str, Any]: ...
@overload
def parse_options(
    ep_name: str, options: Mapping[str, str], spec: Sequence[Option], *, into: Callable[..., T]
) -> T: ...
def parse_options(
    ep_name: str,
    options: Mapping[str, str],
    spec: Sequence[Option],
    *,
    into: Callable[..., Any] | None = None,
) -> Any:
    """Every declared option's typed value (its default when not given), as a read-only mapping by name, or
    ``into(**{option.field or option.name: value})`` (a frozen dataclass, say); unknown options are
    InvalidArgument listing the known ones."""
    known = {option.name: option for option in spec}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidArgument(
            f"{ep_name}: unknown provider option(s) {unknown}; valid options: {list(known)}"
        )
    values = {
        name: option.parse(ep_name, options[name]) if name in options else option.default
        for name, option in known.items()
    }
    if into is None:
        return types.MappingProxyType(values)
    return into(**{known[name].field or name: value for name, value in values.items()})

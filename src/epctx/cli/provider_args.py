"""The ``-p`` / ``--option`` / ``--ep-library`` arguments every verb that takes providers shares.

``-p EP[:k=v,...]`` adds a provider (quote a value that holds commas: ``-p 'EP:disabled_ops="Gather,Softmax"'``);
``--option k=v`` (repeatable) adds one option, taken whole, to the ``-p`` before it;
``--ep-library NAME=PATH`` registers a plugin EP library (a Python file or module) so ``-p`` can name its EPs.
``-p`` takes an EP's full name, or a short one as ``epctx share -e`` does (ep_weight_sharing_ctx_gen's
``qnn``, ``openvino``, ``tensorrt``, ``vitisai``; an EP found here without ``ExecutionProvider``, any case:
``iree``, ``example``, ``cpu``). A full name is onnxruntime's exact string: misspelt, or in another case, it is
an error with a "did you mean" (from the library, which a script gets too).
Parsing and normalising is the library's (``epctx.providers.selection``): one normaliser for everything.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["ORT_TOOL_EPS", "add_provider_arguments", "ep_name", "providers_from_args"]

# ep_weight_sharing_ctx_gen's -e values and the EPs they name.
ORT_TOOL_EPS = {
    "qnn": "QNNExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "vitisai": "VitisAIExecutionProvider",
}
_SUFFIX = "executionprovider"


class _AddProvider(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        items.append((values, []))
        setattr(namespace, self.dest, items)


class _AddOption(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        items = getattr(namespace, "provider", None)
        if not items:
            parser.error(f"{option_string} {values} must follow the -p EP it applies to")
        else:
            items[-1][1].append(values)


def add_provider_arguments(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "-p",
        "--provider",
        action=_AddProvider,
        default=[],
        required=required,
        metavar="EP[:k=v,...]",
        help='execution provider, in precedence order (repeatable); quote values with commas: EP:k="a,b"',
    )
    parser.add_argument(
        "--option",
        "-O",
        action=_AddOption,
        metavar="KEY=VALUE",
        help="one provider option for the -p before it (repeatable; the value is taken whole)",
    )
    parser.add_argument(
        "--ep-library",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="register a plugin EP library (Python file or module exposing create_ep_factories) first",
    )


def ep_name(value: str) -> str:
    """The EP a short name stands for (see the module's doc); any other name as it is."""
    import epctx

    short = value.lower()
    if short in ORT_TOOL_EPS:
        return ORT_TOOL_EPS[short]
    if short.endswith(_SUFFIX):
        return value
    return next(
        (n for n in epctx.get_available_providers() if n.lower().removesuffix(_SUFFIX) == short), value
    )


def register_libraries(args: argparse.Namespace) -> None:
    import epctx

    for item in getattr(args, "ep_library", None) or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--ep-library expects NAME=PATH, got {item!r}")
        epctx.register_execution_provider_library(name, path)


def providers_from_args(args: argparse.Namespace) -> list[tuple[str, dict[str, str]]]:
    """The providers the command line asked for, normalised (libraries from --ep-library registered first)."""
    from epctx.providers.selection import (
        check_provider_name,
        normalize_providers,
        parse_option,
        parse_provider_spec,
    )

    register_libraries(args)
    specs: list[Any] = []
    for spec, extra in getattr(args, "provider", None) or []:
        name, options = parse_provider_spec(spec)
        name = ep_name(name)
        check_provider_name(name)  # a typo fails now, before outputs are checked or progress is shown
        for item in extra:
            key, value = parse_option(item, name)
            options[key] = value
        specs.append((name, options))
    return normalize_providers(specs)

"""The command line of ONNX Runtime's ``ep_weight_sharing_ctx_gen``, as ``epctx share`` takes it, so its users'
scripts run unchanged::

    ep_weight_sharing_ctx_gen -e openvino -i "k1|v1 k2|v2" -C "ep.context_node_name_prefix|_part1" m1.onnx,m2.onnx

``-e qnn|tensorrt|openvino|vitisai`` (also any EP name found here, ``example`` or ``ExampleExecutionProvider``);
``-i "<key>|<value> ..."`` the EP's options; ``-C "<key>|<value> ..."`` session config entries (a key given twice
is an error; ``ep.context_enable`` other than 1, ``ep.context_embed_mode`` other than 0 and
``ep.context_file_path`` are ignored with a message, as the tool does); ``-p FILE.json`` a plugin EP config
(``ep_library_registration_name``, ``ep_library_path``, ``default_ep_options`` and one of ``selected_ep_name`` /
``selected_ep_device_indices``), taking precedence over ``-e`` and ``-i``; models separated by commas."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epctx.cli.failures import UsageError
from epctx.cli.provider_args import ORT_TOOL_EPS
from epctx.errors import Fail, InvalidArgument

__all__ = ["ORT_TOOL_EPS", "PluginConfig", "ep_from_e", "model_paths", "pipe_pairs", "session_entries"]

PROG = "epctx share"
_FORCED = {"ep.context_enable": "1", "ep.context_embed_mode": "0"}


def pipe_pairs(texts: Sequence[str], flag: str, *, unique: bool) -> dict[str, str]:
    """``"k1|v1 k2|v2"`` (whitespace separated, possibly several flags) as a dict."""
    found: dict[str, str] = {}
    for text in texts:
        for token in text.split():
            key, sep, value = token.partition("|")
            if not sep or not key:
                raise UsageError(
                    f"{flag} expects '<key>|<value>' pairs separated by spaces, got {token!r}", PROG
                )
            if unique and key in found:
                raise UsageError(f"{flag} gives {key!r} twice", PROG)
            found[key] = value
    return found


def session_entries(texts: Sequence[str]) -> dict[str, str]:
    """``-C`` entries the generation honours (the ones the tool ignores are dropped with a message)."""
    entries = pipe_pairs(texts, "-C", unique=True)
    for key, forced in _FORCED.items():
        if key in entries and entries.pop(key) != forced:
            print(f"{PROG}: -C {key} ignored: weight sharing needs {key}={forced}", file=sys.stderr)
    if entries.pop("ep.context_file_path", None) is not None:
        print(
            f"{PROG}: -C ep.context_file_path ignored: use -o/--output-dir to choose the folder",
            file=sys.stderr,
        )
    return entries


def ep_from_e(value: str) -> str:
    """The EP ``-e`` names: the tool's short names, or an EP found here by its name (``ExecutionProvider``
    optional, any case)."""
    import epctx

    available = epctx.get_available_providers()
    wanted = ORT_TOOL_EPS.get(value.lower(), value).lower()
    for name in available:
        if wanted in (name.lower(), name.lower().removesuffix("executionprovider")):
            return name
    if wanted in (n.lower() for n in ORT_TOOL_EPS.values()):
        raise Fail(f"-e {value}: epctx has no {ORT_TOOL_EPS.get(value.lower(), value)} (onnxruntime's); EPs here: "
                   f"{', '.join(available)}")  # fmt: skip
    raise InvalidArgument(f"-e {value}: no EP of that name here; EPs here: {', '.join(available)}")


def model_paths(items: Sequence[str]) -> list[Path]:
    """Positional models: ``m1.onnx,m2.onnx`` as the tool takes them, or separate arguments (a path that exists
    whole is never split)."""
    paths: list[Path] = []
    for item in items:
        parts = [item] if Path(item).exists() else [p for p in item.split(",") if p]
        paths.extend(Path(p) for p in parts)
    if not paths:
        raise UsageError("no model given", PROG)
    return paths


class PluginConfig:
    """``-p FILE.json``: ep_weight_sharing_ctx_gen's plugin EP configuration."""

    def __init__(self, path: str) -> None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"-p {path}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise InvalidArgument(f"-p {path}: expected a JSON object")
        missing = [k for k in ("ep_library_registration_name", "ep_library_path") if k not in data]
        if missing:
            raise InvalidArgument(f"-p {path}: missing {', '.join(missing)}")
        self.registration_name = str(data["ep_library_registration_name"])
        self.library_path = str(
            data["ep_library_path"]
        )  # as the tool takes it: relative to the current folder
        self.options = {str(k): str(v) for k, v in dict(data.get("default_ep_options") or {}).items()}
        self.ep_name = str(data.get("selected_ep_name") or "")
        self.indices = [int(i) for i in data.get("selected_ep_device_indices") or []]
        if bool(self.ep_name) == bool(self.indices):
            raise InvalidArgument(
                f"-p {path}: give exactly one of 'selected_ep_name' or 'selected_ep_device_indices'"
            )
        self.path = path

    def add_to(self, so: Any) -> str:
        """Register the library and add its EP to ``so``; the EP's name."""
        import epctx
        from epctx.providers.registry import registered_libraries

        if self.registration_name not in registered_libraries():
            epctx.register_execution_provider_library(self.registration_name, self.library_path)
        devices = epctx.get_ep_devices()
        if self.indices:
            bad = [i for i in self.indices if not 0 <= i < len(devices)]
            if bad:
                raise InvalidArgument(
                    f"-p {self.path}: selected EP device index {bad[0]} out of range (0..{len(devices) - 1})"
                )
            chosen = [devices[i] for i in self.indices]
        else:
            chosen = [d for d in devices if d.ep_name == self.ep_name]
        if not chosen:
            raise InvalidArgument(f"-p {self.path}: no EP device named {self.ep_name!r} was found")
        so.add_provider_for_devices(chosen, self.options)
        return chosen[0].ep_name

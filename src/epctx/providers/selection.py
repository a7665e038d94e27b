"""The one provider normaliser (InferenceSession, ModelCompiler and every CLI verb) and the device selection
policies.

Where a session's EPs come from, first match wins:

1. ``providers=`` (and ``provider_options=``) given to ``InferenceSession``: names or ``(name, options)``;
2. the session options' ``add_provider(name, options)`` / ``add_provider_for_devices(devices, options)``, in
   the order added (giving both 1 and 2 is an error: one of them would be ignored);
3. the session options' selection delegate or policy, over ``get_ep_devices()``;
4. nothing: the CPU EP alone.

The CPU EP is appended last unless ``session.disable_cpu_ep_fallback=1``. An EP onnxruntime has and epctx
lacks (CUDA, TensorRT, ...) is skipped with a warning (``logging`` and ``warnings``), as onnxruntime does, unless
``session.unavailable_ep_is_error=1``; any other unknown name is an error (onnxruntime warns and falls back to
the CPU EP there: a misspelt name would run on the wrong EP unnoticed).

Policies (ONNX Runtime's semantics: ``DEFAULT`` is ``PREFER_CPU``; ``MAX_PERFORMANCE`` is ``PREFER_GPU``;
``MAX_EFFICIENCY`` and ``MIN_OVERALL_POWER`` are ``PREFER_NPU``). Devices are ordered as ORT orders them:
discrete GPUs before integrated ones, the CPU EP after every other EP on the CPU, otherwise in
``get_ep_devices()`` order. Then:

- ``PREFER_CPU`` (and ``DEFAULT``): the first CPU device (so an EP that runs on the CPU, e.g. OpenVINO on CPU,
  before the CPU EP). CPU-only, GPU and NPU machines alike: that one CPU device.
- ``PREFER_GPU``: the first GPU device, then the ``PREFER_CPU`` pick. CPU-only machine: the ``PREFER_CPU``
  pick; GPU machine: the GPU (discrete first) plus the CPU pick; NPU-only machine: the CPU pick.
- ``PREFER_NPU``: the first NPU device, then the ``PREFER_CPU`` pick. CPU-only or GPU-only machine: the
  CPU pick; NPU machine: the NPU plus the CPU pick.

epctx goes further: policies never pick a virtual device (those are for explicit cross-compilation), nor an
EP whose folder declares ``EP_BY_POLICY = False`` (the Example EP, a template rather than a faster backend).
Devices an EP is picked for are given to it together (one EP per EP name, in the order first picked).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx import options as opt
from epctx._warnings import warn_and_log
from epctx.ep._devices import EpDevice, ExecutionProviderDevicePolicy, HardwareDeviceType
from epctx.ep._weightless import setting_for
from epctx.errors import EPCtxError, Fail, InvalidArgument
from epctx.providers import registry

if TYPE_CHECKING:
    from epctx.ep import ExecutionProvider

__all__ = [
    "ORT_ONLY_PROVIDERS",
    "ProviderSpec",
    "check_provider_name",
    "normalize_providers",
    "parse_provider_spec",
    "resolve_providers",
    "select_ep_devices",
]

logger = logging.getLogger("epctx")

ProviderSpec = str | tuple[str, Mapping[str, Any]]

# onnxruntime's EPs that epctx does not have: asked for by name, they are skipped with a warning.
ORT_ONLY_PROVIDERS = frozenset(
    {
        "ACLExecutionProvider",
        "ArmNNExecutionProvider",
        "AzureExecutionProvider",
        "CANNExecutionProvider",
        "CoreMLExecutionProvider",
        "CUDAExecutionProvider",
        "DmlExecutionProvider",
        "DnnlExecutionProvider",
        "JsExecutionProvider",
        "MIGraphXExecutionProvider",
        "NnapiExecutionProvider",
        "NvTensorRTRTXExecutionProvider",
        "QNNExecutionProvider",
        "RknpuExecutionProvider",
        "ROCMExecutionProvider",
        "SNPEExecutionProvider",
        "TensorrtExecutionProvider",
        "TvmExecutionProvider",
        "VitisAIExecutionProvider",
        "WebGpuExecutionProvider",
        "WebNNExecutionProvider",
        "XnnpackExecutionProvider",
    }
)


# -- parsing and normalising ---------------------------------------------------------------------------
def parse_provider_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``Name`` or ``Name:key=value,key=value`` (the command line's ``-p``). A value holding commas is quoted:
    ``Name:disabled_ops="Gather,Softmax"`` (single or double quotes)."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise InvalidArgument(f"provider {spec!r} has no name")
    options: dict[str, str] = {}
    for item in _split_items(rest, spec):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"provider option {item!r} in {spec!r} is not key=value")
        options[key.strip()] = _unquote(value.strip(), spec)
    return name, options


def parse_option(item: str, provider: str) -> tuple[str, str]:
    """One ``key=value`` (the command line's ``--option``), taken whole: the value may hold commas."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise InvalidArgument(f"option {item!r} for provider {provider!r} is not key=value")
    return key.strip(), value


def _split_items(text: str, spec: str) -> list[str]:
    items, current, quote = [], [], ""
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
            current.append(ch)
        elif ch == ",":
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if quote:
        raise InvalidArgument(f"unclosed {quote} in provider {spec!r}")
    items.append("".join(current))
    return [item for item in items if item.strip()]


def _unquote(value: str, spec: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    if "'" in value or '"' in value:
        raise InvalidArgument(
            f"a quoted provider option value must be quoted whole, got {value!r} in {spec!r}"
        )
    return value


def normalize_providers(
    providers: Sequence[ProviderSpec] | None, provider_options: Sequence[Mapping[str, Any]] | None = None
) -> list[tuple[str, dict[str, str]]]:
    """``providers`` / ``provider_options`` as onnxruntime's ``check_and_normalize_provider_args`` takes them
    -> ``[(name, {key: str(value)})]``."""
    if isinstance(providers, str):
        raise InvalidArgument(f"providers must be a list of names, got the string {providers!r}")
    specs: list[tuple[str, dict[str, str]]] = []
    for k, p in enumerate(providers or []):
        if isinstance(p, str) and p:
            specs.append((p, {}))
        elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], Mapping):
            specs.append((p[0], {str(key): str(value) for key, value in p[1].items()}))
        else:
            raise InvalidArgument(f"providers[{k}] must be a name or a (name, options) tuple, got {p!r}")
    if provider_options is not None:
        if len(provider_options) != len(specs):
            raise InvalidArgument(
                f"provider_options has {len(provider_options)} entries for {len(specs)} providers"
            )
        for k, extra in enumerate(provider_options):
            if not isinstance(extra, Mapping):
                raise InvalidArgument(f"provider_options[{k}] must be a dict, got {extra!r}")
        specs = [
            (name, {**opts, **{str(key): str(value) for key, value in extra.items()}})
            for (name, opts), extra in zip(specs, provider_options)
        ]
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"a provider is listed twice: {names}")
    return specs


# -- policies ----------------------------------------------------------------------------------------------
def _order(devices: Sequence[EpDevice]) -> list[EpDevice]:
    def key(item: tuple[int, EpDevice]) -> tuple[int, int, int]:
        k, d = item
        integrated = d.device.type == HardwareDeviceType.GPU and d.device.metadata.get("Discrete") != "1"
        return (d.ep_name == registry.CPU_EP, integrated, k)

    return [d for _, d in sorted(enumerate(devices), key=key)]


def _first(devices: Sequence[EpDevice], kind: HardwareDeviceType) -> list[EpDevice]:
    return next(([d] for d in devices if d.device.type == kind), [])


def select_ep_devices(policy: int, ep_devices: Sequence[EpDevice]) -> list[EpDevice]:
    """The devices ``policy`` picks among ``ep_devices`` (virtual ones never), in precedence order."""
    policy = ExecutionProviderDevicePolicy(policy)
    ordered = _order([d for d in ep_devices if not d.device.is_virtual])
    cpu = _first(ordered, HardwareDeviceType.CPU)
    if policy in (ExecutionProviderDevicePolicy.PREFER_GPU, ExecutionProviderDevicePolicy.MAX_PERFORMANCE):
        picked = _first(ordered, HardwareDeviceType.GPU) + cpu
    elif policy in (
        ExecutionProviderDevicePolicy.PREFER_NPU,
        ExecutionProviderDevicePolicy.MAX_EFFICIENCY,
        ExecutionProviderDevicePolicy.MIN_OVERALL_POWER,
    ):
        picked = _first(ordered, HardwareDeviceType.NPU) + cpu
    else:  # DEFAULT, PREFER_CPU
        picked = cpu
    return picked


def _policy_candidates() -> list[EpDevice]:
    excluded = {d.name for d in registry.builtin_declarations() if not d.by_policy}
    return [d for d in registry.get_ep_devices() if d.ep_name not in excluded]


def _model_metadata(source: str | os.PathLike[str] | bytes | None) -> dict[str, str]:
    if source is None:
        return {}
    import onnx

    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            model = onnx.ModelProto.FromString(bytes(source))
        else:
            model = onnx.load(os.fspath(source), load_external_data=False)
    except Exception as exc:  # the session's own load reports it with the usual error
        logger.debug("model metadata for the selection delegate unavailable: %s", exc)
        return {}
    return {p.key: p.value for p in model.metadata_props}


def run_delegate(
    delegate: Callable[..., Any],
    ep_devices: Sequence[EpDevice],
    model_metadata: Mapping[str, str],
    runtime_metadata: Mapping[str, str],
) -> list[EpDevice]:
    """Call ``delegate(ep_devices, model_metadata, runtime_metadata, max_selections)`` and check its answer."""
    max_selections = len(ep_devices)
    try:
        chosen = delegate(list(ep_devices), dict(model_metadata), dict(runtime_metadata), max_selections)
    except EPCtxError:
        raise
    except Exception as exc:
        raise Fail(f"the provider selection delegate failed: {exc}") from exc
    chosen = list(chosen or [])
    if not chosen:
        raise InvalidArgument("the provider selection delegate selected no device")
    if len(chosen) > max_selections:
        raise InvalidArgument(
            f"the provider selection delegate selected {len(chosen)} devices, more than max_selections "
            f"({max_selections})"
        )
    offered = set(ep_devices)
    for device in chosen:
        if not isinstance(device, EpDevice) or device not in offered:
            raise InvalidArgument(
                f"the provider selection delegate returned {device!r}, which is not one of the EP devices it "
                "was given"
            )
    return chosen


def _grouped(devices: Sequence[EpDevice]) -> list[list[EpDevice]]:
    groups: dict[str, list[EpDevice]] = {}
    for device in devices:
        group = groups.setdefault(device.ep_name, [])
        if device not in group:
            group.append(device)
    return list(groups.values())


# -- resolution --------------------------------------------------------------------------------------------
def _by_name(name: str, options: Mapping[str, str], config: opt.SessionConfig) -> ExecutionProvider | None:
    if name in ORT_ONLY_PROVIDERS and name not in registry.available_providers():
        available = ", ".join(registry.available_providers())
        if config.unavailable_ep_is_error:
            raise InvalidArgument(
                f"{name} is an onnxruntime execution provider that epctx does not have (available: "
                f"{available}); {opt.UNAVAILABLE_EP_IS_ERROR}=1 makes this an error"
            )
        # onnxruntime's words first (scripts match on them), through logging and warnings as it does.
        message = (
            f"Specified provider '{name}' is not in available provider names.Available providers: "
            f"'{available}' ({name} is an onnxruntime execution provider that epctx does not have; skipped, "
            f"the rest of the list is used; {opt.UNAVAILABLE_EP_IS_ERROR}=1 makes this an error)"
        )
        warn_and_log(logger, message)
        return None
    check_provider_name(name)
    return registry.create_provider(name, options)


def check_provider_name(name: str) -> None:
    """An EP name nobody has is an error, with the closest known name (``OpenVinoExecutionProvider``: "did you
    mean 'OpenVINOExecutionProvider'?"); an onnxruntime EP epctx lacks passes (a session skips it, warning)."""
    from epctx.providers.builtin import builtin

    if builtin(name) is not None or name in ORT_ONLY_PROVIDERS:  # the common case, without a discovery
        return
    available = registry.available_providers()
    if name in available:
        return
    raise InvalidArgument(
        f"unknown execution provider {name!r}{_did_you_mean(name)}; available: {', '.join(available)}"
    )


def _did_you_mean(name: str) -> str:
    """`` (did you mean 'X'?)`` for the known EP name closest to ``name`` (epctx's EPs, installed or not, and
    onnxruntime's; case and the ``ExecutionProvider`` suffix aside: ``OpenVinoExecutionProvider`` and ``openvino``
    find ``OpenVINOExecutionProvider``), else ``""``."""
    import difflib

    from epctx.providers.builtin import builtin_declarations

    known: dict[str, str] = {}
    builtins = [d.name for d in builtin_declarations()]
    for full in (*sorted(ORT_ONLY_PROVIDERS), *builtins, *registry.available_providers()):
        known[full.lower()] = known[full.lower().removesuffix("executionprovider")] = full
    close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.75)
    return f" (did you mean {known[close[0]]!r}?)" if close else ""


def _threads(name: str, options: Mapping[str, str], threads: int) -> Mapping[str, str]:
    """``SessionOptions.intra_op_num_threads`` passed to the EP through the provider option its class names
    (``ExecutionProvider.intra_op_threads_option``), unless the user set that option."""
    if threads <= 0:
        return options
    cls = registry.provider_class(name)
    key = getattr(cls, "intra_op_threads_option", None)
    if key is None:
        if cls is not None:
            logger.info(
                "%s takes no thread count: intra_op_num_threads=%d does not apply to it", name, threads
            )
        return options
    return options if key in options else {**options, key: str(threads)}


def resolve_providers(
    providers: Sequence[ProviderSpec] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    options: opt.SessionOptions | Mapping[str, str] | None,
    *,
    source: str | os.PathLike[str] | bytes | None = None,
    config: opt.SessionConfig | None = None,
) -> list[ExecutionProvider]:
    """The EPs of a session in precedence order (see the module's docstring); ``source`` is the model, read for
    its metadata only when a selection delegate asks for it. ``config``: the session's parsed config (None:
    parsed here from ``options``)."""
    so = options if isinstance(options, opt.SessionOptions) else None
    if config is None:
        config = opt.SessionConfig(so.config if so is not None else options)  # type: ignore[arg-type]
    explicit = normalize_providers(providers, provider_options)
    entries = so.provider_entries if so is not None else []
    if explicit and entries:
        raise InvalidArgument(
            "providers were given both to the session (providers=...) and to its SessionOptions "
            "(add_provider / add_provider_for_devices); give them in one place"
        )
    threads = so.intra_op_num_threads if so is not None else 0
    eps: list[ExecutionProvider | None] = []
    if explicit:
        eps = [_by_name(name, _threads(name, opts, threads), config) for name, opts in explicit]
    elif entries:
        for target, opts in entries:
            if isinstance(target, str):
                eps.append(_by_name(target, _threads(target, opts, threads), config))
            else:
                eps.append(
                    registry.create_provider_for_devices(target, _threads(target[0].ep_name, opts, threads))
                )
    elif so is not None and (so.selection_policy_delegate is not None or so.selection_policy is not None):
        if so.selection_policy_delegate is not None:
            chosen = run_delegate(
                so.selection_policy_delegate, registry.get_ep_devices(), _model_metadata(source), {}
            )
        else:
            chosen = select_ep_devices(so.selection_policy or 0, _policy_candidates())
        logger.info(
            "selected devices: %s", ", ".join(f"{d.ep_name}/{d.device.type.name}" for d in chosen) or "none"
        )
        eps = [
            registry.create_provider_for_devices(group, _threads(group[0].ep_name, {}, threads))
            for group in _grouped(chosen)
        ]
    result = [ep for ep in eps if ep is not None]
    names = [ep.name for ep in result]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"a provider is listed twice: {names}")
    if registry.CPU_EP not in names and not config.disable_cpu_ep_fallback:
        result.append(registry.create_provider(registry.CPU_EP, _threads(registry.CPU_EP, {}, threads)))
    model_path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    for ep in result:  # weightless mode: checked against what each EP covers before anything compiles
        ep.weightless = setting_for(ep.name, ep.compiles, ep.weightless_supported_modes, config, model_path)
    return result

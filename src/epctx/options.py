"""SessionOptions / RunOptions and every session config key as a named constant."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from epctx.errors import InvalidArgument

__all__ = [
    "ExecutionMode",
    "GraphOptimizationLevel",
    "RunOptions",
    "SessionOptions",
    "config_flag",
]

# Session config keys (the names onnxruntime uses).
EP_CONTEXT_ENABLE = "ep.context_enable"
EP_CONTEXT_FILE_PATH = "ep.context_file_path"
EP_CONTEXT_EMBED_MODE = "ep.context_embed_mode"
EP_CONTEXT_NODE_NAME_PREFIX = "ep.context_node_name_prefix"
EP_CONTEXT_EXTERNAL_INITIALIZERS_FILE = "ep.context_model_external_initializers_file_name"
EXTERNAL_INITIALIZERS_FOLDER = "session.model_external_initializers_file_folder_path"
SHARE_EP_CONTEXTS = "ep.share_ep_contexts"
STOP_SHARE_EP_CONTEXTS = "ep.stop_share_ep_contexts"
DISABLE_MODEL_COMPILE = "session.disable_model_compile"
DISABLE_CPU_EP_FALLBACK = "session.disable_cpu_ep_fallback"

_BOOL_KEYS = frozenset(
    {
        EP_CONTEXT_ENABLE,
        EP_CONTEXT_EMBED_MODE,
        SHARE_EP_CONTEXTS,
        STOP_SHARE_EP_CONTEXTS,
        DISABLE_MODEL_COMPILE,
        DISABLE_CPU_EP_FALLBACK,
    }
)


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """Options for one session; mirrors ``onnxruntime.SessionOptions``."""

    def __init__(self) -> None:
        self._config: dict[str, str] = {}
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.enable_profiling = False
        self.optimized_model_filepath = ""
        # Providers added through add_provider (a name) / add_provider_for_devices (a tuple of EpDevice), in
        # precedence order; used by InferenceSession and ModelCompiler when no providers are given to them.
        self._providers: list[tuple[str | tuple[Any, ...], dict[str, str]]] = []
        self._selection_policy: int | None = None
        self._selection_delegate: Callable[..., Any] | None = None

    def add_session_config_entry(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"session config key must be a non-empty string, got {key!r}")
        if not isinstance(value, str):
            raise InvalidArgument(
                f"session config value for {key!r} must be a string, got {type(value).__name__}"
            )
        if key in _BOOL_KEYS and value not in ("0", "1"):
            raise InvalidArgument(f"session config {key!r} must be '0' or '1', got {value!r}")
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"session config entry {key!r} is not set")
        return self._config[key]

    def has_session_config_entry(self, key: str) -> bool:
        return key in self._config

    @property
    def config(self) -> Mapping[str, str]:
        """A read-only view of every config entry set so far."""
        return dict(self._config)

    def add_provider(self, provider_name: str, provider_options: Mapping[str, str] | None = None) -> None:
        """Use EP ``provider_name`` with ``provider_options`` (after the EPs added before it)."""
        if not isinstance(provider_name, str) or not provider_name:
            raise InvalidArgument(f"provider_name must be a non-empty string, got {provider_name!r}")
        self._providers.append((provider_name, _string_options(provider_options, provider_name)))

    def add_provider_for_devices(
        self, ep_devices: Sequence[Any], provider_options: Mapping[str, str] | None = None
    ) -> None:
        """Use the EP of ``ep_devices`` (``epctx.get_ep_devices()`` entries, all of one EP) on those devices,
        with ``provider_options`` over the devices' own ``ep_options``."""
        devices = tuple(ep_devices or ())
        if not devices or any(not hasattr(d, "ep_name") or not hasattr(d, "device") for d in devices):
            raise InvalidArgument(
                f"add_provider_for_devices needs a non-empty list of EpDevice (from get_ep_devices()), got "
                f"{ep_devices!r}"
            )
        names = sorted({d.ep_name for d in devices})
        if len(names) != 1:
            raise InvalidArgument(f"add_provider_for_devices: the devices must belong to one EP, got {names}")
        self._providers.append((devices, _string_options(provider_options, names[0])))

    def set_provider_selection_policy(self, policy: int) -> None:
        """How a session picks EPs and devices when none are given (``OrtExecutionProviderDevicePolicy``);
        see ``epctx.providers.selection`` for what each policy picks."""
        if isinstance(policy, bool) or not isinstance(policy, int) or not 0 <= int(policy) <= 6:
            raise InvalidArgument(
                f"policy must be an OrtExecutionProviderDevicePolicy (0..6), got {policy!r}"
            )
        self._selection_policy = int(policy)
        self._selection_delegate = None

    def set_provider_selection_policy_delegate(self, delegate: Callable[..., Any]) -> None:
        """Pick devices with ``delegate(ep_devices, model_metadata, runtime_metadata, max_selections) ->
        ep_devices`` when a session is given no providers (replaces a policy set before)."""
        if not callable(delegate):
            raise InvalidArgument(f"the selection policy delegate must be callable, got {delegate!r}")
        self._selection_delegate = delegate
        self._selection_policy = None

    @property
    def provider_entries(self) -> list[tuple[str | tuple[Any, ...], dict[str, str]]]:
        """What add_provider / add_provider_for_devices added, in order: (name or devices, options)."""
        return [(target, dict(options)) for target, options in self._providers]

    @property
    def providers(self) -> list[tuple[str, dict[str, str]]]:
        """(EP name, options) of every added provider (for devices: their EP, their ep_options under yours)."""
        result = []
        for target, options in self._providers:
            if isinstance(target, str):
                result.append((target, dict(options)))
            else:
                merged = {k: v for d in target for k, v in d.ep_options.items()}
                result.append((target[0].ep_name, {**merged, **options}))
        return result

    @property
    def selection_policy(self) -> int | None:
        return self._selection_policy

    @property
    def selection_policy_delegate(self) -> Callable[..., Any] | None:
        return self._selection_delegate


def _string_options(options: Mapping[str, Any] | None, provider: str) -> dict[str, str]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidArgument(f"options of provider {provider!r} must be a mapping, got {options!r}")
    return {str(k): str(v) for k, v in options.items()}


def config_flag(config: Mapping[str, str], key: str) -> bool:
    """A '0'/'1' config key read once at session creation."""
    return config.get(key, "0") == "1"


class RunOptions:
    """Per-call options; mirrors ``onnxruntime.RunOptions``."""

    def __init__(self) -> None:
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.run_tag = ""
        self.terminate = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[key] = value

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"run config entry {key!r} is not set")
        return self._config[key]

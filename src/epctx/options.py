"""SessionOptions / RunOptions and every session config key as a named constant."""

from __future__ import annotations

import enum
from collections.abc import Mapping

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
        # Providers added through add_provider / add_provider_for_devices (used by the compile API).
        self._providers: list[tuple[str, dict[str, str]]] = []

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
        self._providers.append((provider_name, {k: str(v) for k, v in (provider_options or {}).items()}))

    @property
    def providers(self) -> list[tuple[str, dict[str, str]]]:
        return list(self._providers)


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

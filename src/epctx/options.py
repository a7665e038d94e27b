"""SessionOptions / RunOptions and every session config key as a named constant."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, cast

from epctx import errors
from epctx.errors import InvalidArgument

__all__ = [
    "ExecutionMode",
    "GraphOptimizationLevel",
    "RunOptions",
    "SessionConfig",
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
# Weightless contexts, as onnxruntime: the mode ("0" NONE, "1" EXTERNAL_ONLY, "2" ALL) and where the source
# model is at load (epctx.ep._weightless).
EP_ENABLE_WEIGHTLESS_MODE = "ep.enable_weightless_mode"
EP_CONTEXT_SOURCE_MODEL_PATH = "ep.context_source_model_path"
# epctx's own: refit. A context model whose compiled code this generation reuses for a model with the same
# graph and shapes and other weights (EPs with ExecutionProvider.refits; nothing is compiled; ``epctx refit``).
REFIT_CONTEXT = "epctx.refit_context"
# epctx's own: self-healing contexts. off (default) | foreground | background: a context model that is
# EP_UNSUPPORTED or EP_SUPPORTED_PREFER_RECOMPILATION here is compiled again from its source (epctx.cache.heal).
SELF_HEAL = "epctx.self_heal"
SELF_HEAL_POLICIES = ("off", "foreground", "background")
STOP_SHARE_EP_CONTEXTS = "ep.stop_share_ep_contexts"
DISABLE_MODEL_COMPILE = "session.disable_model_compile"
DISABLE_CPU_EP_FALLBACK = "session.disable_cpu_ep_fallback"
# epctx's transparent cache: a folder where sessions over source models keep the context models they compile
# (loaded when the key and the verdict allow it; see epctx.cache.transparent), and its size bound in MB.
CONTEXT_CACHE = "epctx.context_cache"
CONTEXT_CACHE_MAX_MB = "epctx.context_cache_max_mb"
# epctx's own: "1" with ep.context_enable=1 reuses the context model that exists already at the context path when
# it was compiled from this source under this session's cache key and its verdict here is optimal, else compiles
# it again in place (epctx.cache.reuse). Off by default: onnxruntime then fails ("exists already"), as epctx.
CONTEXT_REUSE = "epctx.context_reuse"
# "1": a context model its EP judges EP_SUPPORTED_PREFER_RECOMPILATION is refused (else a warning); as onnxruntime.
FAIL_ON_SUBOPTIMAL_COMPILED_MODEL = "session.fail_on_suboptimal_compiled_model"
# epctx's own: "1" turns the warning for an onnxruntime EP that epctx lacks (CUDA, TensorRT...) into an error.
UNAVAILABLE_EP_IS_ERROR = "session.unavailable_ep_is_error"
# epctx's own: "1" reads context binaries into memory instead of mapping them, for files that may be replaced
# in place (``cp`` over them) while a session runs: a mapped file changes under the session, or faults.
CONTEXT_BINARY_COPY = "epctx.context_binary_copy"
# "0": no cost rule in the partition stage (a compiling EP keeps even the partitions whose boundaries cost more
# than they save; see epctx.partition.cost). Default "1".
PARTITION_COST_RULE = "epctx.partition.cost_rule"
# epctx's own trust policy (``epctx.trust``): PEM keys / certificates (os.pathsep-separated), the policy
# (off | warn | require | require-native) and the signature's path (default: model.sig beside the model).
TRUST_KEYS = "epctx.trust.keys"
TRUST_POLICY = "epctx.trust.policy"
TRUST_SIGNATURE = "epctx.trust.signature"
# the folder the signature covers (its manifest's names are relative to it; default: the model's folder, and
# the package's root for a session opened on a model package)
TRUST_ROOT = "epctx.trust.root"
TRUST_POLICIES = ("off", "warn", "require", "require-native")
# epctx's own: an EC private key (PEM) that generation signs the context model's folder with as it writes it
# (ModelCompiler.compile_to_file, sessions with ep.context_enable=1; ``epctx compile --sign``).
TRUST_SIGN_KEY = "epctx.trust.sign_key"
# epctx's own: "1" offers the nodes inside control-flow bodies (If / Loop / Scan) to the EPs as well, as the main
# graph's; off by default (measured: OpenVINO's partitions inside silero-vad's If bodies run no faster than
# the CPU EP there), never in a context model (its bodies were not compiled when it was made).
PARTITION_CONTROL_FLOW_BODIES = "session.partition_control_flow_bodies"


class SessionConfig:
    """The session config entries, parsed once when a session or a ModelCompiler is created: a frozen value
    the stages read instead of strings. Its fields (the key each comes from; absent: the default):

    - ``ep_context_enable`` (ep.context_enable, bool): generate a context model while creating the session;
    - ``ep_context_file_path`` (ep.context_file_path, str, ""): where the context model goes / is read from;
    - ``ep_context_embed_mode`` (ep.context_embed_mode, bool): binaries inside the model (1) or beside it (0);
    - ``ep_context_node_name_prefix`` (ep.context_node_name_prefix, str, ""): prefix of EPContext names;
    - ``ep_context_external_initializers_file`` (ep.context_model_external_initializers_file_name, str, "");
    - ``external_initializers_folder`` (session.model_external_initializers_file_folder_path, str, ""): where
      a model given as bytes finds its external data;
    - ``share_ep_contexts`` / ``stop_share_ep_contexts`` (ep.share_ep_contexts / ep.stop_share_ep_contexts,
      bool): join a weight-sharing group / write it;
    - ``disable_model_compile`` (session.disable_model_compile, bool): refuse any compile;
    - ``disable_cpu_ep_fallback`` (session.disable_cpu_ep_fallback, bool): no CPU EP for unclaimed nodes;
    - ``fail_on_suboptimal_compiled_model`` (session.fail_on_suboptimal_compiled_model, bool);
    - ``unavailable_ep_is_error`` (session.unavailable_ep_is_error, bool, epctx's own);
    - ``partition_control_flow_bodies`` (session.partition_control_flow_bodies, bool, epctx's own): offer the
      nodes inside If / Loop / Scan bodies to the EPs too;
    - ``ep_enable_weightless_mode`` (ep.enable_weightless_mode, int 0 / 1 / 2, 0): weightless contexts, NONE /
      EXTERNAL_ONLY / ALL (``epctx.ep._weightless``);
    - ``ep_context_source_model_path`` (ep.context_source_model_path, str, ""): where a context's source model
      is (weightless loads, self-healing);
    - ``refit_context`` (epctx.refit_context, str, ""): a context model whose code this generation reuses;
    - ``self_heal`` (epctx.self_heal, one of SELF_HEAL_POLICIES, "off"): compile a stale context again;
    - ``partition_cost_rule`` (epctx.partition.cost_rule, bool, True): the partition stage's cost rule
      (``epctx.partition.cost``); "0" turns it off;
    - ``context_cache`` (epctx.context_cache, str, ""): the transparent cache's folder;
    - ``context_cache_max_mb`` (epctx.context_cache_max_mb, float or None): its size bound in MB;
    - ``context_reuse`` (epctx.context_reuse, bool): reuse (or compile again) the context at the context path;
    - ``context_binary_copy`` (epctx.context_binary_copy, bool): read binaries instead of mapping them;
    - ``trust_keys`` (epctx.trust.keys, tuple of str, os.pathsep-separated), ``trust_policy``
      (epctx.trust.policy, one of TRUST_POLICIES, "off"), ``trust_signature`` (epctx.trust.signature, str, ""),
      ``trust_sign_key`` (epctx.trust.sign_key, str, ""), ``trust_root`` (epctx.trust.root, str, "");
    - ``entries``: every entry as given (a read-only mapping), those of onnxruntime's namespaces epctx does
      not read included.

    Unknown keys: onnxruntime accepts any ``session.`` / ``ep.`` key it does not read (measured with 1.32), and
    so does epctx there; a key in epctx's own namespace (``epctx.``) that epctx does not know is
    InvalidArgument, as an unknown provider option is. A known key with a bad value is InvalidArgument.
    A plain slotted class, not a dataclass: ``import epctx`` builds it (a frozen dataclass costs ~1 ms)."""

    __slots__ = (
        "context_binary_copy",
        "context_cache",
        "context_cache_max_mb",
        "context_reuse",
        "disable_cpu_ep_fallback",
        "disable_model_compile",
        "entries",
        "ep_context_embed_mode",
        "ep_context_enable",
        "ep_context_external_initializers_file",
        "ep_context_file_path",
        "ep_context_node_name_prefix",
        "ep_context_source_model_path",
        "ep_enable_weightless_mode",
        "external_initializers_folder",
        "fail_on_suboptimal_compiled_model",
        "partition_control_flow_bodies",
        "partition_cost_rule",
        "refit_context",
        "self_heal",
        "share_ep_contexts",
        "stop_share_ep_contexts",
        "trust_keys",
        "trust_policy",
        "trust_root",
        "trust_sign_key",
        "trust_signature",
        "unavailable_ep_is_error",
    )
    ep_context_enable: bool
    ep_context_file_path: str
    ep_context_embed_mode: bool
    ep_context_node_name_prefix: str
    ep_context_external_initializers_file: str
    external_initializers_folder: str
    share_ep_contexts: bool
    stop_share_ep_contexts: bool
    disable_model_compile: bool
    disable_cpu_ep_fallback: bool
    fail_on_suboptimal_compiled_model: bool
    unavailable_ep_is_error: bool
    partition_control_flow_bodies: bool
    ep_enable_weightless_mode: int
    ep_context_source_model_path: str
    refit_context: str
    self_heal: str
    partition_cost_rule: bool
    context_cache: str
    context_cache_max_mb: float | None
    context_reuse: bool
    context_binary_copy: bool
    trust_keys: tuple[str, ...]
    trust_policy: str
    trust_signature: str
    trust_sign_key: str
    trust_root: str
    entries: Mapping[str, str]

    def __init__(self, entries: Mapping[str, str] | None = None) -> None:
        """Parse ``entries`` (key -> str); see the class docstring."""
        given = dict(entries or {})
        for key in given:
            if key.startswith(EPCTX_PREFIX) and key not in _CONFIG_KEYS:
                raise InvalidArgument(_unknown_key(key))
        for key, (field, parse, default) in _CONFIG_KEYS.items():
            value = given.get(key)
            object.__setattr__(self, field, default if value is None else parse(key, value))
        object.__setattr__(self, "entries", MappingProxyType(given))

    @classmethod
    def of(cls, options: SessionOptions | None) -> SessionConfig:
        """The config of ``options`` (None: the defaults)."""
        return cls(options.config if options is not None else None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"SessionConfig is frozen: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"SessionConfig is frozen: {name} cannot be deleted")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionConfig) and dict(self.entries) == dict(other.entries)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.entries.items())))

    def __repr__(self) -> str:
        return f"SessionConfig({dict(self.entries)!r})"

    def replace(self, changes: Mapping[str, str | None]) -> SessionConfig:
        """A new config with entries set (a value) or removed (None)."""
        entries = dict(self.entries)
        for key, value in changes.items():
            if value is None:
                entries.pop(key, None)
            else:
                entries[key] = value
        return SessionConfig(entries)


EPCTX_PREFIX = "epctx."


def _flag(key: str, value: str) -> bool:
    if value not in ("0", "1"):
        raise InvalidArgument(f"session config {key!r} must be '0' or '1', got {value!r}")
    return value == "1"


def _text(key: str, value: str) -> str:
    return value


def _megabytes(key: str, value: str) -> float:
    try:
        mb = float(value)
    except ValueError:
        mb = -1.0
    if not mb >= 0:  # NaN too
        raise InvalidArgument(f"{key} must be a number of MB >= 0, got {value!r}")
    return mb


def _policy(key: str, value: str) -> str:
    value = value or "off"
    if value not in TRUST_POLICIES:
        raise InvalidArgument(
            f"session config {key!r} must be one of {', '.join(TRUST_POLICIES)}, got {value!r}"
        )
    return value


def _self_heal(key: str, value: str) -> str:
    value = value or "off"
    if value not in SELF_HEAL_POLICIES:
        raise InvalidArgument(
            f"session config {key!r} must be one of {', '.join(SELF_HEAL_POLICIES)}, got {value!r}"
        )
    return value


def weightless_mode(key: str, value: str) -> int:
    """``ep.enable_weightless_mode``: "0" / "1" / "2"; anything else (``3``, "") InvalidArgument."""
    if value not in ("0", "1", "2"):
        raise InvalidArgument(
            f"session config {key!r} must be '0' (NONE), '1' (EXTERNAL_ONLY) or '2' (ALL), got {value!r}"
        )
    return int(value)


def _paths(key: str, value: str) -> tuple[str, ...]:
    return tuple(p for p in value.split(os.pathsep) if p)


# key -> (SessionConfig field, parser, default when absent)
_CONFIG_KEYS: dict[str, tuple[str, Callable[[str, str], Any], Any]] = {
    EP_CONTEXT_ENABLE: ("ep_context_enable", _flag, False),
    EP_CONTEXT_FILE_PATH: ("ep_context_file_path", _text, ""),
    EP_CONTEXT_EMBED_MODE: ("ep_context_embed_mode", _flag, False),
    EP_CONTEXT_NODE_NAME_PREFIX: ("ep_context_node_name_prefix", _text, ""),
    EP_CONTEXT_EXTERNAL_INITIALIZERS_FILE: ("ep_context_external_initializers_file", _text, ""),
    EXTERNAL_INITIALIZERS_FOLDER: ("external_initializers_folder", _text, ""),
    SHARE_EP_CONTEXTS: ("share_ep_contexts", _flag, False),
    STOP_SHARE_EP_CONTEXTS: ("stop_share_ep_contexts", _flag, False),
    DISABLE_MODEL_COMPILE: ("disable_model_compile", _flag, False),
    DISABLE_CPU_EP_FALLBACK: ("disable_cpu_ep_fallback", _flag, False),
    FAIL_ON_SUBOPTIMAL_COMPILED_MODEL: ("fail_on_suboptimal_compiled_model", _flag, False),
    UNAVAILABLE_EP_IS_ERROR: ("unavailable_ep_is_error", _flag, False),
    PARTITION_CONTROL_FLOW_BODIES: ("partition_control_flow_bodies", _flag, False),
    EP_ENABLE_WEIGHTLESS_MODE: ("ep_enable_weightless_mode", weightless_mode, 0),
    EP_CONTEXT_SOURCE_MODEL_PATH: ("ep_context_source_model_path", _text, ""),
    REFIT_CONTEXT: ("refit_context", _text, ""),
    SELF_HEAL: ("self_heal", _self_heal, "off"),
    PARTITION_COST_RULE: ("partition_cost_rule", _flag, True),
    CONTEXT_CACHE: ("context_cache", _text, ""),
    CONTEXT_CACHE_MAX_MB: ("context_cache_max_mb", _megabytes, None),
    CONTEXT_REUSE: ("context_reuse", _flag, False),
    CONTEXT_BINARY_COPY: ("context_binary_copy", _flag, False),
    TRUST_KEYS: ("trust_keys", _paths, ()),
    TRUST_POLICY: ("trust_policy", _policy, "off"),
    TRUST_SIGNATURE: ("trust_signature", _text, ""),
    TRUST_SIGN_KEY: ("trust_sign_key", _text, ""),
    TRUST_ROOT: ("trust_root", _text, ""),
}


def _unknown_key(key: str) -> str:
    import difflib

    known = sorted(k for k in _CONFIG_KEYS if k.startswith(EPCTX_PREFIX))
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"unknown session config key {key!r}{hint}: the {EPCTX_PREFIX!r} namespace is epctx's own; its keys are "
        + ", ".join(known)
    )


def check_config_entry(key: str, value: str) -> None:
    """InvalidArgument for an entry SessionConfig would refuse: an unknown ``epctx.`` key, a bad value."""
    if key.startswith(EPCTX_PREFIX) and key not in _CONFIG_KEYS:
        raise InvalidArgument(_unknown_key(key))
    known = _CONFIG_KEYS.get(key)
    if known is not None:
        known[1](key, value)


class GraphOptimizationLevel(enum.IntEnum):
    __str__ = enum.Enum.__str__  # "GraphOptimizationLevel.ORT_ENABLE_ALL", as onnxruntime prints it

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    __str__ = enum.Enum.__str__

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class _Typed:
    """An option attribute of one type (TypeError otherwise, as onnxruntime's bindings raise), kept in a slot."""

    def __init__(self, kind: type | tuple[type, ...], enum_type: type[enum.IntEnum] | None = None) -> None:
        self.kind = kind
        self.enum_type = enum_type  # ints are kept as this enum's members

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.slot = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj: Any, value: Any) -> None:
        value = self._checked(obj, value)
        setattr(obj, self.slot, value)

    def _checked(self, obj: Any, value: Any) -> Any:
        if not isinstance(value, self.kind) or (isinstance(value, bool) and self.kind is int):
            raise TypeError(
                f"{type(obj).__name__}.{self.name} must be {_kind_name(self.kind)}, got {type(value).__name__}"
            )
        if self.enum_type is None:
            return value
        try:
            return self.enum_type(cast(int, value))
        except ValueError as exc:
            names = ", ".join(f"{m.name}={m.value}" for m in self.enum_type)
            raise InvalidArgument(
                f"{type(obj).__name__}.{self.name}: {value!r} is not one of {names}"
            ) from exc


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


class SessionOptions:
    """Options for one session; mirrors ``onnxruntime.SessionOptions``. Setting an attribute it does not have
    raises AttributeError (as onnxruntime's does), so a typo cannot pass silently.

    ``enable_cpu_mem_arena``, ``enable_mem_pattern``, ``enable_mem_reuse``, ``use_per_session_threads``,
    ``use_deterministic_compute`` and ``execution_order`` tune onnxruntime's allocator, thread pools and
    node order; epctx's results do not depend on them (numpy owns the memory, kernels are deterministic, the
    plan runs in topological order), so they are accepted and kept for get_session_options()."""

    __slots__ = (
        "_config",
        "_enable_cpu_mem_arena",
        "_enable_mem_pattern",
        "_enable_mem_reuse",
        "_enable_profiling",
        "_ep_context_data_read_func",
        "_execution_mode",
        "_execution_order",
        "_free_dims_by_denotation",
        "_free_dims_by_name",
        "_graph_optimization_level",
        "_initializers",
        "_inter_op_num_threads",
        "_intra_op_num_threads",
        "_log_severity_level",
        "_log_verbosity_level",
        "_logid",
        "_optimized_model_filepath",
        "_profile_file_prefix",
        "_providers",
        "_selection_delegate",
        "_selection_policy",
        "_use_deterministic_compute",
        "_use_per_session_threads",
    )

    graph_optimization_level = _Typed(int, GraphOptimizationLevel)
    execution_mode = _Typed(int, ExecutionMode)
    execution_order = _Typed(int)
    log_severity_level = _Typed(int)  # -1: the default logger's (set_default_logger_severity); 0..4 as in ORT
    log_verbosity_level = _Typed(int)
    logid = _Typed(str)
    intra_op_num_threads = _Typed(int)
    inter_op_num_threads = _Typed(int)
    enable_profiling = _Typed(bool)
    profile_file_prefix = _Typed(str)
    optimized_model_filepath = _Typed((str, os.PathLike))
    enable_cpu_mem_arena = _Typed(bool)
    enable_mem_pattern = _Typed(bool)
    enable_mem_reuse = _Typed(bool)
    use_deterministic_compute = _Typed(bool)
    use_per_session_threads = _Typed(bool)

    def __init__(self) -> None:
        self._config: dict[str, str] = {}
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = 0
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.optimized_model_filepath = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._free_dims_by_name: dict[str, int] = {}
        self._free_dims_by_denotation: dict[str, int] = {}
        self._initializers: dict[str, Any] = {}
        # Providers added through add_provider (a name) / add_provider_for_devices (a tuple of EpDevice), in
        # precedence order; used by InferenceSession and ModelCompiler when no providers are given to them.
        self._providers: list[tuple[str | tuple[Any, ...], dict[str, str]]] = []
        self._selection_policy: int | None = None
        self._selection_delegate: Callable[..., Any] | None = None
        self._ep_context_data_read_func: Callable[[str], Any] | None = None

    # -- graph changes at session creation -----------------------------------------------------------------
    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic dimension ``dim_name`` of the graph inputs to ``dim_value``."""
        self._free_dims_by_name[_dim_key(dim_name, "dim_name")] = _dim_value(dim_value, dim_name)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        """Fix every graph-input dimension with denotation ``dim_denotation`` (e.g. ``DATA_BATCH``)."""
        self._free_dims_by_denotation[_dim_key(dim_denotation, "dim_denotation")] = _dim_value(
            dim_value, dim_denotation
        )

    @property
    def free_dimension_overrides(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(by name, by denotation), as added."""
        return dict(self._free_dims_by_name), dict(self._free_dims_by_denotation)

    def add_initializer(self, name: str, value: Any) -> None:
        """Use ``value`` (an OrtValue or a numpy array, kept by reference) for the model's initializer
        ``name``. onnxruntime takes an OrtValue only; epctx takes a numpy array as well."""
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"add_initializer: the name must be a non-empty string, got {name!r}")
        numpy = getattr(value, "numpy", None)
        if not callable(numpy) and not hasattr(value, "__array__"):
            raise InvalidArgument(
                f"add_initializer({name!r}): the value must be an OrtValue or a numpy array, got "
                f"{type(value).__name__}"
            )
        self._initializers[name] = value

    @property
    def initializers(self) -> Mapping[str, Any]:
        """What add_initializer added: name -> OrtValue or array."""
        return dict(self._initializers)

    def register_custom_ops_library(self, library_path: str) -> None:
        raise errors.NotImplemented(
            f"register_custom_ops_library({library_path!r}): epctx does not load onnxruntime custom-op "
            "libraries (compiled against onnxruntime's C API). Write the ops as an execution provider instead: "
            "an epctx.ep.ExecutionProvider whose get_capability claims your domain's nodes and whose "
            "create_kernel (or compile) runs them, added as a folder or a plugin library "
            "(epctx.register_execution_provider_library)"
        )

    def has_providers(self) -> bool:
        return bool(self._providers)

    def add_session_config_entry(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"session config key must be a non-empty string, got {key!r}")
        if not isinstance(value, str):
            raise InvalidArgument(
                f"session config value for {key!r} must be a string, got {type(value).__name__}"
            )
        check_config_entry(key, value)  # what SessionConfig refuses at session creation, refused now
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

    def set_ep_context_data_read_func(self, read_func: Callable[[str], Any] | None) -> None:
        """``read_func(name)`` returns the bytes of the context binary an EPContext node names (e.g. decrypted
        from the application's store) instead of epctx reading the file (``epctx.trust.hooks``); None clears it.
        onnxruntime: ``SessionOptionsSetEpContextDataReadFunc``."""
        if read_func is not None and not callable(read_func):
            raise InvalidArgument(
                f"the EPContext data read function must be callable, got {type(read_func).__name__}"
            )
        self._ep_context_data_read_func = read_func

    @property
    def ep_context_data_read_func(self) -> Callable[[str], Any] | None:
        return self._ep_context_data_read_func

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


def with_config(options: SessionOptions, changes: Mapping[str, str | None]) -> SessionOptions:
    """A copy of ``options`` with config entries set (a value) or removed (None); ``options`` is unchanged."""
    import copy

    derived = copy.copy(options)
    config = dict(options.config)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    derived._config = config
    return derived


def config_flag(config: Mapping[str, str], key: str) -> bool:
    """A '0'/'1' config key read once at session creation."""
    return config.get(key, "0") == "1"


class RunOptions:
    """Per-call options; mirrors ``onnxruntime.RunOptions`` (an unknown attribute raises AttributeError).

    ``terminate = True`` (set before or, from another thread, during a run) stops the run with Fail
    between plan steps; ``log_severity_level`` / ``log_verbosity_level`` apply to the run's logging;
    ``logid`` (``run_tag`` is the same value, the C API's name) names the run in logs and profiles.
    ``only_execute_path_to_fetches`` is accepted: epctx's plan is built for every output, so it does
    not change results."""

    __slots__ = (
        "_config",
        "_log_severity_level",
        "_log_verbosity_level",
        "_logid",
        "_only_execute_path_to_fetches",
        "_terminate",
    )

    log_severity_level = _Typed(int)
    log_verbosity_level = _Typed(int)
    logid = _Typed(str)
    terminate = _Typed(bool)
    only_execute_path_to_fetches = _Typed(bool)

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    @property
    def run_tag(self) -> str:
        return self.logid

    @run_tag.setter
    def run_tag(self, value: str) -> None:
        self.logid = value

    def add_run_config_entry(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise InvalidArgument(f"run config entries are (str, str), got ({key!r}, {value!r})")
        self._config[key] = value

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"run config entry {key!r} is not set")
        return self._config[key]


def _dim_key(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} must be a non-empty string, got {name!r}")
    return name


def _dim_value(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"the override of dimension {name!r} must be an int >= 0, got {value!r}")
    return int(value)

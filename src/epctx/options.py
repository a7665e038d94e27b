"""SessionOptions / RunOptions (onnxruntime's), with the session config's keys and parsed value from
``epctx.config`` offered here too."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from epctx import errors

# The session config (its keys, their parsers, the parsed SessionConfig) lives in epctx.config; every name of it is
# offered here as well, where users and the stages have always found it.
from epctx.config import *  # noqa: F403
from epctx.config import SessionConfig, check_config_entry
from epctx.errors import InvalidArgument

__all__ = [
    "ExecutionMode",
    "GraphOptimizationLevel",
    "RunOptions",
    "SessionConfig",
    "SessionOptions",
    "config_flag",
]


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

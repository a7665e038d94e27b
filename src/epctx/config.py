"""The session config: every key epctx reads as a named constant, and ``SessionConfig``, the entries parsed once
into a frozen typed value (an unknown ``epctx.`` key or a bad value is InvalidArgument). ``epctx.options`` offers
all of it beside SessionOptions."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from epctx.errors import InvalidArgument


class _HasConfig(Protocol):
    """What SessionConfig.of reads (SessionOptions; epctx.options imports this module, not the other way)."""

    @property
    def config(self) -> Mapping[str, str]: ...


__all__ = [
    "CONTEXT_BINARY_COPY",
    "CONTEXT_CACHE",
    "CONTEXT_CACHE_MAX_MB",
    "CONTEXT_REUSE",
    "DISABLE_CPU_EP_FALLBACK",
    "DISABLE_MODEL_COMPILE",
    "EPCTX_PREFIX",
    "EP_CONTEXT_EMBED_MODE",
    "EP_CONTEXT_ENABLE",
    "EP_CONTEXT_EXTERNAL_INITIALIZERS_FILE",
    "EP_CONTEXT_FILE_PATH",
    "EP_CONTEXT_NODE_NAME_PREFIX",
    "EP_CONTEXT_SOURCE_MODEL_PATH",
    "EP_ENABLE_WEIGHTLESS_MODE",
    "EXTERNAL_INITIALIZERS_FOLDER",
    "FAIL_ON_SUBOPTIMAL_COMPILED_MODEL",
    "INPUT_SHAPES",
    "INPUT_VALUES",
    "PARTITION_CONTROL_FLOW_BODIES",
    "PARTITION_COST_RULE",
    "PARTITION_MEASURED_RULE",
    "REFIT_CONTEXT",
    "SELF_HEAL",
    "SELF_HEAL_POLICIES",
    "SHARE_EP_CONTEXTS",
    "SPECIALIZE_SHAPES",
    "SPECIALIZE_SHAPES_MAX",
    "SPECIALIZE_SHAPES_MAX_MB",
    "SPECIALIZE_SHAPES_MODES",
    "STOP_SHARE_EP_CONTEXTS",
    "SessionConfig",
    "TRUST_KEYS",
    "TRUST_POLICIES",
    "TRUST_POLICY",
    "TRUST_ROOT",
    "TRUST_SIGNATURE",
    "TRUST_SIGN_KEY",
    "TRUST_SIGSTORE_IDENTITY",
    "TRUST_SIGSTORE_ISSUER",
    "TRUST_SIGSTORE_ROOT",
    "UNAVAILABLE_EP_IS_ERROR",
    "check_config_entry",
    "input_shapes",
    "input_values",
    "parse_shapes",
    "weightless_mode",
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
# The measured rule (epctx.partition.measured), on by default: after a compiling EP compiles a partition, it is
# timed against the kernel EP (the CPU EP) on the same nodes with synthetic inputs (dynamic dimensions sized 1 for
# a batch, 128 otherwise, unless free-dimension overrides state them), and handed back when slower by more than
# the margin in both its median and its best run: adding an EP never makes a model slower (measured over the
# corpus, benchmarks/results/never_slower_threads1.txt). "0" turns it off (the EP keeps what it compiled).
PARTITION_MEASURED_RULE = "epctx.partition.measured_rule"
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
# epctx's own: sigstore keyless signatures, verified offline: the trusted root (a sigstore ``trusted_root.json``,
# or a client trust config holding one), the identity the signing certificate must name (its SAN: an email or
# a URI) and the OpenID Connect issuer that must have vouched for it. All three, or none.
TRUST_SIGSTORE_ROOT = "epctx.trust.sigstore_root"
TRUST_SIGSTORE_IDENTITY = "epctx.trust.sigstore_identity"
TRUST_SIGSTORE_ISSUER = "epctx.trust.sigstore_issuer"
# epctx's own: "1" offers the nodes inside control-flow bodies (If / Loop / Scan) to the EPs as well, as the main
# graph's; off by default (measured, one thread: silero-vad with OpenVINO 0.184 ms a chunk, with its If bodies'
# partitions on OpenVINO 0.373 ms: each call re-slices constant LSTM weights and pays a call), never in a context model (its bodies were not compiled when it was made).
PARTITION_CONTROL_FLOW_BODIES = "session.partition_control_flow_bodies"
# epctx's own: whole input shapes to compile and run for, as onnxruntime's OpenVINO EP's ``reshape_input``
# ("x[1,3,48,192],mask[1,128]", static sizes only), for every EP: set at load before type inference
# (epctx.model.dims), so every value has static sizes, anonymous dimensions ('?', -1) included; a feed of
# another shape is then refused as for any static input. Free dimension overrides can state only named ones.
INPUT_SHAPES = "epctx.input_shapes"
# epctx's own: values of scalar inputs to compile and run for ("sr=16000"): set at load as constants, with the
# control flow they decide (and the static shapes decide) folded (epctx.model.fold_static); a feed must give the
# input with that value. epctx.specialize_shapes states them per run for scalars an If condition depends on.
INPUT_VALUES = "epctx.input_values"
# epctx's own: per-shape specialization (epctx.session.specialize). A session over a model with dynamic input
# dimensions whose providers hold a compiling EP with ``static_shapes_help`` makes, for an input-shape signature
# seen twice, a session of its own with those shapes stated (INPUT_SHAPES) and routes runs of that signature to
# it: "auto" (default) in a background thread, "sync" in the run that sees it the second time, "off" never; at
# most SPECIALIZE_SHAPES_MAX signatures per session (default 8), and at most as many as fit in
# SPECIALIZE_SHAPES_MAX_MB (default 1024) at the source model's size each (its file and its external data): each
# specialization compiles its own copy of the weights (in memory and in the cache), so a model of 300 MB gets 3,
# one over 1 GB none.
SPECIALIZE_SHAPES = "epctx.specialize_shapes"
SPECIALIZE_SHAPES_MODES = ("auto", "sync", "off")
SPECIALIZE_SHAPES_MAX = "epctx.specialize_shapes_max"
SPECIALIZE_SHAPES_MAX_MB = "epctx.specialize_shapes_max_mb"


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
    - ``partition_measured_rule`` (epctx.partition.measured_rule, bool, True): time each compiled partition
      against the kernel EP and hand it back when slower (``epctx.partition.measured``); "0" turns it off
      (``ModelCompiler`` sets "0" unless the key is given: a compiled model is the same wherever it is compiled);
    - ``input_shapes`` (epctx.input_shapes, tuple of (input name, tuple of sizes), ()): whole input shapes
      set at load (``input_shapes``);
    - ``input_values`` (epctx.input_values, tuple of (input name, number), ()): scalar input values set at
      load, the control flow they decide folded (``epctx.model.fold_static``);
    - ``specialize_shapes`` (epctx.specialize_shapes, one of SPECIALIZE_SHAPES_MODES, "auto") and
      ``specialize_shapes_max`` (epctx.specialize_shapes_max, int >= 1, 8) and ``specialize_shapes_max_mb``
      (epctx.specialize_shapes_max_mb, float >= 0, 1024.0): per-shape specialization (``epctx.session.specialize``);
    - ``context_cache`` (epctx.context_cache, str, ""): the transparent cache's folder;
    - ``context_cache_max_mb`` (epctx.context_cache_max_mb, float or None): its size bound in MB;
    - ``context_reuse`` (epctx.context_reuse, bool): reuse (or compile again) the context at the context path;
    - ``context_binary_copy`` (epctx.context_binary_copy, bool): read binaries instead of mapping them;
    - ``trust_keys`` (epctx.trust.keys, tuple of str, os.pathsep-separated), ``trust_policy``
      (epctx.trust.policy, one of TRUST_POLICIES, "off"), ``trust_signature`` (epctx.trust.signature, str, ""),
      ``trust_sign_key`` (epctx.trust.sign_key, str, ""), ``trust_root`` (epctx.trust.root, str, "");
    - ``trust_sigstore_root`` / ``trust_sigstore_identity`` / ``trust_sigstore_issuer`` (epctx.trust.sigstore_*,
      str, ""): sigstore keyless verification, offline (all three or none);
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
        "input_shapes",
        "input_values",
        "partition_control_flow_bodies",
        "partition_cost_rule",
        "partition_measured_rule",
        "refit_context",
        "self_heal",
        "share_ep_contexts",
        "specialize_shapes",
        "specialize_shapes_max",
        "specialize_shapes_max_mb",
        "stop_share_ep_contexts",
        "trust_keys",
        "trust_policy",
        "trust_root",
        "trust_sign_key",
        "trust_signature",
        "trust_sigstore_identity",
        "trust_sigstore_issuer",
        "trust_sigstore_root",
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
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    input_values: tuple[tuple[str, float], ...]
    specialize_shapes: str
    specialize_shapes_max: int
    specialize_shapes_max_mb: float
    partition_cost_rule: bool
    partition_measured_rule: bool
    context_cache: str
    context_cache_max_mb: float | None
    context_reuse: bool
    context_binary_copy: bool
    trust_keys: tuple[str, ...]
    trust_policy: str
    trust_signature: str
    trust_sign_key: str
    trust_root: str
    trust_sigstore_root: str
    trust_sigstore_identity: str
    trust_sigstore_issuer: str
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
    def of(cls, options: _HasConfig | None) -> SessionConfig:
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


def _count(key: str, value: str) -> int:
    """An integer >= 1."""
    if not value.strip().isdigit() or int(value) < 1:
        raise InvalidArgument(f"session config {key!r} must be an integer >= 1, got {value!r}")
    return int(value)


def _one_of(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    """A parser for a key whose value is one of ``allowed`` ("" is the first, the default)."""

    def parse(key: str, value: str) -> str:
        value = value or allowed[0]
        if value not in allowed:
            raise InvalidArgument(
                f"session config {key!r} must be one of {', '.join(allowed)}, got {value!r}"
            )
        return value

    return parse


def weightless_mode(key: str, value: str) -> int:
    """``ep.enable_weightless_mode``: "0" / "1" / "2"; anything else (``3``, "") InvalidArgument."""
    if value not in ("0", "1", "2"):
        raise InvalidArgument(
            f"session config {key!r} must be '0' (NONE), '1' (EXTERNAL_ONLY) or '2' (ALL), got {value!r}"
        )
    return int(value)


# One ``NAME[d0,d1,...]`` item of epctx.input_shapes, and the comma after it (or the end).
_SHAPE_ITEM = re.compile(r"\s*([^\[\],]+?)\s*\[([^\]\[]*)\]\s*(?:,|$)")


def input_shapes(key: str, value: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``epctx.input_shapes``: ``NAME[d0,d1,...]`` items separated by commas ("" none, ``NAME[]`` a scalar),
    each size an integer >= 0 (``parse_shapes``). Whether the names and ranks fit the model is checked at load
    (``epctx.model.dims``)."""
    return parse_shapes(value, f"session config {key!r}")


def input_values(key: str, value: str) -> tuple[tuple[str, float], ...]:
    """``epctx.input_values``: ``NAME=NUMBER`` items separated by commas ("" none); malformed text or a name given
    twice is InvalidArgument. Whether each names a scalar input of the model is checked at load."""
    found: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, text = item.partition("=")
        name = name.strip()
        try:
            number = float(text) if sep and name else None
        except ValueError:
            number = None
        if number is None:
            raise InvalidArgument(
                f"session config {key!r}: expected NAME=NUMBER items, got {item!r} (in {value!r})"
            )
        if name in found:
            raise InvalidArgument(f"session config {key!r} gives the value of {name!r} twice")
        found[name] = (
            int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
        )
    return tuple(found.items())


def parse_shapes(value: str, what: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``NAME[d0,d1,...]`` items separated by commas as (name, sizes) pairs; malformed text, a negative size, a
    range (OpenVINO's ``1..10``: epctx compiles for static sizes) or a name given twice is InvalidArgument,
    its message starting with ``what`` (the key, or the CLI's ``--shape``)."""
    shapes: dict[str, tuple[int, ...]] = {}
    rest = value.strip()
    while rest:
        match = _SHAPE_ITEM.match(rest)
        if match is None:
            raise InvalidArgument(
                f"{what}: expected NAME[d0,d1,...] items separated by commas, got {rest!r} (in {value!r})"
            )
        name, text = match.group(1), match.group(2).strip()
        if name in shapes:
            raise InvalidArgument(f"{what} gives the shape of {name!r} twice")
        shapes[name] = tuple(_size(what, name, d.strip()) for d in text.split(",")) if text else ()
        rest = rest[match.end() :].strip()
        if match.group(0).rstrip().endswith(",") and not rest:
            raise InvalidArgument(f"{what}: a comma ends {value!r}")
    return tuple(shapes.items())


def _size(what: str, name: str, text: str) -> int:
    """One size of a ``NAME[d0,d1,...]`` item."""
    if text.isdigit():
        return int(text)
    if ".." in text:
        why = "a range (epctx compiles for static sizes: state one)"
    elif text.startswith("-") and text[1:].isdigit():
        why = "a negative size"
    else:
        why = "not a size (an integer >= 0)"
    raise InvalidArgument(f"{what}: {name!r} has {text!r}, {why}")


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
    SELF_HEAL: ("self_heal", _one_of(SELF_HEAL_POLICIES), "off"),
    PARTITION_COST_RULE: ("partition_cost_rule", _flag, True),
    PARTITION_MEASURED_RULE: ("partition_measured_rule", _flag, True),
    INPUT_SHAPES: ("input_shapes", input_shapes, ()),
    INPUT_VALUES: ("input_values", input_values, ()),
    SPECIALIZE_SHAPES: ("specialize_shapes", _one_of(SPECIALIZE_SHAPES_MODES), "auto"),
    SPECIALIZE_SHAPES_MAX: ("specialize_shapes_max", _count, 8),
    SPECIALIZE_SHAPES_MAX_MB: ("specialize_shapes_max_mb", _megabytes, 1024.0),
    CONTEXT_CACHE: ("context_cache", _text, ""),
    CONTEXT_CACHE_MAX_MB: ("context_cache_max_mb", _megabytes, None),
    CONTEXT_REUSE: ("context_reuse", _flag, False),
    CONTEXT_BINARY_COPY: ("context_binary_copy", _flag, False),
    TRUST_KEYS: ("trust_keys", _paths, ()),
    TRUST_POLICY: ("trust_policy", _one_of(TRUST_POLICIES), "off"),
    TRUST_SIGNATURE: ("trust_signature", _text, ""),
    TRUST_SIGN_KEY: ("trust_sign_key", _text, ""),
    TRUST_ROOT: ("trust_root", _text, ""),
    TRUST_SIGSTORE_ROOT: ("trust_sigstore_root", _text, ""),
    TRUST_SIGSTORE_IDENTITY: ("trust_sigstore_identity", _text, ""),
    TRUST_SIGSTORE_ISSUER: ("trust_sigstore_issuer", _text, ""),
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

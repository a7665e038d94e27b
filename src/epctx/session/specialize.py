"""Per-shape specialization (``epctx.specialize_shapes``), as onnxruntime's OpenVINO EP compiles a static model per
new input shape (``disable_dynamic_shapes``) and its TensorRT EP builds an engine per shape profile, without
stalling ``run()`` by default.

A session over a model that keeps dynamic input dimensions (after free dimension overrides and
``epctx.input_shapes``), whose providers hold a compiling EP with ``static_shapes_help`` (IREE: its code for
dynamic dimensions runs 1.1-2.2x slower than for static ones; OpenVINO's 1.0-1.9x on the corpus), owns a
``ShapeSpecializer``. ``run()`` hands it the bound inputs: their shapes, as a tuple, are the run's *signature*
(~0.3 us; a dict lookup routes it). A signature
seen a second time (a one-off shape compiles nothing) gets a *specialized session*: an ordinary
``InferenceSession`` over the same source model, providers, provider options and session options, with
``epctx.input_shapes`` stating the signature, through the transparent cache (``specialize_source.py``), so that
partitioning, compile, the measured rule (now at the real shape, with its never-slower guarantee) and the cache
are the ordinary machinery, and the next process loads it. Until it is ready, and for other signatures, the
session's own plan runs.

- ``auto`` (default): made in a daemon thread (one per session at a time; at most one specialization compiles in
  the process at a time). The thread holds no reference to the owning session: a session dropped while its
  specialization compiles is freed then, and the thread drops what it made and ends.
- ``sync``: the run that sees the signature the second time makes it and runs on it (OpenVINO's
  ``disable_dynamic_shapes``); ``off``: nothing.
- At most ``epctx.specialize_shapes_max`` signatures per session (default 8), and at most as many as
  ``epctx.specialize_shapes_max_mb`` (default 1024) holds at the source model's size (its file and external data):
  each specialization compiles its own copy of the weights, so a 300 MB model gets 3, one over 1 GB none (the
  signature that finds no room reports why, and nothing more is taken). A specialization that fails is
  logged once (WARNING under ``epctx``), and that signature of that model and providers is not tried again in
  the process; the session's own plan serves it.
- Each specialization is logged at INFO (signature, seconds, nodes per EP) and reported by
  ``InferenceSession.get_shape_specializations()``.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import os
import threading
import time
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from epctx import options as opt
from epctx.errors import Fail
from epctx.session.specialize_source import (
    Source,
    shapes_text,
    source_megabytes,
    specialization_source,
    specialized_options,
)

__all__ = ["ShapeSpecialization", "ShapeSpecializer", "specializer_for"]

logger = logging.getLogger("epctx")

Signature = tuple[tuple[int, ...], ...]
# Makes the specialized session for a signature text (epctx.input_shapes' value); raises when it cannot.
Make = Callable[[str, str], Any]  # (epctx.input_shapes text, epctx.input_values text)

PENDING, READY, FAILED = "pending", "ready", "failed"
_SEEN_MAX = 4096  # distinct signatures counted before the counts start again (variable-width OCR feeds)
_COMPILING = threading.Lock()  # at most one specialization compiles at a time in the process
_FAILED: dict[
    tuple[Any, ...], str
] = {}  # (model, providers, signature) -> why: not tried again in the process
_FAILED_LOCK = threading.Lock()
# The worker threads making specializations; at interpreter exit, none starts another and each in-flight compile
# is waited for (``_drain_at_exit``): a daemon thread frozen inside a backend's C++ compile while the process
# tears down its statics aborts it ("terminate called without an active exception": OpenVINO, seen in
# ``epctx demo``, exit status 134).
_WORKERS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_EXITING = threading.Event()
_EXIT_WAIT_S = 120.0  # at most this long in all for compiles in flight at exit


def _drain_at_exit() -> None:
    _EXITING.set()
    deadline = time.monotonic() + _EXIT_WAIT_S
    for worker in list(_WORKERS):
        worker.join(max(0.0, deadline - time.monotonic()))


atexit.register(_drain_at_exit)


@dataclasses.dataclass(frozen=True, slots=True)
class ShapeSpecialization:
    """One signature's specialization (``InferenceSession.get_shape_specializations``): its input shapes, its
    state (``pending``, ``ready``, ``failed``), why it failed, the seconds it took (None while pending) and the
    nodes per EP of the specialized session, as its ``get_partitions()`` counts them (one loaded from the cache
    in a later process lists its EPContext nodes)."""

    shapes: Mapping[str, tuple[int, ...]]
    state: str
    reason: str = ""
    seconds: float | None = None
    nodes: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shapes": {name: list(shape) for name, shape in self.shapes.items()},
            "state": self.state,
            "reason": self.reason,
            "seconds": self.seconds,
            "nodes": dict(self.nodes),
        }


class ShapeSpecializer:
    """Counts the signatures of a session's runs and routes each to its specialized session once made (see the
    module docstring). ``route(inputs)`` is the hot path: the specialized session for the inputs' signature, or
    None (the owner runs its own plan)."""

    def __init__(
        self,
        owner: object,
        names: Sequence[str],
        stated: Sequence[int],
        outputs: Sequence[str],
        make: Make,
        *,
        mode: str,
        limit: int,
        identity: Callable[[], tuple[Any, ...]],
        deciding: Sequence[int] = (),
    ) -> None:
        self._owner = weakref.ref(owner)
        # scalar inputs an If condition depends on: their values join the signature (epctx.input_values)
        self._deciding = tuple(deciding)
        self._names = tuple(names)  # every graph input the binder binds, in order: the signature's
        self._stated = tuple(
            stated
        )  # the indices of those stated to the specialized session (not initializers)
        self._outputs = tuple(outputs)
        self._make = make
        self._sync = mode == "sync"
        self._limit = limit
        self._identity = functools.cache(identity)  # the model and providers: the process's failure record
        self._ready: dict[Signature, Any] = {}
        self._states: dict[Signature, ShapeSpecialization] = {}
        self._seen: dict[Signature, int] = {}
        self._open = (
            True  # signatures are still counted (fewer than ``limit`` taken, a source to compile from)
        )
        self._queue: list[Signature] = []
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False  # the owner was created again (set_providers): nothing more is made or routed

    # -- the hot path -----------------------------------------------------------------------------------
    def route(self, inputs: Sequence[Any]) -> Any:
        signature = tuple([value.shape for value in inputs])
        if self._deciding:
            signature += tuple([(inputs[i].item(),) for i in self._deciding])
        found = self._ready.get(signature)
        if found is None and self._open and signature not in self._states:
            return self._seen_again(signature)
        return found

    def _seen_again(self, signature: Signature) -> Any:
        count = self._seen.get(signature, 0) + 1
        if count < 2:
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            self._seen[signature] = count
            return None
        with self._lock:
            if signature in self._states or not self._open:
                return None
            self._states[signature] = ShapeSpecialization(self._shapes(signature), PENDING)
            self._open = len(self._states) < self._limit
            self._seen.pop(signature, None)
            if not self._sync:
                self._queue.append(signature)
                if self._worker is None and not _EXITING.is_set():
                    self._worker = threading.Thread(target=self._work, name="epctx-specialize", daemon=True)
                    _WORKERS.add(self._worker)
                    self._worker.start()
                return None
        self._build(signature)
        return self._ready.get(signature)

    # -- making one -------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue or not self._alive() or _EXITING.is_set():
                    self._queue.clear()
                    self._worker = None
                    return
                signature = self._queue.pop(0)
            self._build(signature)

    def _build(self, signature: Signature) -> None:
        text = shapes_text([self._names[i] for i in self._stated], [signature[i] for i in self._stated])
        values = self._values(signature)
        key = (*self._identity(), text, values)
        with _FAILED_LOCK:
            failed = _FAILED.get(key)
        if failed is not None:
            self._settle(signature, None, f"failed before in this process: {failed}", None)
            return
        started = time.perf_counter()
        try:
            with _COMPILING:
                if not self._alive():  # dropped while it waited: nothing to make
                    return
                session = self._make(text, values)
            _check_interface(session, self._names, self._outputs)
        except _Closed as exc:  # no source model, or no room for another copy of its weights
            self.close(str(exc))
            self._settle(signature, None, exc.reason, None)
            return
        except Exception as exc:  # a background thread has no caller to raise to; the owner serves the shape
            why = f"{type(exc).__name__}: {exc}"
            with _FAILED_LOCK:
                _FAILED[key] = why
            logger.warning(
                "epctx.specialize_shapes: the specialization for %s failed (%s); the session's own plan "
                "serves it, and it is not tried again in this process", text, why,
            )  # fmt: skip
            self._settle(signature, None, why, time.perf_counter() - started)
            return
        seconds = time.perf_counter() - started
        if not self._alive():  # the owner was dropped while this compiled: drop what was made
            return
        self._settle(signature, session, "", seconds)
        nodes = self._states[signature].nodes
        where = ", ".join(f"{ep}: {count}" for ep, count in nodes.items()) or "none"
        logger.info("epctx.specialize_shapes: %s ready in %.2f s; its nodes on %s", text, seconds, where)

    def _settle(self, signature: Signature, session: Any, reason: str, seconds: float | None) -> None:
        nodes = _nodes_per_ep(session) if session is not None else {}
        state = READY if session is not None else FAILED
        with self._lock:
            self._states[signature] = ShapeSpecialization(
                self._shapes(signature), state, reason, seconds, types.MappingProxyType(nodes)
            )
            if session is not None:
                self._ready[signature] = session

    def _alive(self) -> bool:
        return not self._stopped and self._owner() is not None

    def stop(self) -> None:
        """The owner is created again (``set_providers``): what is queued is dropped, nothing more is made."""
        with self._lock:
            self._stopped, self._open = True, False
            self._queue.clear()
            self._ready = {}

    def close(self, why: str) -> None:
        """No more signatures (e.g. no source model to compile from): said once, at INFO."""
        with self._lock:
            if not self._open:
                return
            self._open = False
        logger.info("epctx.specialize_shapes: no specialization for this session: %s", why)

    # -- what it did ------------------------------------------------------------------------------------
    def report(self) -> dict[str, ShapeSpecialization]:
        """Signature text (``epctx.input_shapes``' form) -> its specialization, in the order they were taken."""
        with self._lock:
            states = list(self._states.items())
        return {self._text(signature): state for signature, state in states}

    def _text(self, signature: Signature) -> str:
        values = self._values(signature)
        shapes = shapes_text(self._names, signature[: len(self._names)])
        return f"{shapes} with {values}" if values else shapes

    def pending(self, signature: Signature | None = None) -> bool:
        """Whether a specialization (of ``signature``, or any) is still being made."""
        with self._lock:
            if signature is not None:
                state = self._states.get(signature)
                return state is not None and state.state == PENDING
            return any(state.state == PENDING for state in self._states.values())

    def _shapes(self, signature: Signature) -> Mapping[str, tuple[int, ...]]:
        return types.MappingProxyType(dict(zip(self._names, signature)))

    def _values(self, signature: Signature) -> str:
        """The ``epctx.input_values`` text of ``signature``'s deciding scalars ("" when there are none)."""
        tail = signature[len(self._names) :]
        return ",".join(f"{self._names[i]}={_number(value[0])}" for i, value in zip(self._deciding, tail))


def _number(value: Any) -> int | float:
    """A scalar input's value as ``epctx.input_values`` writes it (a bool as 0 or 1)."""
    return int(value) if isinstance(value, (bool, int)) else float(value)


def _nodes_per_ep(session: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ep, nodes in session.get_partitions():
        counts[ep] = counts.get(ep, 0) + len(nodes)
    return counts


def _check_interface(session: Any, names: Sequence[str], outputs: Sequence[str]) -> None:
    """A specialized session runs on the owner's bound inputs and gives its outputs: both must be the same, in
    the same order."""
    inputs = [spec.name for spec in session._prepared.specs]
    if inputs != list(names):
        raise Fail(f"the specialized session's inputs {inputs} are not the session's {list(names)}")
    given = [arg.name for arg in session.get_outputs()]
    if given != list(outputs):
        raise Fail(f"the specialized session's outputs {given} are not the session's {list(outputs)}")


class _Closed(Exception):
    """No more specializations for this session: ``reason`` says why (the signature's report)."""

    @property
    def reason(self) -> str:
        return str(self)


class _NoSource(_Closed):
    """The session's context model names no source model to compile a specialization from."""

    @property
    def reason(self) -> str:
        return f"no source model: {self}"


class _OverBudget(_Closed):
    """Another specialization would pass ``epctx.specialize_shapes_max_mb`` (each holds a copy of the weights)."""


def specializer_for(
    owner: Any,
    factory: Callable[..., Any],
    spec: tuple[Any, Any],
    source: Source,
    options: opt.SessionOptions,
    config: opt.SessionConfig,
    deciding_names: Sequence[str] = (),
) -> ShapeSpecializer | None:
    """The specializer of a session just made (``owner``, made by ``factory(source, options, providers=...,
    provider_options=...)``, the InferenceSession class, with ``spec`` = (providers, provider_options) as given),
    or None when its inputs are all static (and ``deciding_names``, scalar inputs an If condition depends on,
    ``epctx.model.fold_static.deciding_scalars``, is empty) or not all tensors."""
    prepared = owner._prepared
    specs = prepared.specs
    names = [s.name for s in specs]
    deciding = [names.index(name) for name in deciding_names if name in names]
    if any(s.dtype is None for s in specs) or (
        not deciding and all(s.rank is not None and len(s.dims) == s.rank for s in specs)
    ):
        return None
    derived = specialized_options(options, config)
    found: list[tuple[Source | None, str]] = []  # the source, looked for on first use (it hashes the files)
    room = _Room(config.specialize_shapes_max_mb)

    def make(text: str, values: str) -> Any:
        if not found:
            found.append(specialization_source(source, config))
        model, why = found[0]
        if model is None:
            raise _NoSource(why)
        room.take(model, config)  # (one make at a time: under the process's compile lock)
        shaped = opt.with_config(derived, {opt.INPUT_SHAPES: text, opt.INPUT_VALUES: values or None})
        try:
            return factory(model, shaped, providers=spec[0], provider_options=spec[1])
        except BaseException:
            room.taken -= 1  # a specialization that failed holds no copy
            raise

    eps = tuple((ep.name, tuple(sorted(ep.provider_options().items()))) for ep in owner._providers)
    return ShapeSpecializer(
        owner,
        [s.name for s in specs],
        [i for i, s in enumerate(specs) if s.default is None],
        [o.name for o in prepared.outputs],
        make,
        mode=config.specialize_shapes,
        limit=config.specialize_shapes_max,
        identity=lambda: (_model_identity(source), eps),
        deciding=deciding,
    )


class _Room:
    """How many specializations ``epctx.specialize_shapes_max_mb`` leaves room for: each compiles its own copy of
    the source model's weights (in memory, and in the cache), so at most ``max_mb`` // the model's MB of them
    (its size measured at the first, in the thread that makes it)."""

    __slots__ = ("fits", "max_mb", "megabytes", "taken")

    def __init__(self, max_mb: float) -> None:
        self.max_mb = max_mb
        self.megabytes: float | None = None
        self.fits = 0
        self.taken = 0

    def take(self, model: Source, config: opt.SessionConfig) -> None:
        """Counts one more specialization; _OverBudget when there is no room for it."""
        if self.megabytes is None:
            self.megabytes = source_megabytes(model, config)
            self.fits = int(self.max_mb // self.megabytes) if self.megabytes > 0 else 1 << 30
        if self.taken >= self.fits:
            raise _OverBudget(
                f"the source model is {self.megabytes:.1f} MB and each specialization compiles its own copy of "
                f"it: {self.fits} fit in {opt.SPECIALIZE_SHAPES_MAX_MB}={self.max_mb:g}"
            )
        self.taken += 1


def _model_identity(source: Source) -> Any:
    if isinstance(source, (bytes, bytearray, memoryview)):
        import hashlib

        return ("bytes", hashlib.blake2b(bytes(source), digest_size=16).hexdigest())
    return os.fspath(source)

"""Session profiles: a Chrome-trace JSON in onnxruntime's event schema (``enable_profiling`` / ``end_profiling``).

Every event is ``{"cat", "pid", "tid", "dur", "ts", "ph": "X", "name", "args"}`` with microseconds since the
profile started, as onnxruntime writes them, so the file opens in the viewer used for onnxruntime's
(chrome://tracing, Perfetto). Events:

- ``cat: "Session"``: ``model_loading_uri`` / ``model_loading_array`` (load and partition),
  ``session_initialization`` (the whole creation), one ``<partition>_compile`` or ``<node>_context_load`` per
  compiled or loaded partition (``args.provider``), ``model_run`` per run (``args.run_tag``), one
  ``node_placement`` (``args.nodes``: every node's EP, partition and the reasons EPs ahead declined it);
- ``cat: "Node"``: one ``<name>_kernel_time`` per plan step per run, ``args.op_name`` (the node's op type;
  ``EPContext`` or the partition name for a compiled partition), ``args.provider``, ``args.node_index``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epctx.partition.placement import NodePlacement

__all__ = ["Phase", "Profiler", "no_phase"]

# phase(kind, name, EP name) -> a context around one partition's compile or context load (profiles).
Phase = Callable[[str, str, str], contextlib.AbstractContextManager[Any]]


def no_phase(kind: str, name: str, ep: str) -> contextlib.AbstractContextManager[Any]:
    """The phase when nothing is recorded."""
    return contextlib.nullcontext()


class Profiler:
    """Collects events from session creation until ``end()`` writes them (thread-safe appends)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.start_ns = time.time_ns()
        self._t0 = time.perf_counter_ns()
        self._events: list[dict[str, Any]] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.active = True

    def _now_us(self) -> int:
        return (time.perf_counter_ns() - self._t0) // 1000

    def add(
        self, cat: str, name: str, start_us: int, dur_us: int, args: dict[str, Any] | None = None
    ) -> None:
        event = {
            "cat": cat,
            "pid": self._pid,
            "tid": threading.get_native_id(),
            "dur": dur_us,
            "ts": start_us,
            "ph": "X",
            "name": name,
            "args": args or {},
        }
        with self._lock:
            self._events.append(event)

    @contextlib.contextmanager
    def span(self, cat: str, name: str, args: dict[str, Any] | None = None) -> Iterator[None]:
        start = self._now_us()
        try:
            yield
        finally:
            self.add(cat, name, start, self._now_us() - start, args)

    def phase(self, kind: str, name: str, ep: str) -> contextlib.AbstractContextManager[None]:
        """``StepBuilder.phase``: one event per partition loaded from a context model."""
        return self.span("Session", f"{name}_{kind}", {"provider": ep, "partition": name})

    def placement(self, placement: Sequence[NodePlacement]) -> None:
        """One ``node_placement`` event (at the end of partitioning): ``args.nodes`` lists every node with its
        op type, the EP that runs it, its partition and why each EP ahead of it declined it."""
        nodes = [p.to_dict() for p in placement]
        self.add("Session", "node_placement", self._now_us(), 0, {"nodes": nodes})

    def ended(self, kind: str, name: str, ep: str, seconds: float) -> None:
        """``StepBuilder.ended``: one event per partition compiled, from its EP's compile call to its end (an EP
        compiles all its partitions in one call, in parallel where it can)."""
        dur = int(seconds * 1e6)
        self.add("Session", f"{name}_{kind}", self._now_us() - dur, dur, {"provider": ep, "partition": name})

    def step_hooks(self, info: tuple[tuple[str, str, str], ...]) -> tuple[Callable[[int], None], ...]:
        """(before, after) for ``ExecutionPlan.run_observed``: one ``Node`` event per step."""
        started = [0]

        def before(k: int) -> None:
            started[0] = self._now_us()

        def after(k: int) -> None:
            name, op_type, provider = info[k] if k < len(info) else (f"step{k}", "", "")
            args = {"op_name": op_type, "provider": provider, "node_index": str(k)}
            start = started[0]
            self.add("Node", f"{name}_kernel_time", start, self._now_us() - start, args)

        return before, after

    def end(self) -> str:
        """Write the profile (``<prefix>_<date>_<time>.json`` in the working directory); returns its path.
        Profiling stops: later runs are not recorded."""
        self.active = False
        stamp = datetime.datetime.now()
        path = f"{self.prefix}_{stamp:%Y-%m-%d_%H-%M-%S}_{stamp.microsecond // 1000:03d}.json"
        with self._lock:
            events = list(self._events)
        with open(path, "w", encoding="utf-8") as f:
            f.write("[\n")
            f.write(",\n".join(json.dumps(e) for e in events))
            f.write("\n]\n")
        return path

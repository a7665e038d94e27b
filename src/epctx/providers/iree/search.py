"""The compiles of one IREE capability check (``probing``): each node set compiled at most once per flags in a
check, the outcomes the probe records know (``probe_cache``) read instead of compiled, every new one recorded,
and the time budget: ``Search.affords`` says whether a step is expected to end within it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from epctx.ep import CompileGuard, Partition, make_partition
from epctx.providers.iree.capability import unfit_boundary
from epctx.providers.iree.compile import BUDGET_STAGE, CompileResult, compile_partitions
from epctx.providers.iree.probe_cache import PROBE_FLAG, RECORDED, ProbeCache, probe_key

__all__ = ["Group", "Search", "batch_nodes"]

Group = list[ir.Node]
_clock = time.perf_counter  # the budget's clock
_Key = tuple[frozenset[ir.Node], tuple[str, ...]]


@dataclasses.dataclass
class Search:
    """One capability check's compiles: each node set compiled once per flags, what the probe records know read
    instead, and the budget (``affords``)."""

    ep_name: str
    graph: ir.Graph
    opsets: Mapping[str, int]
    guard: CompileGuard
    budget_s: float
    partitions: Sequence[Sequence[ir.Node]] = ()  # of the EPs ahead: one unit each when grouping
    memory_mib: int = 0  # each iree-compile's cap (provider option compile_memory_mb; 0: compile.memory_cap)
    cache: ProbeCache = dataclasses.field(default_factory=ProbeCache)
    started: float = dataclasses.field(default_factory=lambda: _clock())
    seen: dict[_Key, tuple[Partition, CompileResult]] = dataclasses.field(default_factory=dict)
    _parts: dict[_Key, tuple[Partition, str]] = dataclasses.field(default_factory=dict)  # and record keys
    rates: dict[bool, float] = dataclasses.field(
        default_factory=dict
    )  # seconds per node: probe / full compile
    fresh: int = 0  # compiles run (not read from the probe records)
    ran_out: bool = False
    refused_s: float = 0.0  # the expected seconds of the first step refused (0: none)

    @property
    def spent(self) -> float:
        return _clock() - self.started

    def affords(self, groups: Sequence[Group], flags: Sequence[str]) -> bool:
        """Whether compiling ``groups`` with ``flags`` (in one parallel call) is expected to end within the
        budget: the node sets not known (``lookup``) at the slowest rate (seconds per node) seen in this check
        for that kind of compile (a probe, or a full compile; a probe's rate, none seen yet, is taken to be a full
        compile's), none seen: while any budget is left. The first compile a check runs is afforded whatever
        its expected time (the first compile of the candidates, or the step a later check goes on with: each
        check moves on). Sets ``ran_out`` when not."""
        unknown = [g for g in groups if self.lookup(g, flags) is None]
        if not unknown:
            return True
        probe = PROBE_FLAG in flags
        rate = self.rates.get(probe, self.rates.get(False, 0.0) if probe else 0.0)
        expected = rate * batch_nodes(unknown)
        fits = not self.fresh or self.spent + expected <= self.budget_s
        if not fits and not self.ran_out:
            self.ran_out, self.refused_s = True, expected
        return fits

    def lookup(self, group: Group, flags: Sequence[str]) -> tuple[Partition, CompileResult] | None:
        """The outcome of compiling ``group`` with ``flags`` when known without a compile: compiled before in
        this check, kept in the probe records (``probe_cache``), or a boundary IREE would misread."""
        key = (frozenset(group), tuple(flags))
        if key in self.seen:
            return self.seen[key]
        if key not in self._parts:
            part = make_partition(f"{self.ep_name}_check{len(self._parts)}", self.ep_name, self.graph, group,
                                  self.opsets)  # fmt: skip
            why = unfit_boundary(part)
            if why is not None:
                self.seen[key] = (part, CompileResult(False, stage="import", error=why))
                return self.seen[key]
            self._parts[key] = (part, probe_key(part, flags))
        part, record = self._parts[key]
        known = self.cache.get(record)
        if known is None:
            return None
        self.seen[key] = (part, known)
        self._observe(len(group), flags, known)
        return self.seen[key]

    def known_failure(
        self, group: Group, flags: Sequence[str], stage: str, error: str
    ) -> tuple[Partition, CompileResult]:
        """The outcome of compiling ``group`` with ``flags`` when it is known to fail without a compile (IREE's
        known failures, ``capability.channels_last_pool``): as if compiled and failed with ``error``, in this
        check only (not kept in the probe records); an outcome already known stands."""
        found = self.lookup(group, flags)
        if found is not None:
            return found
        key = (frozenset(group), tuple(flags))
        self.seen[key] = (self._parts[key][0], CompileResult(False, stage=stage, error=error))
        return self.seen[key]

    def compile(self, groups: Sequence[Group], flags: Sequence[str]) -> list[tuple[Partition, CompileResult]]:
        """Each group compiled with ``flags``, in parallel, unless its outcome is known (``lookup``); the
        outcomes of the compiles run are kept in the probe records. After the check's first compile, a compile
        still running when the budget ends is stopped (stage ``budget``; ``affords`` expects a step's time from
        the rates seen, and one piece can take far longer: silero-vad's LSTM decoder ran 26 s into a 30 s
        budget's last 4 s)."""
        fresh: dict[_Key, tuple[Partition, str]] = {}
        for group in groups:
            key = (frozenset(group), tuple(flags))
            if key not in fresh and self.lookup(group, flags) is None:
                fresh[key] = self._parts[key]
        parts = [part for part, _ in fresh.values()]
        deadline = self.started + self.budget_s if self.fresh else None
        results = compile_partitions(parts, flags, self.guard, ep_name=self.ep_name, what="capability check",
                                     memory_mib=self.memory_mib, deadline=deadline)  # fmt: skip
        self.fresh += len(parts)
        if any(result.stage == BUDGET_STAGE for result in results):
            self.ran_out = True
        for (key, (part, record)), result in zip(fresh.items(), results):
            self.cache.put(record, result, flags)
            self.seen[key] = (part, result)
            self._observe(len(key[0]), flags, result)
        return [self.seen[(frozenset(group), tuple(flags))] for group in groups]

    def compile_code(self, groups: Sequence[Group]) -> list[tuple[Group, Partition, CompileResult]]:
        """The code of ``groups``, whose passed compiles were read from the records: compiled now with the flags
        they passed with, in parallel, as the partitions looked up (of the same names: this process's compile
        cache serves a repeated session), outside the budget: it is the session's compile. A group with no
        such record is left out (the compile stage compiles what has no code)."""
        known = {
            key[0]: key
            for key, (_, result) in self.seen.items()
            if result.ok and result.stage == RECORDED and PROBE_FLAG not in key[1]
        }
        by_flags: dict[tuple[str, ...], list[_Key]] = {}
        for group in groups:
            if (key := known.get(frozenset(group))) is not None:
                by_flags.setdefault(key[1], []).append(key)
        for flags, keys in by_flags.items():
            parts = [self._parts[key][0] for key in keys]
            compiled = compile_partitions(
                parts, flags, self.guard, ep_name=self.ep_name, memory_mib=self.memory_mib
            )
            for key, result in zip(keys, compiled):
                self.seen[key] = (self.seen[key][0], result)
        return [(g, *self.seen[known[frozenset(g)]]) for g in groups if frozenset(g) in known]

    def _observe(self, nodes: int, flags: Sequence[str], result: CompileResult) -> None:
        if result.seconds > 0:
            kind = PROBE_FLAG in flags
            self.rates[kind] = max(self.rates.get(kind, 0.0), result.seconds / max(1, nodes))

    def budget_reason(self) -> str:
        return (
            f"not checked: IREE's capability budget of {self.budget_s:g} s was spent (provider option "
            "capability_budget_s; a later session goes on from the probes kept)"
        )


def batch_nodes(groups: Sequence[Group]) -> int:
    """The size, in nodes, that one call compiling ``groups`` costs like: all of them, though they compile in
    parallel (iree-compile runs threads of its own: on a few busy cores, compiles at once take about as long as
    one after the other; counting a parallel speed-up let PP-OCRv4 det's first session run 11 s past its budget)."""
    return sum(map(len, groups))

"""The session's side of the measured rule (``epctx.partition.measured``): the nodes of a compiled partition run
on the kernel EP, as a plan of their own, for the rule to time them against the compiled partition; and the
rule's verdicts kept between processes (``epctx.partition.verdicts``), keyed by this session's EPs, options and
loaded model."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import onnx_ir as ir

from epctx import options as opt
from epctx.ep._contract import ExecutionProvider, Partition
from epctx.ep._partition import ir_nodes
from epctx.partition.verdicts import VerdictCache, Verdicts, verdict_key
from epctx.session.builder import StepBuilder
from epctx.session.plan import build_plan

__all__ = ["CachedVerdicts", "cached_verdicts", "kernel_runner", "rule_settings"]

_log = logging.getLogger("epctx")

# Config entries that change no partition nor its speed: writing contexts, caches, trust, the rule's own switch.
_NOT_IN_KEY = frozenset({
    opt.CONTEXT_CACHE, opt.CONTEXT_CACHE_MAX_MB, opt.CONTEXT_REUSE, opt.CONTEXT_BINARY_COPY, opt.REFIT_CONTEXT,
    opt.DISABLE_MODEL_COMPILE, opt.FAIL_ON_SUBOPTIMAL_COMPILED_MODEL, opt.UNAVAILABLE_EP_IS_ERROR, opt.SELF_HEAL,
    opt.PARTITION_MEASURED_RULE, opt.SHARE_EP_CONTEXTS, opt.STOP_SHARE_EP_CONTEXTS, opt.EP_ENABLE_WEIGHTLESS_MODE,
    opt.EXTERNAL_INITIALIZERS_FOLDER,  # where the weights are read from: their bytes are in the graph's digest
})  # fmt: skip
_NOT_IN_KEY_PREFIXES = ("ep.context_", "epctx.trust.")


def kernel_runner(builder: StepBuilder) -> Callable[[Partition], Callable[..., Sequence[Any]]]:
    """partition -> a callable running its nodes on ``builder.kernel_ep`` (one array per partition input)."""

    def runner(partition: Partition) -> Callable[..., Sequence[Any]]:
        steps = [builder.node_step(builder.kernel_ep, node) for node in ir_nodes(partition.nodes)]
        plan = build_plan(partition.inputs, partition.outputs, steps, fold_constants=builder.fold)
        return lambda *inputs: plan.run(inputs)

    return runner


def rule_settings(config: Mapping[str, str]) -> dict[str, str]:
    """The session config entries a verdict depends on (every entry but those of ``_NOT_IN_KEY``)."""
    return {
        key: value
        for key, value in config.items()
        if key not in _NOT_IN_KEY and not key.startswith(_NOT_IN_KEY_PREFIXES)
    }


@dataclasses.dataclass(frozen=True, slots=True)
class CachedVerdicts:
    """The verdicts kept for this session's key (``found``: None on a miss), and where to keep new ones."""

    cache: VerdictCache
    key: str
    found: Verdicts | None

    def put(
        self,
        graph: ir.Graph,
        refused: Mapping[Any, tuple[str, str]],
        kept: Iterable[tuple[str, Sequence[Any]]],
    ) -> None:
        verdicts = Verdicts.of(graph, refused, kept)
        self.cache.put(self.key, verdicts)
        _log.info(
            "measured rule: verdicts kept in the measured cache (%d node(s) refused, %d partition(s) kept)",
            sum(len(nodes) for nodes in verdicts.refused.values()),
            sum(len(sets) for sets in verdicts.kept.values()),
        )


def cached_verdicts(
    model: ir.Model,
    providers: Sequence[ExecutionProvider],
    kernel_ep: ExecutionProvider,
    options: opt.SessionOptions,
    level: int,
    *,
    warn: bool = True,
) -> CachedVerdicts | None:
    """The verdicts kept for a session over ``model`` (loaded) with these EPs and options; None when the cache is
    off (``EPCTX_MEASURED_CACHE=0``) or no EP compiles; ``warn``: about a record that cannot be read (the
    session reads it twice: warned the first time)."""
    cache = VerdictCache()
    if not cache.enabled or not any(ep.compiles for ep in providers):
        return None
    threads = options.intra_op_num_threads
    settings = rule_settings(options.config)
    key = verdict_key(
        model, providers, kernel_ep=kernel_ep.name, threads=threads, level=level, settings=settings
    )
    return CachedVerdicts(cache, key, cache.get(key, warn=warn))

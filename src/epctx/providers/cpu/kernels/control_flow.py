"""If, Loop and Scan: their bodies are built once into sub-plans that read outer values by slot."""

from __future__ import annotations

from typing import Any

import numpy as np

from epctx.ep import Kernel, SubgraphRunner
from epctx.errors import Fail
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []


def _body(info: NodeInfo, attr: str) -> SubgraphRunner:
    build = info.ctx.build_subgraph
    if build is None:
        raise NotImplementedError(f"{info.op_type} node {info.name!r} needs a subgraph builder")
    return build(info.attrs[attr], info.ctx.outer_values)


@kernel("If", since=1)
def _if(info: NodeInfo) -> Kernel:
    then_branch = _body(info, "then_branch")
    else_branch = _body(info, "else_branch")

    def run(cond: Any, *outer: Any) -> list[Any]:
        branch = then_branch if bool(np.asarray(cond).reshape(-1)[0]) else else_branch
        return branch((), outer)

    return run


def _stack(chunks: list[Any]) -> Any:
    if not chunks:
        return np.empty((0,), dtype=np.float32)
    return np.stack([np.asarray(c) for c in chunks])


@kernel("Loop", since=1)
def _loop(info: NodeInfo) -> Kernel:
    body = _body(info, "body")
    n_in = info.num_inputs
    n_carried = n_in - 2

    def run(*args: Any) -> list[Any]:
        max_trip, cond = args[0], args[1]
        carried = list(args[2:n_in])
        outer = args[n_in:]
        limit = None if max_trip is None else int(np.asarray(max_trip).reshape(-1)[0])
        keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        scans: list[list[Any]] = []
        it = 0
        while keep_going and (limit is None or it < limit):
            out = body((np.array(it, dtype=np.int64), np.array(keep_going), *carried), outer)
            keep_going = bool(np.asarray(out[0]).reshape(-1)[0])
            carried = list(out[1 : 1 + n_carried])
            if not scans:
                scans = [[] for _ in out[1 + n_carried :]]
            for acc, value in zip(scans, out[1 + n_carried :]):
                acc.append(value)
            it += 1
        n_scan = info.num_outputs - n_carried
        if not scans:
            scans = [[] for _ in range(n_scan)]
        return [*carried, *(_stack(s) for s in scans)]

    return run


@kernel("Scan", since=8)
def _scan8(info: NodeInfo) -> Kernel:
    """Scan-8: a leading batch axis on states and scan inputs, optional sequence_lens as input 0."""
    body = _body(info, "body")
    n_scan_in = int(info.attrs["num_scan_inputs"])
    n_state = info.num_inputs - 1 - n_scan_in
    n_scan_out = info.num_outputs - n_state
    dirs = list(info.get("directions", [0] * n_scan_in))
    n_in = info.num_inputs

    def run(*args: Any) -> list[Any]:
        lens, states0, scans0, outer = args[0], args[1 : 1 + n_state], args[1 + n_state : n_in], args[n_in:]
        batch = (states0 or scans0)[0].shape[0]
        finals: list[list[Any]] = [[] for _ in range(n_state)]
        outs: list[list[Any]] = [[] for _ in range(n_scan_out)]
        for b in range(batch):
            states = [s[b] for s in states0]
            steps = scans0[0].shape[1] if lens is None else int(np.asarray(lens).reshape(-1)[b])
            seqs = [x[b, :steps][::-1] if d else x[b, :steps] for x, d in zip(scans0, dirs)]
            acc: list[list[Any]] = [[] for _ in range(n_scan_out)]
            for t in range(steps):
                out = body((*states, *(s[t] for s in seqs)), outer)
                states = list(out[:n_state])
                for k in range(n_scan_out):
                    acc[k].append(out[n_state + k])
            for k in range(n_state):
                finals[k].append(states[k])
            for k in range(n_scan_out):
                outs[k].append(_stack(acc[k]))
        return [*(np.stack(f) for f in finals), *(np.stack(o) for o in outs)]

    return run


@kernel("Scan", since=9)
def _scan(info: NodeInfo) -> Kernel:
    body = _body(info, "body")
    n_scan_in = int(info.attrs["num_scan_inputs"])
    n_state = info.num_inputs - n_scan_in
    n_scan_out = info.num_outputs - n_state
    in_axes = list(info.get("scan_input_axes", [0] * n_scan_in))
    in_dirs = list(info.get("scan_input_directions", [0] * n_scan_in))
    out_axes = list(info.get("scan_output_axes", [0] * n_scan_out))
    out_dirs = list(info.get("scan_output_directions", [0] * n_scan_out))
    n_in = info.num_inputs

    def run(*args: Any) -> list[Any]:
        states = list(args[:n_state])
        scans = []
        for k, x in enumerate(args[n_state:n_in]):
            axis = in_axes[k] % x.ndim
            x = np.moveaxis(x, axis, 0)
            scans.append(x[::-1] if in_dirs[k] else x)
        outer = args[n_in:]
        steps = scans[0].shape[0] if scans else 0
        if any(s.shape[0] != steps for s in scans):
            raise Fail(f"Scan node {info.name!r}: scan inputs have different lengths")
        acc: list[list[Any]] = [[] for _ in range(n_scan_out)]
        for t in range(steps):
            out = body((*states, *(s[t] for s in scans)), outer)
            states = list(out[:n_state])
            for k in range(n_scan_out):
                acc[k].append(out[n_state + k])
        results = []
        for k in range(n_scan_out):
            chunks = acc[k][::-1] if out_dirs[k] else acc[k]
            stacked = _stack(chunks)
            axis = out_axes[k] % stacked.ndim if stacked.ndim else 0
            results.append(np.moveaxis(stacked, 0, axis))
        return [*states, *results]

    return run

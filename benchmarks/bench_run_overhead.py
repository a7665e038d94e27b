"""``session.run()``'s own cost, this checkout against another (issue 17: "run() overhead no worse than before").

    python benchmarks/bench_run_overhead.py [--baseline TREE] [--calls 2000] [--repeat 15] [--rounds 3] [--iree]
                                            [--corpus]

Sessions whose runs do almost nothing, so what is timed is epctx around the kernel: a one-node Identity model
on the CPU EP, and the test suite's whole model compiled for the example EP and loaded from its context model (the
lean path). With ``--iree`` (issue 21: IREE's per-call cost), that model compiled by IREE and loaded from its
context model too, on IREE's default device (``iree_context``) and with ``intra_op_num_threads=1``
(``iree_context_t1``: IREE's inline one-thread device, as ``bench_corpus.py --threads 1`` runs). With
``--corpus`` (issue 21: run()'s fixed cost on real models), one thread each: silero-vad on the CPU EP (a plan of
several steps whose If bodies run plans of their own), the corpus's LLM decode step compiled whole by OpenVINO
(and by IREE with ``--iree``) and loaded from its context model; for a one-step plan the compiled partition's call
alone (``_call``: the floor), and onnxruntime's run of each model (``ort_``) in the same child. Each is timed
as the best of ``--repeat`` blocks of ``--calls`` runs, on the calling thread's CPU clock
(``time.thread_time``: other processes' load does not count, unlike wall time). With ``--baseline`` (another epctx
checkout, e.g. ``git worktree add /tmp/before <rev>``) every round runs a child on this tree and one on the
baseline's ``src`` in turn, so the comparison is paired.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import sys, tempfile, time, timeit
import numpy as np, onnx
from onnx import TensorProto, helper
sys.path.insert(0, {root!r})
from tests.epcontext.models import EXAMPLE, feed, whole_model
import epctx

folder = tempfile.mkdtemp()
graph = helper.make_graph(
    [helper.make_node("Identity", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), folder + "/i.onnx")
identity = epctx.InferenceSession(folder + "/i.onnx", providers=["CPUExecutionProvider"])
onnx.save(whole_model(), folder + "/w.onnx")
so = epctx.SessionOptions()
so.add_session_config_entry("ep.context_enable", "1")
epctx.InferenceSession(folder + "/w.onnx", so, providers=[EXAMPLE])
context = epctx.InferenceSession(folder + "/w_ctx.onnx", providers=[EXAMPLE])
x, f = {{"x": np.ones((1, 4), np.float32)}}, feed()
cases = [
    ("identity_cpu", lambda: identity.run(None, x), time.thread_time),
    ("example_context", lambda: context.run(None, f), time.thread_time),
]
for suffix, threads in (("_wall", 0), ("_t1", 1)) if {iree} else ():
    so = epctx.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("epctx.partition.measured_rule", "0")  # IREE, even where the CPU EP is faster
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", folder + f"/w_iree{{suffix}}_ctx.onnx")
    epctx.InferenceSession(folder + "/w.onnx", so, providers=["IREEExecutionProvider"])
    so = epctx.SessionOptions()
    so.intra_op_num_threads = threads
    iree = epctx.InferenceSession(folder + f"/w_iree{{suffix}}_ctx.onnx", so, providers=["IREEExecutionProvider"])
    placed = {{ep for ep, _ in iree.get_partitions()}}
    assert placed == {{"IREEExecutionProvider"}}, f"iree_context{{suffix}} runs on {{placed}}"
    clock = time.thread_time if threads == 1 else time.perf_counter
    cases.append(("iree_context" + suffix, lambda s=iree: s.run(None, f), clock))
paths = {{}}
def corpus_session(model, ep):
    from pathlib import Path
    from benchmarks.corpus import materialise
    if model not in paths:
        paths[model] = str(materialise(model, Path(folder) / model))
    path = paths[model]
    so = epctx.SessionOptions()
    so.intra_op_num_threads = 1
    if ep == "CPUExecutionProvider":
        return epctx.InferenceSession(path, so, providers=[ep])
    so.add_session_config_entry("epctx.partition.measured_rule", "0")
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", path + ep + "_ctx.onnx")
    epctx.InferenceSession(path, so, providers=[ep])
    so = epctx.SessionOptions()
    so.intra_op_num_threads = 1
    return epctx.InferenceSession(path + ep + "_ctx.onnx", so, providers=[ep])

for short, model, ep in {corpus}:
    from benchmarks.corpus import feeds
    sess, fd = corpus_session(model, ep), feeds(model)
    cases.append((short, lambda s=sess, fd=fd: s.run(None, fd), time.thread_time))
    steps = sess._plan.steps
    if len(steps) == 1:  # the compiled partition's call alone: the floor run() adds its cost to
        args = sess._binder.bind(fd)
        cases.append((short + "_call", lambda fn=steps[0][0], a=args: fn(*a), time.thread_time))
for model in paths:
    import onnxruntime as ort
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o_sess = ort.InferenceSession(paths[model], o, providers=["CPUExecutionProvider"])
    cases.append(("ort_" + model, lambda s=o_sess, fd=feeds(model): s.run(None, fd), time.thread_time))
for name, call, clock in cases:
    timer = timeit.Timer(call, timer=clock)
    print(name, min(timer.repeat(number={calls}, repeat={repeat})) / {calls})
"""


def _corpus_rows(corpus: bool, iree: bool) -> list[tuple[str, str, str]]:
    """(row, corpus model, EP) of the real-model rows (``--corpus``)."""
    if not corpus:
        return []
    rows = [
        ("cpu_silero_vad_t1", "silero_vad", "CPUExecutionProvider"),
        ("openvino_llm_decode_t1", "llm_decode", "OpenVINOExecutionProvider"),
    ]
    if iree:
        rows.append(("iree_llm_decode_t1", "llm_decode", "IREEExecutionProvider"))
    return rows


def _child(src: Path, calls: int, repeat: int, iree: bool, corpus: bool = False) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    rows = _corpus_rows(corpus, iree)
    code = _CHILD.format(root=str(ROOT), calls=calls, repeat=repeat, iree=iree, corpus=repr(rows))
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child on {src} failed:\n{out.stderr[-2000:]}")
    return {name: float(value) for name, value in (line.split() for line in out.stdout.splitlines())}


def checkout_trees(parser: argparse.ArgumentParser, baseline: Path | None) -> dict[str, Path]:
    """The src/ folders to import epctx from: this checkout's, and ``--baseline``'s (a usage error if it is not an
    epctx checkout)."""
    trees = {"this": ROOT / "src"}
    if baseline is not None:
        if not (baseline / "src" / "epctx").is_dir():
            parser.error(f"--baseline {baseline} is not an epctx checkout (no src/epctx)")
        trees["baseline"] = baseline / "src"
    return trees


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, help="another epctx checkout (its src/ is imported)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--iree", action="store_true", help="add the IREE rows (compiles the model with IREE)"
    )
    parser.add_argument(
        "--corpus",
        action="store_true",
        help="add real-model rows: silero-vad on the CPU EP, the corpus's LLM decode step on OpenVINO (and on "
        "IREE with --iree) from its context model, one thread; with the compiled partition's call alone "
        "(_call) and onnxruntime's run (ort_) beside them",
    )
    args = parser.parse_args(argv)
    trees = checkout_trees(parser, args.baseline)
    best: dict[tuple[str, str], float] = {}
    for round_ in range(args.rounds):
        for tree, src in trees.items():
            for name, seconds in _child(src, args.calls, args.repeat, args.iree, args.corpus).items():
                print(f"round {round_ + 1} {tree:8s} {name:28s} {seconds * 1e6:7.2f} us", file=sys.stderr)
                best[tree, name] = min(best.get((tree, name), seconds), seconds)
    print(
        "| session | "
        + " | ".join(f"{tree} us" for tree in trees)
        + (" | this / baseline |" if len(trees) > 1 else " |")
    )
    print("|---|" + "---:|" * (len(trees) + (len(trees) > 1)))
    for name in sorted({name for _, name in best}):
        cells = [f"{best[tree, name] * 1e6:.2f}" for tree in trees]
        ratio = [f"{best['this', name] / best['baseline', name]:.2f}"] if len(trees) > 1 else []
        print(f"| {name} | " + " | ".join(cells + ratio) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""OpenVINO's cost per call in epctx against its floor (issue 21: the small transformers' per-call overhead).

    python benchmarks/bench_openvino_call.py [--models llm_decode,llm_prefill] [--baseline TREE]
                                             [--calls 1000] [--rounds 5]

For each corpus model (``benchmarks/corpus``), in one process with one thread for every runtime, on the calling
thread's CPU clock (``time.thread_time``: other processes' load does not count; OpenVINO's synchronous infer
runs on the calling thread), the best of ``--rounds`` x 3 blocks of ``--calls`` calls:

- ``ort``: onnxruntime CPU ``session.run`` (the latency goal's baseline);
- ``floor``: a bare ``openvino`` loop on the same .onnx: ``compile_model`` once, input tensors set once,
  ``request.infer()`` per call (its outputs copied, as any runtime that hands them over must);
- ``compiled``: epctx's ``CompiledOpenVINO`` called with the feed's arrays (what the EP costs per call);
- ``run``: the warm epctx session's ``run`` (the context model loaded; the session's own loop included);
- ``unscoped``: ``run`` of a second warm session with the EPs' run scopes taken out (its private ``_scoped`` /
  ``_plain``, where the session has them; else ``-``): the CPU EP's BLAS thread limit (threadpoolctl) is entered
  around every run with ``intra_op_num_threads`` set, even when the CPU EP runs none of the model's nodes. A
  measurement of the session's cost, not a way to run.

With ``--baseline`` (another checkout, e.g. ``git worktree add /tmp/before <rev>``) each round runs a child on
this tree and one on the baseline's ``src``, in turn.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_run_overhead import checkout_trees  # noqa: E402

CASES = ("ort", "floor", "compiled", "run", "unscoped")

_CHILD = r"""
import json, sys, tempfile, time, timeit
from pathlib import Path
sys.path.insert(0, {root!r})
import numpy as np, onnxruntime as ort, openvino as ov
import epctx
from benchmarks.corpus import feeds, materialise
from epctx.providers.openvino import compiled as compiled_module

made = []
rebind = compiled_module.CompiledOpenVINO.rebind
def recording(self, *args, **kwargs):
    made.append(self)
    return rebind(self, *args, **kwargs)
compiled_module.CompiledOpenVINO.rebind = recording
work = Path(tempfile.mkdtemp())
out = {{}}
for name in {models!r}:
    model, feed = str(materialise(name, work / name)), feeds(name)
    def options():
        so = epctx.SessionOptions()
        so.intra_op_num_threads = 1
        return so
    so = options()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(work / (name + "_ctx.onnx")))
    epctx.InferenceSession(model, so, providers=["OpenVINOExecutionProvider"])
    made.clear()
    sess = epctx.InferenceSession(str(work / (name + "_ctx.onnx")), options(), providers=["OpenVINOExecutionProvider"])
    assert len(made) == 1, "one OpenVINO partition expected"
    fn = made[0]
    bare = epctx.InferenceSession(str(work / (name + "_ctx.onnx")), options(), providers=["OpenVINOExecutionProvider"])
    unscoped = hasattr(bare, "_scoped") and hasattr(bare, "_plain")
    if unscoped:
        bare._scoped, bare._plain = [], True
    args = [feed[n] for n in fn.input_names]
    oso = ort.SessionOptions()
    oso.intra_op_num_threads = oso.inter_op_num_threads = 1
    osess = ort.InferenceSession(model, oso, providers=["CPUExecutionProvider"])
    cm = ov.Core().compile_model(model, "CPU", {{"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}})
    request = cm.create_infer_request()
    held = [np.array(feed[port.get_any_name()]) for port in cm.inputs]  # a shared tensor does not keep it alive
    for i, array in enumerate(held):
        request.set_input_tensor(i, ov.Tensor(array, shared_memory=True))
    cases = {{"ort": lambda: osess.run(None, feed), "floor": lambda: request.infer(),
              "compiled": lambda: fn(*args), "run": lambda: sess.run(None, feed)}}
    if unscoped:
        cases["unscoped"] = lambda: bare.run(None, feed)
    best = {{}}
    for _ in range({rounds}):
        for case, call in cases.items():
            call()
            t = min(timeit.Timer(call, timer=time.thread_time).repeat(number={calls}, repeat=3)) / {calls}
            best[case] = min(best.get(case, t), t)
    out[name] = best
print(json.dumps(out))
"""


def _child(src: Path, models: list[str], calls: int, rounds: int) -> dict[str, dict[str, float]]:
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    code = _CHILD.format(root=str(ROOT), models=models, calls=calls, rounds=rounds)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child on {src} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="llm_decode,llm_prefill")
    parser.add_argument("--baseline", type=Path, help="another epctx checkout (its src/ is imported)")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    trees = checkout_trees(parser, args.baseline)
    models = args.models.split(",")
    best: dict[tuple[str, str, str], float] = {}
    for _ in range(2 if len(trees) > 1 else 1):  # alternate the trees so both see the same load
        for tree, src in trees.items():
            for model, cases in _child(src, models, args.calls, args.rounds).items():
                for case, seconds in cases.items():
                    key = (tree, model, case)
                    best[key] = min(best.get(key, seconds), seconds)
    print(
        f"load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}, one thread, thread CPU time, best of"
    )
    print(
        "| tree | model | ort us | floor us | compiled us | run us | unscoped us | compiled - floor | run / ort "
        "| unscoped / ort |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tree in trees:
        for model in models:
            t = {case: best[tree, model, case] * 1e6 for case in CASES if (tree, model, case) in best}
            free = (
                (f"{t['unscoped']:.1f}", f"{t['unscoped'] / t['ort']:.2f}") if "unscoped" in t else ("-", "-")
            )
            print(
                f"| {tree} | {model} | {t['ort']:.1f} | {t['floor']:.1f} | {t['compiled']:.1f} | {t['run']:.1f} "
                f"| {free[0]} | {t['compiled'] - t['floor']:.1f} | {t['run'] / t['ort']:.2f} | {free[1]} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

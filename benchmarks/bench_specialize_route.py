"""What per-shape specialization (``epctx.specialize_shapes``) adds to ``run()`` (issue 21: "~1 us on the hot path").

    python benchmarks/bench_specialize_route.py [--calls 5000] [--repeat 15]

A one-node model with a dynamic batch (``y = Relu(x)``, x[batch, 8]) on the example EP under another name with
``static_shapes_help = True`` (an EP that says static shapes help it, as IREE does, without IREE's per-call cost),
so that what is timed is epctx around a call that does almost nothing:

- ``off``: ``epctx.specialize_shapes=off``: run()'s plain path (as a static model, or any other EP);
- ``miss``: a session that specializes, fed a signature that is counted but not specialized
  (``epctx.specialize_shapes_max=1``, taken by another shape): the routing path, the owner's plan runs;
- ``special``: the specialized session itself, run directly (its plain path: its shapes are static);
- ``hit``: the session that specializes, fed the specialized signature: the routing path to that plan;
- ``route``: ``ShapeSpecializer.route`` alone (the signature made and looked up).

Each is the best of ``--repeat`` blocks of ``--calls`` calls on the calling thread's CPU clock
(``time.thread_time``: other processes' load does not count); ``miss - off`` and ``hit - special`` are what routing
costs a run (the general and the specialized plans differ: the example EP declines a dynamic Relu).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "route",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _session(mode: str, cache: str, ep: str) -> Any:
    import epctx

    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.specialize_shapes", mode)
    so.add_session_config_entry("epctx.specialize_shapes_max", "1")
    so.add_session_config_entry("epctx.context_cache", cache)
    return epctx.InferenceSession(_model(), so, providers=[ep])


def _best_us(call: Any, args: tuple[Any, ...], calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        for _ in range(calls):
            call(*args)
        best = min(best, (time.thread_time() - start) / calls)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    from tests.fusing_ep import registered

    from epctx.providers.example import ExampleExecutionProvider

    class StaticShapesEP(ExampleExecutionProvider):
        name = "BenchStaticShapesExecutionProvider"
        static_shapes_help = True

    hit_feed = {"x": np.ones((2, 8), np.float32)}
    miss_feed = {"x": np.ones((3, 8), np.float32)}
    with registered(StaticShapesEP), tempfile.TemporaryDirectory(prefix="epctx-route-") as cache:
        off = _session("off", cache, StaticShapesEP.name)
        auto = _session("sync", cache, StaticShapesEP.name)  # sync: specialized in the second run
        for _ in range(2):
            auto.run(None, hit_feed)
        assert auto.get_shape_specializations()["x[2,8]"].state == "ready"
        for _ in range(2):  # counted, not taken (the one signature allowed is taken)
            auto.run(None, miss_feed)
        special = auto._shapes._ready[((2, 8),)]
        route = auto._shapes.route
        inputs = [hit_feed["x"]]
        times = {
            "off": _best_us(off.run, (None, miss_feed), args.calls, args.repeat),
            "miss": _best_us(auto.run, (None, miss_feed), args.calls, args.repeat),
            "special": _best_us(special.run, (None, hit_feed), args.calls, args.repeat),
            "hit": _best_us(auto.run, (None, hit_feed), args.calls, args.repeat),
            "route": _best_us(route, (inputs,), args.calls, args.repeat),
        }
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"per call, best of {args.repeat} x {args.calls} (thread CPU time), load {load}")
    base = {"miss": "off", "hit": "special"}
    for name, us in times.items():
        extra = f"  ({us - times[base[name]]:+.2f} us against {base[name]})" if name in base else ""
        print(f"  {name:8s} {us:7.2f} us{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

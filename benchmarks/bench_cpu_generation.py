"""A generation on the CPU EP against onnxruntime: the LLM pair (``benchmarks/llm_pair.py``) run as a user runs it.

    python benchmarks/bench_cpu_generation.py [--size tiny] [--prompt 16] [--tokens 32] [--rounds 5] [--threads 1]

A prefill over a prompt, then ``--tokens`` decode steps, the past one longer at each. The corpus' ``llm_decode``
row times one decode step over and over (the same shapes at each run), where epctx's shape memo
(``session/plan_memo.py``) answers from its entries; in a generation each decode step brings a past length the
session may not have seen. After a warm-up generation (prompt ``--prompt``), each round runs two generations
per runtime: one whose lengths are all new to the session (its prompt ``--tokens`` longer than any before: every
decode step a memo miss, the shape steps run), and the warm-up's again (every length seen: memo hits, as far
as a memo keeps them, ``MEMO_ENTRIES``). Printed per runtime: the fastest prefill of ``--prompt`` tokens, and
the fastest mean decode step over the rounds of each kind, in ms, and the ratios to onnxruntime. Both runtimes
on ``--threads`` threads, alternating.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.llm_pair import SIZES, decode_feeds, export_pair, prefill_feeds

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def _runners(prefill: Path, decode: Path, runtime: str, threads: int) -> tuple[Runner, Runner]:
    if runtime == "ort":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        made = [
            ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
            for p in (prefill, decode)
        ]
    else:
        import epctx

        so = epctx.SessionOptions()
        so.intra_op_num_threads = threads
        made = [
            epctx.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for p in (prefill, decode)
        ]
    return (lambda feed: made[0].run(None, feed)), (lambda feed: made[1].run(None, feed))


def generate(
    prefill: Runner, decode: Runner, size: str, prompt: int, tokens: int
) -> tuple[float, list[float]]:
    """(prefill seconds, each decode step's seconds) of one generation, greedy."""
    config = SIZES[size]
    start = time.perf_counter()
    out = prefill(prefill_feeds(config, prompt))
    first = time.perf_counter() - start
    steps = []
    for _ in range(tokens):
        feed = decode_feeds(config, out, int(np.argmax(out[0][0, -1])))
        start = time.perf_counter()
        out = decode(feed)
        steps.append(time.perf_counter() - start)
    return first, steps


def measure(args: argparse.Namespace, prefill: Path, decode: Path) -> dict[str, dict[str, float]]:
    sessions = {rt: _runners(prefill, decode, rt, args.threads) for rt in ("ort", "epctx")}
    rows = {
        rt: {"prefill_ms": float("inf"), "new_ms": float("inf"), "seen_ms": float("inf")} for rt in sessions
    }
    for p, d in sessions.values():  # warm-up: the lengths of the "seen" generations
        generate(p, d, args.size, args.prompt, args.tokens)
    for r in range(1, args.rounds + 1):
        for rt, (p, d) in sessions.items():
            _, new = generate(p, d, args.size, args.prompt + r * args.tokens, args.tokens)
            first, seen = generate(p, d, args.size, args.prompt, args.tokens)
            row = rows[rt]
            row["prefill_ms"] = min(row["prefill_ms"], first * 1e3)
            row["new_ms"] = min(row["new_ms"], float(np.mean(new)) * 1e3)
            row["seen_ms"] = min(row["seen_ms"], float(np.mean(seen)) * 1e3)
    return rows


def report(rows: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    keys = ("prefill_ms", "new_ms", "seen_ms")
    lines = [
        f"size {args.size}, prompt {args.prompt}, {args.tokens} decode steps, {args.threads} thread(s), "
        f"{args.rounds} rounds, load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
        "runtime | prefill ms | decode ms, lengths new to the session | decode ms, lengths seen before",
    ]
    for rt in ("ort", "epctx"):
        lines.append(f"{rt:7} | " + " | ".join(f"{rows[rt][k]:.3f}" for k in keys))
    lines.append("ratio   | " + " | ".join(f"{rows['epctx'][k] / rows['ort'][k]:.2f}" for k in keys))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epctx-generation-") as tmp:
        prefill, decode = export_pair(Path(tmp), args.size)
        print(report(measure(args, prefill, decode), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

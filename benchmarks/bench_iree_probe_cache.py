"""IREE's probe records across sessions (issue 21): per corpus model, three sessions one after another, each in
its own process (no per-process compile cache between them), with a fresh records folder at the start:

1. ``compile``: from the ``.onnx`` with ``ep.context_enable=1`` (as ``bench_corpus.py`` does);
2. ``warm``: from the context model it wrote (from the ``.onnx`` when none was written);
3. ``again``: from the ``.onnx`` once more.

For each: seconds to create the session, nodes per EP, the capability compiles run and the outcomes read from
the probe records (from IREE's log line). Run it from a tree with that tree's ``PYTHONPATH`` (``src`` and the
root) to compare two trees (a tree without probe records reads none), and say the load:

    python benchmarks/bench_iree_probe_cache.py [--models ppocr_det] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

EP = "IREEExecutionProvider"
_LINE = re.compile(r"capability: .* in ([0-9.]+) s(?: \((\d+) compile\(s\) run, (\d+) outcome\(s\))?")


def _session(source: str, ctx: str, threads: int) -> dict[str, object]:
    import logging

    import epctx

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("epctx").addHandler(handler)
    logging.getLogger("epctx").setLevel(logging.INFO)
    so = epctx.SessionOptions()
    so.intra_op_num_threads = threads
    if ctx:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", ctx)
    start = time.perf_counter()
    sess = epctx.InferenceSession(source, so, providers=[EP])
    seconds = time.perf_counter() - start
    nodes = Counter(ep for ep, names in sess.get_partitions() for _ in names)
    found = [m for line in records if (m := _LINE.search(line))]
    return {
        "seconds": round(seconds, 2),
        "nodes": " ".join(
            f"{k.replace('ExecutionProvider', '').lower()}:{v}" for k, v in sorted(nodes.items())
        ),
        "iree_partitions": sum(ep == EP for ep, _ in sess.get_partitions()),
        "compiles": int(found[-1][2]) if found and found[-1][2] else None,
        "from_records": int(found[-1][3]) if found and found[-1][3] else None,
        "epctx": str(Path(epctx.__file__).parent),
    }


def _run(source: str, ctx: str, threads: int, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, __file__, "--cell", source, ctx, str(threads)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-300:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="ppocr_det")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cell", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(_session(args.cell[0], args.cell[1], int(args.cell[2]))))
        return 0
    from benchmarks.corpus import CORPUS

    print(f"load {_load()}  cpus {os.cpu_count()}  threads {args.threads}")
    with tempfile.TemporaryDirectory(prefix="epctx-probe-bench-") as work:
        env = {**os.environ, "EPCTX_CACHE_DIR": str(Path(work) / "cache")}
        for name in args.models.split(","):
            model = str(CORPUS[name].make(Path(work)))
            ctx = str(Path(work) / f"{name}_ctx.onnx")
            rows = {"compile": _run(model, ctx, args.threads, env)}
            rows["warm"] = _run(ctx if Path(ctx).exists() else model, "", args.threads, env)
            rows["again"] = _run(model, "", args.threads, env)
            for what, row in rows.items():
                print(f"{name:12s} {what:8s} {json.dumps(row)}")
    print(f"load {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

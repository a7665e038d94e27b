"""The measured rule's verdicts kept between processes (``epctx.partition.verdicts``): a second session's creation
with the cache off (``EPCTX_MEASURED_CACHE=0``, the rule compiles and measures again, as before the cache) and on.

    python benchmarks/bench_measured_cache.py [--models magika,minilm,ppocr_det,nudenet] [--ep iree] [--repeat 2]

Per model, in a fresh cache folder (``EPCTX_CACHE_DIR``, shared by the processes of that model, so IREE's probe
records help both sides alike): two processes with the cache on create the ``[EP, CPU]`` session in turn (``1st``:
cold; ``2nd``: IREE's search goes on from its probe records, and when the first had nothing to measure, because
IREE's capability budget ran out before it claimed anything, ppocr_det and nudenet here, this one measures and
keeps the verdicts), then ``--repeat`` times a process with the cache off (``EPCTX_MEASURED_CACHE=0``: compiled
and measured again, as before the cache) and one with it on, each creating the session once (``create s``,
``intra_op_num_threads`` 1, the default session config); medians of those, and every value in order below the
table; the nodes per EP and a digest of the outputs on the corpus feeds, which must agree. The load average is
printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_corpus import EPS, SHORT, _child_env
from benchmarks.corpus import Unavailable, materialise

_CHILD = """
import hashlib, json, sys, time
import numpy as np
import epctx
from benchmarks.corpus import feeds
name, path, ep = sys.argv[1:4]
so = epctx.SessionOptions()
so.intra_op_num_threads = 1
start = time.perf_counter()
sess = epctx.InferenceSession(path, so, providers=[ep, "CPUExecutionProvider"])
create = time.perf_counter() - start
nodes = {}
for provider, names in sess.get_partitions():
    nodes[provider] = nodes.get(provider, 0) + len(names)
cached = sum(1 for why in sess.get_fallback_reasons().values() for r in why.values() if r.startswith("from the measured cache"))
digest = hashlib.sha256()
for out in sess.run(None, feeds(name)):
    digest.update(np.round(np.asarray(out, np.float64), 4).tobytes())
print(json.dumps({"create_s": create, "nodes": nodes, "from_cache": cached, "outputs": digest.hexdigest()[:12]}))
"""


def _child(name: str, path: Path, ep: str, cache: Path, enabled: bool) -> dict[str, Any]:
    env = _child_env(None)
    env["EPCTX_CACHE_DIR"] = str(cache)
    env["EPCTX_MEASURED_CACHE"] = "1" if enabled else "0"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, name, str(path), ep],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _nodes(row: dict[str, Any]) -> str:
    return " ".join(f"{SHORT.get(k, k)}:{v}" for k, v in sorted(row["nodes"].items()))


def _times(rows: list[dict[str, Any]]) -> str:
    return " ".join(f"{row['create_s']:.2f}" for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="magika,minilm,ppocr_det,nudenet")
    parser.add_argument("--ep", default="iree", choices=sorted(EPS))
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    ep = EPS[args.ep]
    print(f"load at start {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
    header = "model | 1st s | 2nd s | off: create s | on: create s | ratio on/off | nodes (off) | nodes (on) | same"
    lines, raw = [header, "-" * len(header)], []
    with tempfile.TemporaryDirectory(prefix="epctx-bench-verdicts-") as tmp:
        for name in args.models.split(","):
            try:
                path = materialise(name, Path(tmp, "models"))
            except Unavailable as exc:
                lines.append(f"{name} | unavailable: {exc}")
                continue
            cache = Path(tmp, f"cache-{name}")
            first = _child(name, path, ep, cache, True)
            second = _child(name, path, ep, cache, True)
            off, on = [], []
            for _ in range(args.repeat):
                off.append(_child(name, path, ep, cache, False))
                on.append(_child(name, path, ep, cache, True))
            off_s = statistics.median(r["create_s"] for r in off)
            on_s = statistics.median(r["create_s"] for r in on)
            same = len({r["outputs"] for r in off + on + [first, second]}) == 1
            lines.append(
                f"{name} | {first['create_s']:.2f} | {second['create_s']:.2f} | {off_s:.2f} | {on_s:.2f} | "
                f"{on_s / off_s:.2f} | {_nodes(off[-1])} | {_nodes(on[-1])} ({on[-1]['from_cache']} from the "
                f"cache) | {same}"
            )
            raw.append(f"  {name}: off {_times(off)}; on {_times(on)}")
            print(lines[-1], flush=True)
    print(f"load at end {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print("\n".join(lines + ["", "create s of each process, in order:", *raw]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

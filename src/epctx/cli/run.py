"""``epctx run MODEL [--input name=file.npy]... [-p EP[:k=v,...]]...``: run a model, print an output summary and timing."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser", "random_feed"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run a model once and summarize its outputs")
    p.add_argument("model")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy")
    add_provider_arguments(p)
    p.add_argument("--repeat", type=int, default=1, help="runs to time (the median is reported)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def random_feed(session: Any, files: dict[str, str], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs from .npy files where given, else random data of the declared type (symbolic dims = 1)."""
    rng = np.random.default_rng(seed)
    feed = {}
    for arg in session.get_inputs():
        if arg.name in files:
            feed[arg.name] = np.load(files[arg.name])
            continue
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in (arg.shape or [])]
        elem = arg.type[len("tensor(") : -1]
        if elem in ("float", "double", "float16"):
            dtype = {"float": np.float32, "double": np.float64, "float16": np.float16}[elem]
            feed[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif elem == "bool":
            feed[arg.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feed[arg.name] = rng.integers(0, 4, shape).astype(np.dtype(elem))
    return feed


def run(args: argparse.Namespace) -> int:
    import epctx

    files = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--input expects NAME=FILE.npy, got {item!r}")
        files[name] = path
    providers = providers_from_args(args)
    t0 = time.perf_counter()
    session = epctx.InferenceSession(args.model, providers=providers or None)
    created = time.perf_counter() - t0
    feed = random_feed(session, files)
    times = []
    outputs: list[Any] = []
    for _ in range(max(1, args.repeat)):
        t = time.perf_counter()
        outputs = session.run(None, feed)
        times.append(time.perf_counter() - t)
    summary = [
        {
            "name": o.name,
            "shape": list(np.shape(v)),
            "dtype": str(np.asarray(v).dtype),
            "mean": float(np.mean(v)) if np.asarray(v).dtype.kind in "fiub" and np.size(v) else None,
        }
        for o, v in zip(session.get_outputs(), outputs)
    ]
    result: dict[str, Any] = {
        "providers": session.get_providers(),
        "session_ms": created * 1e3,
        "run_ms_median": float(np.median(times)) * 1e3,
        "outputs": summary,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"providers: {', '.join(result['providers'])}")
    print(
        f"session creation: {result['session_ms']:.1f} ms   run (median of {len(times)}): "
        f"{result['run_ms_median']:.2f} ms"
    )
    for s in summary:
        mean = "" if s["mean"] is None else f"  mean={s['mean']:.6g}"
        print(f"  {s['name']}: {s['dtype']}{s['shape']}{mean}")
    return 0

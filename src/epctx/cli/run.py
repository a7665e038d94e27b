"""``epctx run MODEL [--input NAME=FILE.npy]... [--random [--dim NAME=N]... [--shape NAME[d0,...]]... [--seed S]] [-p EP[:k=v,...]]...
[-o FILE.npz | --output-dir DIR [--force]] [-C KEY=VALUE]... [-q]``: run a model, print an output summary and
timing, save the outputs.

``-C KEY=VALUE`` (repeatable) adds a session config entry, e.g. ``-C epctx.context_cache=DIR`` (the transparent
cache: the first run compiles into DIR, the next ones load from it) or ``-C ep.context_enable=1 -C
epctx.context_reuse=1``. A session that may write a context this way shows the library's progress lines on
stderr while it is created (the compile's per-partition lines, as ``epctx compile``; cache hits and misses);
``-q`` or ``--json`` silences them.

Without ``-p``, a context model runs on the EPs its EPContext nodes name (their ``source``, with default options;
an EP that is not here is an error naming it) and a plain model on the CPU EP."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from epctx.cli import feeds, run_outputs
from epctx.cli.failures import UsageError
from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser", "context_providers"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a model once and summarize its outputs",
        description=f"{__doc__}\n\n{feeds.__doc__}\n\n{run_outputs.__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model")
    p.add_argument(
        "--input",
        "-i",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input's data (repeatable)",
    )
    p.add_argument("--random", action="store_true", help="random data for every input not given by --input")
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=N",
        help="size of a dynamic dimension of random inputs (repeatable): NAME=N or INPUT:AXIS=N",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME[d0,...]",
        help="whole shape of a random input (repeatable), anonymous dimensions included",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    add_provider_arguments(p)
    p.add_argument("--repeat", type=int, default=1, help="runs to time (the median is reported)")
    run_outputs.add_arguments(p)
    p.add_argument(
        "-C",
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a session config entry (repeatable), e.g. -C epctx.context_cache=DIR",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="machine-readable output (implies --quiet)")
    p.set_defaults(func=run)


# Entries with which a session may compile into files: its creation shows progress lines.
_WRITES_CONTEXTS = ("epctx.context_cache", "ep.context_enable")


def _create_session(args: argparse.Namespace, providers: list[Any]) -> tuple[Any, float]:
    """(the session of ``args``, seconds to create it), with ``-C`` entries and progress lines."""
    import epctx
    from epctx.cli.progress import progress_lines

    entries = feeds.parse_assignments(args.config, "-C", "VALUE")
    so = epctx.SessionOptions()
    for key, value in entries.items():
        so.add_session_config_entry(key, value)
    talk = not (args.quiet or args.json) and any(
        entries.get(k) not in (None, "", "0") for k in _WRITES_CONTEXTS
    )
    t0 = time.perf_counter()
    with progress_lines(talk):
        session = epctx.InferenceSession(args.model, so, providers=providers or None)
    return session, time.perf_counter() - t0


def context_providers(model: str) -> list[str]:
    """The EPs a context model's EPContext nodes name (each node's ``source`` matched, ignoring case, against
    the EPs found here), in node order; [] for a model without EPContext nodes."""
    import epctx
    from epctx.errors import InvalidArgument

    available = epctx.get_available_providers()
    names: list[str] = []
    for node_name, source in _context_sources(model):
        name = next((n for n in available if n.lower() == source.lower()), None)
        if name is None:
            raise InvalidArgument(
                f"EPContext node {node_name!r} of {model!r} was made by {source!r}, which is not an EP found "
                f"here ({', '.join(available)}); name the EP that loads it with -p (or --ep-library)"
            )
        if name not in names:
            names.append(name)
    return names


def _context_sources(model: str) -> list[tuple[str, str]]:
    """(node name, source) of each EPContext node: from the lean reader when it takes the model (a context
    model then loads without onnx, as a session does), else from ``epctx inspect``'s reader."""
    from pathlib import Path

    from epctx.model.lean import read_context_model
    from epctx.model.source import read_model_file

    lean = read_context_model(read_model_file(Path(model)))
    if lean is not None:
        return [
            (n.name, str(n.attributes["source"].value) if "source" in n.attributes else "")
            for n in lean.graph
        ]
    from epctx.tools.inspect import inspect_model

    return [(node.name, node.source or "") for node in inspect_model(model).ep_context_nodes]


def run(args: argparse.Namespace) -> int:

    files = feeds.parse_assignments(args.input, "--input", "FILE.npy")
    dims = feeds.parse_assignments(args.dim, "--dim", "N")
    if args.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {args.repeat}", "epctx run")
    run_outputs.check_arguments(args)
    providers: list[Any] = list(providers_from_args(args))
    chosen_by = "-p"
    if not providers:
        providers = context_providers(args.model)
        chosen_by = "the model's EPContext nodes" if providers else "default"
    session, created = _create_session(args, providers)
    feed = feeds.build_feed(
        args.model,
        session.get_inputs(),
        files,
        random=args.random,
        dims=dims,
        seed=args.seed,
        shapes=args.shape,
    )
    names = [o.name for o in session.get_outputs()]
    saved = run_outputs.planned_files(args, names)
    times = []
    outputs: list[Any] = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        outputs = session.run(None, feed)
        times.append(time.perf_counter() - t)
    run_outputs.save(saved, names, outputs)
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
        "providers_from": chosen_by,
        "inputs": {name: {"shape": list(v.shape), "dtype": str(v.dtype)} for name, v in feed.items()},
        "session_ms": created * 1e3,
        "run_ms_median": float(np.median(times)) * 1e3,
        "outputs": summary,
        "saved": {name: str(path) for name, path in saved.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    _print_result(result, len(times))
    return 0


def _print_result(result: dict[str, Any], runs: int) -> None:
    print(f"providers: {', '.join(result['providers'])}  (from {result['providers_from']})")
    print(
        f"session creation: {result['session_ms']:.1f} ms   run (median of {runs}): "
        f"{result['run_ms_median']:.2f} ms"
    )
    saved = result["saved"]
    for s in result["outputs"]:
        mean = "" if s["mean"] is None else f"  mean={s['mean']:.6g}"
        where = f"  -> {saved[s['name']]}" if s["name"] in saved else ""
        print(f"  {s['name']}: {s['dtype']}{s['shape']}{mean}{where}")
    files = sorted(set(saved.values()))
    if len(files) == 1 and files[0].endswith(".npz"):
        print(f"saved {len(saved)} output(s) in {files[0]}")
    elif files:
        print(f"saved {len(files)} .npy file(s) in {Path(files[0]).parent}")

"""Startup benchmark: whole fresh processes, from interpreter start to the first result (issue 11).

    python benchmarks/bench_startup.py [--models resnet18,transformer,minilm,ppocr_rec] [--eps ...] [--runs 7]

For each compiling EP that is installed (OpenVINO, IREE when its EP exists, the example EP) and each model,
every column is the median wall time of ``--runs`` fresh ``python`` processes, the modes run in turn within
each round (paired, so the machine's drift hits them alike). Each process imports what it needs, creates its
session / compiled model and runs one inference:

- ``epctx warm``: ``import epctx`` + InferenceSession over the context model + ``run`` (the lean load path);
- ``raw warm``: the backend alone on the same compiled blob (OpenVINO: ``import openvino`` + ``Core.import_model``
  of the blob epctx stored, with the same properties + one inference); none for the example EP (its backend is
  epctx itself);
- ``epctx cold``: InferenceSession over the .onnx (the EP compiles) + ``run``;
- ``raw compile``: the backend compiling the .onnx itself (OpenVINO ``compile_model``) + one inference;
- ``ort``: onnxruntime CPU session + one ``run``.

Bytecode is compiled first and ``PYTHONDONTWRITEBYTECODE`` is unset in the children, as after a pip install.
Targets: epctx warm <= 1.05 x raw warm + 15 ms; epctx warm < raw compile where the compile takes > 50 ms.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import export_minilm
from benchmarks.models import MODELS, example_inputs
from benchmarks.processes import child_env, compile_bytecode

ROOT = Path(__file__).resolve().parents[1]
WARM_RATIO, WARM_SLACK_S, COMPILE_FLOOR_S = 1.05, 0.015, 0.050
MODES = ("epctx_warm", "raw_warm", "epctx_cold", "raw_compile", "ort")
EPS = {
    "OpenVINOExecutionProvider": "openvino",
    "IREEExecutionProvider": "iree.runtime",
    "ExampleExecutionProvider": None,
}


def _ppocr_rec() -> Any:
    import onnx

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("rapidocr-onnxruntime is not installed (make install)")
    path = Path(spec.submodule_search_locations[0]) / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    return onnx.load(str(path))


BUILDERS: dict[str, Callable[[], Any]] = {
    "resnet18": MODELS["resnet18"],
    "transformer": MODELS["transformer"],
    "minilm": export_minilm.minilm,
    "ppocr_rec": _ppocr_rec,
}


def _feed(name: str, model: Any) -> dict[str, np.ndarray]:
    if name == "minilm":
        return export_minilm.example_inputs()
    if name == "ppocr_rec":
        return {model.graph.input[0].name: np.random.default_rng(0).random((1, 3, 48, 320), np.float32)}
    return example_inputs(name, model)


# -- what each child process runs ------------------------------------------------------------------------
_CHILD = {
    "epctx_warm": """
import numpy as np, epctx
feed = dict(np.load({feed!r}))
epctx.InferenceSession({ctx!r}, providers=[{ep!r}]).run(None, feed)
""",
    "epctx_cold": """
import numpy as np, epctx
feed = dict(np.load({feed!r}))
epctx.InferenceSession({model!r}, providers=[{ep!r}]).run(None, feed)
""",
    "ort": """
import numpy as np, onnxruntime as ort
feed = dict(np.load({feed!r}))
ort.InferenceSession({model!r}, providers=["CPUExecutionProvider"]).run(None, feed)
""",
}
_RAW = {
    "OpenVINOExecutionProvider": {
        "raw_warm": """
import json, numpy as np, openvino as ov
feed = dict(np.load({feed!r}))
with open({blob!r}, "rb") as f:
    blob = f.read()
compiled = ov.Core().import_model(blob, "CPU", json.load(open({config!r})))
compiled(feed)
""",
        "raw_compile": """
import numpy as np, openvino as ov
feed = dict(np.load({feed!r}))
compiled = ov.Core().compile_model({model!r}, "CPU", {{"INFERENCE_PRECISION_HINT": "f32"}})
compiled(feed)
""",
    },
}


def _raw_openvino(ctx: Path, folder: Path) -> None:
    """The blob and properties epctx stored for the (single) partition, as files the raw child reads."""
    from epctx.epcontext.container import ContextBinary
    from epctx.providers.openvino.context import read_meta

    (binary_path,) = sorted(ctx.parent.glob("*.bin"))
    binary = ContextBinary.open(binary_path)
    (blob_name,) = [n for n in binary.names() if n.endswith("/blob")]
    meta = read_meta(binary.read(blob_name[: -len("blob")] + "meta"), "bench")
    (folder / "raw.blob").write_bytes(bytes(binary.read(blob_name)))
    (folder / "raw.json").write_text(json.dumps(dict(meta.config)))


def prepare(name: str, ep: str, folder: Path) -> dict[str, str]:
    import onnx

    import epctx

    model = BUILDERS[name]()
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "model.onnx"
    onnx.save(model, source)
    np.savez(folder / "feed.npz", **_feed(name, model))
    ctx = folder / "model_ctx.onnx"
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(ctx))
    epctx.InferenceSession(str(source), so, providers=[ep])
    paths = {"model": str(source), "ctx": str(ctx), "feed": str(folder / "feed.npz"), "ep": ep}
    if ep == "OpenVINOExecutionProvider":
        _raw_openvino(ctx, folder)
        paths.update(blob=str(folder / "raw.blob"), config=str(folder / "raw.json"))
    return paths


def _time(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"child failed:\n{code}\n{done.stderr[-2000:]}")
    return elapsed


def bench(name: str, ep: str, runs: int, root: Path) -> dict[str, Any]:
    paths = prepare(name, ep, root / f"{name}_{ep}")
    codes = {mode: code.format(**paths) for mode, code in _CHILD.items()}
    codes.update({mode: code.format(**paths) for mode, code in _RAW.get(ep, {}).items()})
    env = child_env()
    for code in codes.values():  # warm the page cache and the bytecode once
        _time(code, env)
    times: dict[str, list[float]] = {mode: [] for mode in codes}
    for _ in range(runs):
        for mode in codes:
            times[mode].append(_time(codes[mode], env))
    medians = {mode: statistics.median(ts) for mode, ts in times.items()}
    return {"model": name, "ep": ep, **medians}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | EP | epctx warm ms | raw warm ms | warm / raw | epctx cold ms | raw compile ms | ort ms | "
        "targets |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        warm, raw, compile_ = r["epctx_warm"], r.get("raw_warm"), r.get("raw_compile")
        ratio = f"{warm / raw:.2f}" if raw else "-"
        verdict = []
        if raw:
            verdict.append("warm ok" if warm <= WARM_RATIO * raw + WARM_SLACK_S else "warm MISSED")
        if compile_ and compile_ - (raw or 0) > COMPILE_FLOOR_S:
            verdict.append("< compile ok" if warm < compile_ else "< compile MISSED")
        lines.append(
            f"| {r['model']} | {r['ep'].removesuffix('ExecutionProvider')} | {_ms(warm)} | {_ms(raw)} | "
            f"{ratio} | {_ms(r['epctx_cold'])} | {_ms(compile_)} | {_ms(r['ort'])} | {', '.join(verdict)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(BUILDERS))
    parser.add_argument("--eps", default=",".join(EPS))
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    compile_bytecode()
    eps = [ep for ep in args.eps.split(",") if ep in EPS]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        for ep in eps:
            module = EPS[ep]
            if module is not None and importlib.util.find_spec(module.split(".")[0]) is None:
                print(f"skipping {ep}: {module} is not installed", file=sys.stderr)
                continue
            from epctx.providers.registry import available_providers

            if ep not in available_providers():
                print(f"skipping {ep}: not available in this epctx", file=sys.stderr)
                continue
            for name in args.models.split(","):
                rows.append(bench(name, ep, args.runs, Path(tmp)))
                print(report(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

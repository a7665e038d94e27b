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
``--modes`` picks columns (e.g. ``epctx_warm,ort``: compiling in every round takes long). ``--baseline TREE``
(another epctx checkout, e.g. ``git worktree add /tmp/before <rev>``) adds ``base warm`` (and ``base cold`` when
``epctx_cold`` runs): the same children importing that tree's ``src``, its context model compiled by that tree,
run in the same rounds as this tree's, so before / after is a paired comparison. ``--clock cpu`` reports each
child's CPU time (user + system, every thread) instead of wall time: the work done, steadier than wall time on a
loaded machine (it misses time spent waiting for the disk or for threads).
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


_PREPARE = """
import epctx
so = epctx.SessionOptions()
so.add_session_config_entry("ep.context_enable", "1")
so.add_session_config_entry("ep.context_file_path", {ctx!r})
epctx.InferenceSession({model!r}, so, providers=[{ep!r}])
"""


def _baseline_codes(paths: dict[str, str], folder: Path, baseline: Path) -> dict[str, str]:
    """The epctx children again, over a context model the baseline tree compiled (in a child importing it)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = {**paths, "ctx": str(folder / "model_ctx.onnx")}
    try:
        _time(_PREPARE.format(**base), child_env(baseline / "src"))
    except RuntimeError as exc:  # the baseline cannot compile this model: its columns read "-"
        print(
            f"baseline: {paths['ep']} on {paths['model']} failed: {str(exc).splitlines()[-1]}",
            file=sys.stderr,
        )
        return {}
    return {
        f"base_{mode[6:]}": code.format(**base) for mode, code in _CHILD.items() if mode.startswith("epctx")
    }


CLOCK = {"clock": "wall"}  # --clock cpu: the child's user + system CPU time (all its threads) instead


def _time(code: str, env: dict[str, str]) -> float:
    """The child's wall time, or its CPU time with ``--clock cpu`` (steadier on a loaded machine)."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"child failed:\n{code}\n{err.read()[-2000:].decode(errors='replace')}")
    return usage.ru_utime + usage.ru_stime if CLOCK["clock"] == "cpu" else elapsed


def bench(
    name: str, ep: str, runs: int, root: Path, modes: set[str], baseline: Path | None = None
) -> dict[str, Any]:
    paths = prepare(name, ep, root / f"{name}_{ep}")
    codes = {mode: code.format(**paths) for mode, code in _CHILD.items()}
    codes.update({mode: code.format(**paths) for mode, code in _RAW.get(ep, {}).items()})
    codes = {mode: code for mode, code in codes.items() if mode in modes}
    envs = dict.fromkeys(codes, child_env())
    if baseline is not None:
        based = _baseline_codes(paths, root / f"{name}_{ep}_baseline", baseline)
        based = {mode: code for mode, code in based.items() if f"epctx_{mode[5:]}" in modes}
        codes.update(based)
        envs.update(dict.fromkeys(based, child_env(baseline / "src")))
    for mode, code in codes.items():  # warm the page cache and the bytecode once
        _time(code, envs[mode])
    times: dict[str, list[float]] = {mode: [] for mode in codes}
    for _ in range(runs):
        for mode in codes:
            times[mode].append(_time(codes[mode], envs[mode]))
    medians = {mode: statistics.median(ts) for mode, ts in times.items()}
    return {"model": name, "ep": ep, **medians}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | EP | epctx warm ms | raw warm ms | warm / raw | epctx cold ms | raw compile ms | ort ms | "
        "base warm ms | warm / base | base cold ms | targets |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        warm, raw, compile_ = r.get("epctx_warm"), r.get("raw_warm"), r.get("raw_compile")
        base = r.get("base_warm")
        ratio = f"{warm / raw:.2f}" if raw and warm else "-"
        verdict = []
        if raw and warm:
            verdict.append("warm ok" if warm <= WARM_RATIO * raw + WARM_SLACK_S else "warm MISSED")
        if warm and compile_ and compile_ - (raw or 0) > COMPILE_FLOOR_S:
            verdict.append("< compile ok" if warm < compile_ else "< compile MISSED")
        lines.append(
            f"| {r['model']} | {r['ep'].removesuffix('ExecutionProvider')} | {_ms(warm)} | {_ms(raw)} | "
            f"{ratio} | {_ms(r.get('epctx_cold'))} | {_ms(compile_)} | {_ms(r.get('ort'))} | {_ms(base)} | "
            f"{f'{warm / base:.2f}' if warm and base else '-'} | {_ms(r.get('base_cold'))} | {', '.join(verdict)} |"
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
    parser.add_argument("--modes", default=",".join(MODES), help=f"columns to measure, of {','.join(MODES)}")
    parser.add_argument("--baseline", type=Path, help="another epctx checkout to compare with (paired)")
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: children's CPU time (a loaded machine)"
    )
    args = parser.parse_args(argv)
    CLOCK["clock"] = args.clock
    modes = set(args.modes.split(","))
    if unknown := modes - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}; choose among {','.join(MODES)}")
    if args.baseline is not None and not (args.baseline / "src" / "epctx").is_dir():
        parser.error(f"--baseline {args.baseline} is not an epctx checkout (no src/epctx)")
    compile_bytecode()
    if args.baseline is not None:
        compile_bytecode(args.baseline / "src")
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
                rows.append(bench(name, ep, args.runs, Path(tmp), modes, args.baseline))
                print(report(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peak memory of generating an OpenVINO context model, against raw OpenVINO compiling and exporting the same.

Results (2-core dev VM, OpenVINO 2026.4, f32 ``chain_<n>x4096``; peak RSS / weight bytes, fresh processes;
"before" = ``--src`` of the tree before the copies were removed):

    layout / weights                       raw   raw_cache  epctx0 before -> after  epctx1 before -> after  example before -> after
    embedded, 537 MB                       3.34  2.21       5.37 -> 2.37            4.24 -> 3.24            2.29 -> 2.29
    external data, 537 MB                  3.34  2.21       4.37 -> 2.37            3.24 -> 2.37            1.17 -> 0.18
    external data, 2.28 GB (34 layers)     3.08  2.05       (~9.8 GB: not run) 2.09 3.06 -> 2.09            1.04 -> 0.04

    python benchmarks/bench_openvino_memory.py [--external] [--src /tmp/src_before]
    python benchmarks/bench_openvino_memory.py --mb 2250 --modes raw,raw_cache,epctx0,epctx1,example

``epctx0`` / ``epctx1`` are within 0.04-0.16 of the weights above ``raw_cache`` (OpenVINO's own blob writer)
and below ``raw`` (``export_model()`` into memory); what is left is OpenVINO's export buffering and the loaded
model's own copy where the weights are embedded (``epctx1``, embedded: the source arrays, the temporary
weights file OpenVINO maps and its repacked copy).

    python benchmarks/bench_openvino_memory.py [--mb 540] [--modes raw,raw_cache,epctx0,epctx1] [--json PATH]
                                               [--src FOLDER] [--external]

The model is a chain of ``MatMul`` (weights ``hidden x hidden``, random float32) and ``Relu`` with about
``--mb`` MB of weights, built with ``onnx.helper`` and saved once under ``--work`` (weights embedded below
2 GB, external data above, or with ``--external``). Each mode runs in a fresh process, which imports
everything first (``base``: its RSS then), runs the work once and reports its peak RSS (anonymous,
file-backed and shared pages mapped by the process): ``VmHWM``, which is ``ru_maxrss`` of the process image
(Linux carries the RSS of the forked parent at ``exec`` into ``ru_maxrss``; so the parent stays small too:
it builds the model in a subprocess of its own):

- ``raw``: raw OpenVINO ``read_model`` + ``compile_model`` (f32) + ``export_model()`` written to a file;
- ``raw_cache``: raw OpenVINO ``compile_model`` with ``CACHE_DIR`` (OpenVINO streams the blob to a file
  itself: no Python bytes);
- ``raw1``: as ``raw``, weightless (``CACHE_MODE=OPTIMIZE_SIZE``);
- ``epctx0`` / ``epctx1``: an epctx session from the .onnx with ``ep.context_enable=1`` and the OpenVINO EP
  with ``weightless=0`` / ``1`` (compile + write ``model_ctx.onnx`` and the ``.bin``);
- ``example``: the same with the Example EP (``ExampleExecutionProvider``, pure numpy), for comparison.

Columns: ``peak/W`` = peak RSS / weight bytes; ``(peak-base)/W`` = what the work added, over the weights.
``--src`` runs epctx from another source tree (e.g. a copy of ``src`` taken before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EP = "OpenVINOExecutionProvider"
MODES = ("raw", "raw_cache", "raw1", "epctx0", "epctx1", "example")
HIDDEN = 4096

_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time
    mode, model_path, out = sys.argv[1], sys.argv[2], sys.argv[3]

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    import numpy, onnx, onnx_ir, openvino as ov  # noqa: F401
    import epctx, epctx.providers.openvino, epctx.session.inference  # noqa: F401
    core = ov.Core()
    base = status("VmRSS")
    start = time.perf_counter()
    F32 = {"INFERENCE_PRECISION_HINT": "f32"}
    if mode in ("raw", "raw1"):
        config = dict(F32, CACHE_MODE="OPTIMIZE_SIZE") if mode == "raw1" else F32
        model = core.read_model(model_path)
        compiled = core.compile_model(model, "CPU", config)
        with open(os.path.join(out, "model.blob"), "wb") as fh:
            fh.write(compiled.export_model().getbuffer())  # a BytesIO in OpenVINO 2026
    elif mode == "raw_cache":
        model = core.read_model(model_path)
        compiled = core.compile_model(model, "CPU", dict(F32, CACHE_DIR=os.path.join(out, "cache")))
    else:
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", os.path.join(out, "model_ctx.onnx"))
        if mode == "example":
            providers = ["ExampleExecutionProvider"]
        else:
            providers = [("OpenVINOExecutionProvider", {"weightless": "1" if mode == "epctx1" else "0"})]
        epctx.InferenceSession(model_path, so, providers=providers)
    seconds = time.perf_counter() - start
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"base": base, "peak": status("VmHWM"), "maxrss": maxrss, "seconds": seconds}))
    """
)


def build_model(folder: Path, mb: int, external: bool) -> tuple[Path, int]:
    """The MatMul/Relu chain with about ``mb`` MB of weights, saved once (cached by size)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    layers = max(1, round(mb * 1e6 / (HIDDEN * HIDDEN * 4)))
    weights = layers * HIDDEN * HIDDEN * 4
    external = external or weights >= 2**31 - 2**26
    path = folder / f"chain_{layers}x{HIDDEN}{'_ext' if external else ''}.onnx"
    if path.exists():
        return path, weights
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        w = (rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) / HIDDEN**0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"W{k}"))
        nodes.append(helper.make_node("MatMul", [x, f"W{k}"], [f"h{k}"]))
        y = "y" if k == layers - 1 else f"r{k}"
        nodes.append(helper.make_node("Relu", [f"h{k}"], [y]))
        x = y
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    tmp = folder / f".{path.name}.tmp"
    if external:
        onnx.save(model, tmp, save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(model, tmp)
    os.replace(tmp, path)
    return path, weights


def measure(mode: str, model: Path, src: Path | None) -> dict[str, Any]:
    paths = [str(src)] if src is not None else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, str(ROOT / "src"), str(ROOT)]))
    with tempfile.TemporaryDirectory(prefix="bench-ov-mem-", dir=model.parent) as out:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, mode, str(model), out],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{done.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["files"] = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file())
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--build"]:
        path, weights = build_model(Path(argv[1]), int(argv[2]), argv[3] == "1")
        print(path.name, weights)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=540, help="weights, MB (default 540: 8 layers)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "epctx-bench-ov-mem")
    parser.add_argument("--src", type=Path, default=None, help="epctx source tree to measure")
    parser.add_argument("--external", action="store_true", help="weights as external data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--clean", action="store_true", help="remove the model afterwards")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {list(MODES)}")
    args.work.mkdir(parents=True, exist_ok=True)
    built = subprocess.run(
        [sys.executable, __file__, "--build", str(args.work), str(args.mb), str(int(args.external))],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    name, size = built.stdout.split()
    model, weights = args.work / name, int(size)
    rows = []
    print(f"model {model.name}: {weights / 1e6:.0f} MB of weights; src {args.src or ROOT / 'src'}")
    print(
        f"{'mode':<10} {'peak MB':>9} {'base MB':>8} {'peak/W':>7} {'(peak-base)/W':>14} {'s':>6} {'maxrss/W':>9}"
    )
    for mode in modes:
        r = measure(mode, model, args.src)
        r.update(mode=mode, weights=weights)
        rows.append(r)
        print(
            f"{mode:<10} {r['peak'] / 1e6:>9.0f} {r['base'] / 1e6:>8.0f} {r['peak'] / weights:>7.2f} "
            f"{(r['peak'] - r['base']) / weights:>14.2f} {r['seconds']:>6.1f} {r['maxrss'] / weights:>9.2f}",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.clean:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()

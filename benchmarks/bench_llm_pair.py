"""The LLM prefill / decode pair of ``benchmarks/bench_iree.py``: its files, and disk and resident memory of the
two sessions with and without weight sharing, against onnxruntime and epctx's OpenVINO EP.

The pair is ``benchmarks/llm_pair.py``'s random-init Llama (``--size``), exported with torch in a child
process. Made ready four ways, the first three compiled each in a child process:

- ``shared``: IREE, both models in one process with ``ep.share_ep_contexts`` (one weights file);
- ``separate``: IREE, each model alone (a weights file each);
- ``openvino``: epctx's OpenVINO EP with ``ep.share_ep_contexts``;
- ``ort_shared``: for onnxruntime's own way of sharing, the two models with their weights as external data in one
  file, each distinct weight once (``weights.bin``, ``index.json``): both sessions get them with
  ``SessionOptions.add_initializer`` as OrtValues over one ``np.memmap`` of that file, prepacking off
  (``session.disable_prepacking=1``; with prepacking on, onnxruntime packs its own copy of each MatMul weight).

Memory, each in a fresh process: import everything (``base`` = VmRSS then), create both sessions, run the
prefill over a prompt and one decode step (so every weight is read), then VmRSS again; the column is
(VmRSS - base) / the bytes of one set of weights. onnxruntime runs the two ``.onnx`` files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.processes import child_env

ROOT = Path(__file__).resolve().parents[1]
IREE, OPENVINO = "IREEExecutionProvider", "OpenVINOExecutionProvider"
PROMPT = 32

__all__ = ["Pair", "memory_rows", "memory_table", "prepare"]


@dataclass
class Pair:
    folder: Path
    size: str
    weight_bytes: int = 0
    compile_s: dict[str, float] = field(default_factory=dict)  # way -> seconds to compile both
    feeds: dict[str, Path] = field(default_factory=dict)  # "prefill" / "decode" -> .npz

    def source(self, model: str) -> Path:
        return self.folder / f"{model}.onnx"

    def context(self, way: str, model: str) -> Path:
        return self.folder / way / f"{model}_ctx.onnx"


def _run(args: list[str]) -> str:
    done = subprocess.run(args, env=child_env(), capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"child {args[1:3]} failed:\n{done.stderr[-3000:]}")
    return done.stdout


_COMPILE = """
import json, shutil, sys, time
import epctx
folder, ep, share = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
t = time.perf_counter()
for k, model in enumerate(("prefill", "decode")):
    shutil.copy(f"{folder}/../{model}.onnx", folder)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    if share:
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        so.add_session_config_entry("ep.stop_share_ep_contexts", str(k))
    epctx.InferenceSession(f"{folder}/{model}.onnx", so, providers=[ep])
print(json.dumps(time.perf_counter() - t))
"""


def prepare(folder: Path, size: str) -> Pair:
    """Export the pair, make its feeds (the decode step's past is onnxruntime's prefill output) and compile it
    the three ways."""
    import onnx
    import onnxruntime as ort

    from benchmarks.llm_pair import SIZES, decode_feeds, prefill_feeds

    folder.mkdir(parents=True)
    _run([sys.executable, str(ROOT / "benchmarks" / "llm_pair.py"), str(folder), "--size", size])
    pair = Pair(folder, size)
    model = onnx.load(pair.source("prefill"))
    pair.weight_bytes = sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    config = SIZES[size]
    prefill = prefill_feeds(config, PROMPT)
    outputs = ort.InferenceSession(str(pair.source("prefill")), providers=["CPUExecutionProvider"]).run(
        None, prefill
    )
    decode = decode_feeds(config, outputs, int(np.argmax(outputs[0][0, -1])))
    for name, feed in (("prefill", prefill), ("decode", decode)):
        pair.feeds[name] = folder / f"{name}_feed.npz"
        np.savez(pair.feeds[name], **feed)
    for way, ep, share in (("shared", IREE, "1"), ("separate", IREE, "0"), ("openvino", OPENVINO, "1")):
        (folder / way).mkdir()
        t = time.perf_counter()
        _run([sys.executable, "-c", _COMPILE, str(folder / way), ep, share])
        pair.compile_s[way] = time.perf_counter() - t
        for model_name in ("prefill", "decode"):  # the copies compiled from: not what a deployer ships
            (folder / way / f"{model_name}.onnx").unlink()
    _ort_shared(pair)
    return pair


def _ort_shared(pair: Pair) -> None:
    """``ort_shared/``: both models with their weights (>= 1 KiB) as external data in one ``weights.bin`` holding
    each distinct weight once, 64-byte aligned, and ``index.json``: model -> [[name, offset, dtype, shape]]."""
    import hashlib

    import onnx

    folder = pair.folder / "ort_shared"
    folder.mkdir()
    offsets: dict[str, int] = {}
    index: dict[str, list[Any]] = {}
    with open(folder / "weights.bin", "wb") as out:
        for name in ("prefill", "decode"):
            model = onnx.load(pair.source(name))
            index[name] = []
            for tensor in model.graph.initializer:
                array = onnx.numpy_helper.to_array(tensor)
                if array.nbytes < 1024:
                    continue
                data = np.ascontiguousarray(array).tobytes()
                digest = hashlib.sha256(data).hexdigest()
                if digest not in offsets:
                    out.write(b"\0" * (-out.tell() % 64))
                    offsets[digest] = out.tell()
                    out.write(data)
                index[name].append([tensor.name, offsets[digest], array.dtype.str, list(array.shape)])
                for field_name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                    tensor.ClearField(field_name)
                del tensor.external_data[:]
                for key, value in (
                    ("location", "weights.bin"),
                    ("offset", offsets[digest]),
                    ("length", len(data)),
                ):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, str(value)
                tensor.data_location = onnx.TensorProto.EXTERNAL
            onnx.save(model, folder / f"{name}.onnx")
    (folder / "index.json").write_text(json.dumps(index))


_MEMORY = """
import json, sys, time
import numpy as np
{imports}
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
paths, share, feeds = {paths!r}, {share!r}, {feeds!r}
prefill_feed, decode_feed = (dict(np.load(f)) for f in feeds)
base = rss()
t = time.perf_counter()
sessions = [make(k, p) for k, p in enumerate(paths)]
created = time.perf_counter() - t
prefill = sessions[0].run(None, prefill_feed)
decode = sessions[1].run(None, decode_feed)
print(json.dumps({{"base": base, "rss": rss(), "created": created}}))
"""

_EPCTX = """import epctx
def make(k, path):
    so = epctx.SessionOptions()
    if share:
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        so.add_session_config_entry("ep.stop_share_ep_contexts", str(k))
    return epctx.InferenceSession(path, so, providers=[{ep!r}])
import epctx.session.inference, epctx.session.lean, epctx.providers.{module}.provider"""

_ORT = """import onnxruntime as ort
def make(k, path):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])"""

_ORT_SHARED = """import json, os
import onnxruntime as ort
values = {}
def make(k, path):
    folder = os.path.dirname(path)
    weights = np.memmap(os.path.join(folder, "weights.bin"), dtype=np.uint8, mode="r")
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    index = json.load(open(os.path.join(folder, "index.json")))
    for name, offset, dtype, shape in index[os.path.basename(path)[: -len(".onnx")]]:
        key = (offset, dtype, tuple(shape))
        if key not in values:
            array = np.ndarray(shape, dtype=dtype, buffer=weights, offset=offset)
            values[key] = ort.OrtValue.ortvalue_from_numpy(array)
        so.add_initializer(name, values[key])
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])"""


def _disk(pair: Pair, way: str) -> int:
    return sum(p.stat().st_size for p in (pair.folder / way).iterdir() if p.is_file())


def _code_bytes(pair: Pair) -> int:
    """The IREE modules (code) of the shared binary."""
    from epctx.epcontext.container import ContextBinary

    (binary,) = (pair.folder / "shared").glob("*.bin")
    with ContextBinary.open(binary) as opened:
        return sum(opened.entry(n).size for n in opened.names() if n.endswith("/module"))


def memory_rows(pair: Pair, runs: int) -> list[dict[str, Any]]:
    feeds = [str(pair.feeds["prefill"]), str(pair.feeds["decode"])]
    ways: list[tuple[str, str, list[str], bool]] = [
        ("epctx IREE, shared", _EPCTX.format(ep=IREE, module="iree"),
         [str(pair.context("shared", m)) for m in ("prefill", "decode")], True),
        ("epctx IREE, not shared", _EPCTX.format(ep=IREE, module="iree"),
         [str(pair.context("separate", m)) for m in ("prefill", "decode")], False),
        ("epctx OpenVINO, shared", _EPCTX.format(ep=OPENVINO, module="openvino"),
         [str(pair.context("openvino", m)) for m in ("prefill", "decode")], True),
        ("onnxruntime CPU", _ORT, [str(pair.source(m)) for m in ("prefill", "decode")], False),
        ("onnxruntime CPU, shared initializers", _ORT_SHARED,
         [str(pair.folder / "ort_shared" / f"{m}.onnx") for m in ("prefill", "decode")], False),
    ]  # fmt: skip
    code = _code_bytes(pair)
    disks = {
        "epctx IREE, shared": _disk(pair, "shared"),
        "epctx IREE, not shared": _disk(pair, "separate"),
        "epctx OpenVINO, shared": _disk(pair, "openvino"),
        "onnxruntime CPU": pair.source("prefill").stat().st_size + pair.source("decode").stat().st_size,
        "onnxruntime CPU, shared initializers": _disk(pair, "ort_shared"),
    }
    rows = []
    for label, imports, paths, share in ways:
        code_text = _MEMORY.format(imports=imports, paths=paths, share=share, feeds=feeds)
        results = [
            json.loads(_run([sys.executable, "-c", code_text]).strip().splitlines()[-1]) for _ in range(runs)
        ]
        added = sorted(r["rss"] - r["base"] for r in results)[len(results) // 2]
        rows.append({
            "runtime": label,
            "disk_bytes": disks[label],
            "disk_ratio": disks[label] / (pair.weight_bytes + code),
            "rss_added_bytes": added,
            "rss_ratio": added / pair.weight_bytes,
            "created_s": sorted(r["created"] for r in results)[len(results) // 2],
        })  # fmt: skip
    return rows


def memory_table(pair: Pair, rows: list[dict[str, Any]]) -> str:
    code = _code_bytes(pair)
    lines = [
        f"LLM pair ({pair.size}): one weights file {pair.weight_bytes / 1e6:.1f} MB, IREE code {code / 1e6:.2f} MB "
        f"(both modules); compile both: shared {pair.compile_s['shared']:.1f} s, "
        f"separate {pair.compile_s['separate']:.1f} s, OpenVINO {pair.compile_s['openvino']:.1f} s",
        "",
        "| runtime | disk | disk / (weights + code) | resident added, both sessions | resident / weights | "
        "both sessions created |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['runtime']} | {r['disk_bytes'] / 1e6:.1f} MB | {r['disk_ratio']:.3f} | "
            f"{r['rss_added_bytes'] / 1e6:.1f} MB | {r['rss_ratio']:.2f} | {r['created_s'] * 1e3:.0f} ms |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    os.execv(sys.executable, [sys.executable, str(ROOT / "benchmarks" / "bench_iree.py"), "--models", "llm"])

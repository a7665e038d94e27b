"""How long a compatibility verdict takes on a large context model, against onnxruntime reading the same string.

The LLM pair's prefill (``llm_pair.py``, 126 MB of weights at ``--size bench``) is compiled by IREE twice: the
binary beside the model (embed mode 0: a small ``_ctx.onnx`` + a 126 MB ``.bin``) and inside it (embed mode 1:
a 126 MB ``_ctx.onnx``). Then, in this process (files in the page cache), the median of ``--repeat`` runs of:

- ``info``: ``epctx.get_compatibility_info_from_model`` | onnxruntime's (``onnxruntime.capi._pybind_state``);
- ``verdict``: ``get_model_compatibility_for_ep_devices`` on the IREE EP's devices here (the string only);
- ``check``: ``epctx.cache.verdicts.check_model``: metadata, EPContext nodes, every binary header, per device.

Target: the verdict <= 5 ms. Run: python benchmarks/bench_verdict.py [--size tiny|bench] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import epctx

EP = "IREEExecutionProvider"


def _compile(source: Path, embed: int) -> Path:
    folder = source.parent / f"embed{embed}"
    folder.mkdir()
    target = folder / source.name
    target.write_bytes(source.read_bytes())
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", str(embed))
    epctx.InferenceSession(str(target), so, providers=[EP])
    return folder / f"{source.stem}_ctx.onnx"


def _median_ms(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(first call ms, median of ``repeat`` more ms)."""
    started = time.perf_counter()
    call()
    first = (time.perf_counter() - started) * 1e3
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return first, statistics.median(times)


def _row(ctx: Path, devices: list[epctx.OrtEpDevice], repeat: int) -> list[str]:
    import onnxruntime.capi._pybind_state as ort_capi

    from epctx.cache.verdicts import check_model

    binaries = [p for p in ctx.parent.iterdir() if p.suffix == ".bin"]
    info = epctx.get_compatibility_info_from_model(ctx, EP) or ""
    assert info == ort_capi.get_compatibility_info_from_model(str(ctx), EP)
    ours = _median_ms(lambda: epctx.get_compatibility_info_from_model(ctx, EP), repeat)
    theirs = _median_ms(lambda: ort_capi.get_compatibility_info_from_model(str(ctx), EP), repeat)
    verdict = _median_ms(lambda: epctx.get_model_compatibility_for_ep_devices(devices, info), repeat)
    check = _median_ms(lambda: check_model(ctx, EP), repeat)
    return [
        f"{ctx.stat().st_size / 1e6:.1f}",
        f"{sum(p.stat().st_size for p in binaries) / 1e6:.1f}",
        *(f"{m:.3f} ({f:.2f})" for f, m in (ours, theirs, verdict, check)),
        check_model(ctx, EP).status.name,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="bench", choices=["tiny", "bench"])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    from benchmarks.llm_pair import export_pair

    with tempfile.TemporaryDirectory() as tmp:
        prefill, _ = export_pair(tmp, args.size)
        devices = [d for d in epctx.get_ep_devices() if d.ep_name == EP]
        print(f"LLM pair prefill ({args.size}), IREE {EP}; median of {args.repeat} (first call) in ms")
        print("embed | model MB | binary MB | epctx info | onnxruntime info | verdict | check | status")
        for embed in (0, 1):
            ctx = _compile(prefill, embed)
            print(" | ".join([str(embed), *_row(ctx, devices, args.repeat)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

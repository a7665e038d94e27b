"""The context fuzzer's byte mutations applied to a backend's payload (an IREE module, an OpenVINO blob) with
every checksum and identity recomputed by epctx's writer, each load + run in a fresh process; prints how many
cases failed typed, ran, crashed (by signal, and whether at session creation or at run) or hung (issue 20,
docs/trust.md "Untrusted input without a policy").

    python benchmarks/fuzz_payloads.py --ep IREEExecutionProvider --regions structure,truncate,elf --cases 100
    python benchmarks/fuzz_payloads.py --ep OpenVINOExecutionProvider --regions blob,truncate --model M.onnx

Regions: ``tests/trust/payload_fuzz.py``. The model is the tests' two-MatMul MLP unless ``--model`` names one
(compiled whole for the EP; inputs are zeros)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx
from tests.epcontext.models import whole_model
from tests.trust.payload_fuzz import run_case

import epctx


def _context(folder: Path, ep: str, model: str | None) -> Path:
    folder.mkdir(parents=True)
    if model:
        shutil.copyfile(model, folder / "model.onnx")
    else:
        onnx.save(whole_model(), folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    epctx.InferenceSession(str(folder / "model.onnx"), so, providers=[ep])
    (folder / "model.onnx").unlink()
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ep", default="IREEExecutionProvider")
    parser.add_argument("--regions", default="structure,truncate")
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--model")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as a hang")
    args = parser.parse_args()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        base = _context(Path(tmp) / "base", args.ep, args.model)
        for region in args.regions.split(","):
            counts: Counter[str] = Counter()
            for seed in range(args.cases):
                case = run_case(base, Path(tmp), region, seed, env, ep=args.ep, timeout=args.timeout)
                counts[case.outcome if case.outcome != "crash" else f"crash ({case.detail})"] += 1
                if case.outcome not in ("typed", "runs"):
                    print(f"  {region} seed {seed}: {case.what}: {case.outcome} {case.detail}", flush=True)
            print(f"{args.ep} {region}: {args.cases} cases: {dict(sorted(counts.items()))}", flush=True)


if __name__ == "__main__":
    main()

"""In-process creation of a session over a context model on the lean path (issue 17's "as fast as today").

    PYTHONPATH=src python benchmarks/bench_lean_session.py [--runs 300]

Compiles the test suite's whole model for the Example EP (embed mode 0 and 1) and, when available, the IREE
EP into a temporary folder, checks that the lean reader takes each context model, then prints the best of
``--runs`` ``InferenceSession`` creations (a tenth as many for IREE). Run it on two trees in turn (e.g. a
``git archive`` of main and this branch) and compare: best-of-N, so the machine's noise shows less.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import timeit
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx
from tests.epcontext.models import EXAMPLE, whole_model

import epctx
from epctx.model.lean import read_context_model

IREE = "IREEExecutionProvider"


def _context_model(ep: str, folder: Path, embed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "model.onnx"
    onnx.save(whole_model(), source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", str(embed))
    epctx.InferenceSession(str(source), so, providers=[ep])
    return folder / "model_ctx.onnx"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases = {
            "example_embed0": (_context_model(EXAMPLE, root / "e0", 0), EXAMPLE),
            "example_embed1": (_context_model(EXAMPLE, root / "e1", 1), EXAMPLE),
        }
        if IREE in epctx.get_available_providers():
            cases["iree"] = (_context_model(IREE, root / "iree", 0), IREE)
        for name, (path, ep) in cases.items():
            if read_context_model(path.read_bytes()) is None:
                raise SystemExit(f"{name}: the lean reader declines {path}")
            epctx.InferenceSession(str(path), providers=[ep])  # warm: imports, the EP's backend
            runs = args.runs if ep == EXAMPLE else max(20, args.runs // 10)
            create = functools.partial(epctx.InferenceSession, str(path), providers=[ep])
            times = timeit.repeat(create, number=1, repeat=runs)
            print(f"{name}: best of {runs}: {min(times) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

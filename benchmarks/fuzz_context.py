"""Fuzz context models: mutate what the example EP generates, load and run each, count the outcomes.

    python benchmarks/fuzz_context.py [--count N] [--start SEED] [--show K]

Outcomes (see tests/epcontext/context_fuzz.py): typed (an epctx error), correct (same output as the unmutated
model), wrong (another output although the mutation touched checked data: a defect), uncovered (another
output, the mutation touched a CPU node or its initializer in the .onnx, which no checksum covers), untyped
(any other exception: a defect). Prints a table per mutation and the first K defects; exits 1 if any.
A case that runs longer than --hang-s seconds dumps every thread's stack and exits (a hang is a defect).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.epcontext.context_fuzz import ContextFuzzer, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=10_000, help="number of cases (default 10000)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--show", type=int, default=20, help="defects to print (default 20)")
    parser.add_argument("--hang-s", type=float, default=60.0, help="seconds before a case counts as hung")
    args = parser.parse_args(argv)
    # Mutated attributes make onnx-ir warn about every non-UTF-8 string; the table is what matters here.
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="epctx_fuzz_") as tmp:
        fuzzer = ContextFuzzer(Path(tmp))
        results = []
        started = time.perf_counter()
        for seed in range(args.start, args.start + args.count):
            faulthandler.dump_traceback_later(args.hang_s, exit=True)
            results.append(fuzzer.run_case(seed))
        faulthandler.cancel_dump_traceback_later()
        elapsed = time.perf_counter() - started
    print(f"context-model fuzz: {len(results)} cases, seeds {args.start}..{args.start + args.count - 1}, "
          f"{elapsed:.1f} s ({elapsed / max(len(results), 1) * 1000:.2f} ms a case)")  # fmt: skip
    print(summarize(results))
    defects = [r for r in results if r.outcome in ("wrong", "untyped")]
    for r in defects[: args.show]:
        print(f"  {r.outcome}: seed {r.seed} ({r.mutation}, embed {r.embed}): {r.detail}")
    uncovered = [r for r in results if r.outcome == "uncovered"]
    if uncovered:
        print(f"uncovered ({len(uncovered)}): another output after a mutation of CPU-node data in the .onnx, "
              f"e.g. seed {uncovered[0].seed}: {uncovered[0].detail}")  # fmt: skip
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())

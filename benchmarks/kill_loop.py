"""Kill generation at random moments and check what is left: the previous complete state or the new one,
never a loadable mixture.

A child process regenerates context models in a loop, alternating between two sets of source models (other
weights, same names), with the example EP: ``single`` overwrites one context model (``ModelCompiler.
compile_to_file``, CPU-fallback weights in an external file), ``group`` overwrites a weight-sharing group of two
models (one shared binary), ``fresh`` writes one context model into a folder emptied before each generation. The parent kills it with SIGKILL at a random moment of a generation, then loads
every context model present in a fresh session and compares its output with both sets' onnxruntime outputs.

    python benchmarks/kill_loop.py --mode group --kills 200

Outcomes per kill: ``ok`` (every model present loads and matches one set), ``absent`` (no model yet),
``wrong`` (loads, matches neither set), ``error`` (a model present does not load). Only ``ok`` and ``absent``
are acceptable.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
_CHILD = """
import sys
from pathlib import Path
import epctx
from benchmarks.kill_loop import generate
folder, mode = Path(sys.argv[1]), sys.argv[2]
generate(folder, mode, 0)
print("ready", flush=True)
i = 1
while True:
    generate(folder, mode, i % 2)
    i += 1
"""

EP = "ExampleExecutionProvider"
MODELS = 2  # models in a group


def _source(folder: Path, variant: int, k: int) -> Path:
    return folder / "sources" / f"v{variant}_m{k}.onnx"


def prepare(folder: Path) -> dict[tuple[int, int], np.ndarray]:
    """Source models of both variants and their onnxruntime outputs, by (variant, model)."""
    import onnxruntime as ort
    from tests.epcontext.models import feed, two_partition_model

    (folder / "sources").mkdir(parents=True, exist_ok=True)
    expected = {}
    for variant in (0, 1):
        for k in range(MODELS):
            model = two_partition_model(seed=10 * variant + k)
            onnx.save(model, _source(folder, variant, k))
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            expected[variant, k] = sess.run(None, feed())[0]
    return expected


def generate(folder: Path, mode: str, variant: int) -> None:
    """One generation of ``mode`` from the sources of ``variant`` (the child's loop body)."""
    import epctx

    count = MODELS if mode == "group" else 1
    if mode == "fresh":  # a first generation every time: nothing of an earlier one is there
        # The model first: a kill while emptying the folder must not leave a model without its files.
        for path in sorted(folder.iterdir(), key=lambda p: not p.name.endswith(".onnx")):
            if path.is_file():
                path.unlink()
    for k in range(count):
        so = epctx.SessionOptions()
        so.add_provider(EP, {})
        kwargs = {}
        if mode != "group":
            kwargs = dict(
                external_initializers_file_path="cpu_weights.bin", external_initializers_size_threshold=0
            )
        else:
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            if k == count - 1:
                so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        compiler = epctx.ModelCompiler(so, str(_source(folder, variant, k)), **kwargs)  # type: ignore[arg-type]
        compiler.compile_to_file(str(folder / f"m{k}_ctx.onnx"))


def check(folder: Path, mode: str, expected: dict[tuple[int, int], np.ndarray]) -> str:
    """The outcome of the state left in ``folder`` (see the module doc)."""
    from tests.epcontext.models import feed

    import epctx

    present = [k for k in range(MODELS if mode == "group" else 1) if (folder / f"m{k}_ctx.onnx").exists()]
    if not present:
        return "absent"
    for k in present:
        try:
            out = epctx.InferenceSession(str(folder / f"m{k}_ctx.onnx"), providers=[EP]).run(None, feed())[0]
        except Exception as exc:
            print(f"  m{k}_ctx.onnx does not load: {type(exc).__name__}: {exc}", file=sys.stderr)
            return "error"
        if not any(np.allclose(out, expected[v, k], atol=1e-5) for v in (0, 1)):
            return "wrong"
    return "ok"


def kill_loop(folder: Path, mode: str, kills: int, seed: int = 0) -> collections.Counter[str]:
    expected = prepare(folder)
    rng = random.Random(seed)
    outcomes: collections.Counter[str] = collections.Counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(kills):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(folder), mode],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        ready = child.stdout.readline()  # the first generation is complete: the kill lands in a later one
        if ready.strip() != "ready":
            child.kill()
            raise RuntimeError(f"the generating child failed before its first generation (said {ready!r})")
        time.sleep(rng.uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
        child.wait()
        outcomes[check(folder, mode, expected)] += 1
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("single", "group", "fresh", "all"), default="all")
    parser.add_argument("--kills", type=int, default=100)
    args = parser.parse_args()
    bad = 0
    for mode in ("single", "group", "fresh") if args.mode == "all" else (args.mode,):
        with tempfile.TemporaryDirectory() as tmp:
            outcomes = kill_loop(Path(tmp), mode, args.kills)
            leftovers = sorted(p.name for p in Path(tmp).iterdir() if p.name.endswith(".tmp"))
        print(
            f"{mode}: {args.kills} kills -> {dict(sorted(outcomes.items()))}; temp files left now: {len(leftovers)}"
        )
        bad += outcomes["wrong"] + outcomes["error"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the test models live in tests/epcontext/models.py
    sys.exit(main())

"""What IREE's own module verification costs at load (issue 20, untrusted input without a policy).

    python benchmarks/bench_iree_module_verify.py [--mb 100] [--runs 21]

``iree.runtime.VmModule.wrap_buffer`` (what epctx's IREE load path calls, ``copy_buffer`` for unaligned bytes)
checks the module's archive header and FlatBuffer length prefix, runs the FlatBuffer verifier over the whole
``BytecodeModuleDef`` and IREE's bytecode verifier over every function, before it returns the module: that
call is the verification, and this measures it on two modules compiled here: ``small`` (one elementwise
function) and ``big`` (the same with a ``--mb`` MB constant as module rodata). Each module is mapped from its
file as epctx maps a binary; ``first`` is the first call in a fresh process, ``warm`` the median (and minimum)
of ``--runs`` calls in that process."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_SMALL = """
func.func @f(%i: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.addf %i, %i : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""

_BIG = """
func.func @f(%i: tensor<4xf32>) -> tensor<4xf32> {{
  %c = arith.constant dense_resource<w> : tensor<{n}xf32>
  %s = tensor.extract_slice %c[7] [4] [1] : tensor<{n}xf32> to tensor<4xf32>
  %r = arith.addf %i, %s : tensor<4xf32>
  return %r : tensor<4xf32>
}}
{{-#
  dialect_resources: {{ builtin: {{ w: "0x04000000{hex}" }} }}
#-}}
"""

_CHILD = """
import json, mmap, sys, time
import iree.runtime as rt
instance = rt.VmInstance()
with open(sys.argv[1], "rb") as fh:
    view = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
times = []
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    module = rt.VmModule.wrap_buffer(instance, view)
    times.append(time.perf_counter() - start)
    del module
print(json.dumps(times))
"""


def _compile(mlir: str, out: Path) -> Path:
    from iree.compiler import compile_str

    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]
    out.write_bytes(compile_str(mlir, extra_args=[*flags, "--iree-llvmcpu-target-cpu=host"]))
    return out


def _measure(path: Path, runs: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(runs)], capture_output=True, text=True
    )
    proc.check_returncode()
    times = [t * 1e3 for t in json.loads(proc.stdout)]
    warm = sorted(times[1:])
    return {
        "MB": path.stat().st_size / 1e6,
        "first_ms": times[0],
        "warm_ms": warm[len(warm) // 2],
        "min_ms": warm[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        n = int(args.mb * 1e6 / 4)
        weights = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        modules = {
            "small": _compile(_SMALL, Path(tmp) / "small.vmfb"),
            "big": _compile(_BIG.format(n=n, hex=weights.tobytes().hex().upper()), Path(tmp) / "big.vmfb"),
        }
        for name, path in modules.items():
            r = _measure(path, args.runs)
            print(
                f"{name:6s} {r['MB']:9.3f} MB  first {r['first_ms']:.3f} ms  warm {r['warm_ms']:.4f} ms"
                f" (min {r['min_ms']:.4f})"
            )


if __name__ == "__main__":
    main()

"""Context binary container benchmark: write speed, open cost, and what checksum verification adds to a load.

    python benchmarks/bench_container.py [--sizes 10,50,200] [--rounds 15] [--checksum xxh3_64] [--candidates]

For each payload size (MB, one float32 weights entry, file in the page cache):
- write MB/s: ContextBinaryWriter.write (checksum, streaming, fsync, atomic rename);
- open+read (no verify): ContextBinary.open + the entry's view without its checksum (mmap, header parse);
- warm load: open + np.frombuffer + one pass over the bytes (``max``), the least a backend import does;
- verify: what the first (verified) read adds to that warm load, and that as a % of it.
Rounds alternate the variants so load changes on a shared machine hit all of them; medians are printed.
``--candidates`` also measures checksum algorithms the same way (the numbers in container.py's docstring).
A last line shows lazy verification: a binary holding 10 graphs, of which one session reads one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable

import numpy as np
import xxhash

if __package__ in (None, ""):  # run as a script: make `epctx` importable from a checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from epctx.epcontext import ContextBinary, ContextBinaryWriter

MB = 1 << 20


def _payload(size_mb: float) -> np.ndarray:
    count = int(size_mb * MB) // 4
    return np.random.default_rng(0).standard_normal(count, dtype=np.float32)


def _write(path: str, data: np.ndarray, checksum: str) -> float:
    writer = ContextBinaryWriter(ep_name="BenchEP", sdk_version="1", hardware="cpu", checksum=checksum)
    writer.add("weights", data, kind="weights")
    start = time.perf_counter()
    writer.write(path)
    return time.perf_counter() - start


def _load(path: str, mode: str, extra: Callable[[memoryview], object] | None = None) -> float:
    """One load of the entry: 'open' (no pass), 'warm' (unverified + one pass), 'verified' (read + one pass),
    'extra' (unverified + ``extra`` over the bytes + one pass)."""
    start = time.perf_counter()
    cb = ContextBinary.open(path)
    if mode == "verified":
        view = cb.read("weights")
    else:
        info = cb.entry("weights")
        view = cb._buf[info.offset : info.offset + info.size]  # the entry's bytes without verification
    if extra is not None:
        extra(view)
    if mode != "open":
        np.frombuffer(view, np.uint8).max()
    elapsed = time.perf_counter() - start
    view.release()
    cb.close()
    return elapsed


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def bench_sizes(sizes: list[float], rounds: int, checksum: str) -> None:
    print(f"checksum {checksum}; medians of {rounds} interleaved rounds; file in the page cache\n")
    header = (
        f"{'payload':>9} | {'write MB/s':>10} | {'open+read (no verify) ms':>24} | {'warm load ms':>12} | "
        f"{'verify ms':>9} | {'verify % of warm load':>21}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="bench_container_") as tmp:
        for size in sizes:
            data = _payload(size)
            path = os.path.join(tmp, f"w{size}.bin")
            writes = [_write(path, data, checksum) for _ in range(3)]
            samples: dict[str, list[float]] = {"open": [], "warm": [], "verified": []}
            for _ in range(rounds):
                for mode, values in samples.items():
                    values.append(_load(path, mode))
            opened, warm, verified = (_median_ms(samples[m]) for m in ("open", "warm", "verified"))
            verify = verified - warm
            write_mbs = data.nbytes / MB / statistics.median(writes)
            print(
                f"{size:>6g} MB | {write_mbs:>10.0f} | {opened:>24.2f} | {warm:>12.2f} | "
                f"{verify:>9.2f} | {100 * verify / warm:>20.0f}%"
            )
            os.unlink(path)
        _bench_lazy(tmp, checksum, rounds)


def _bench_lazy(tmp: str, checksum: str, rounds: int) -> None:
    path = os.path.join(tmp, "shared.bin")
    writer = ContextBinaryWriter(ep_name="BenchEP", checksum=checksum)
    for i in range(10):
        writer.add(f"model{i}", _payload(20) + i)
    writer.write(path)
    one, everything = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        with ContextBinary.open(path) as cb:
            cb.read("model3")
        one.append(time.perf_counter() - start)
        start = time.perf_counter()
        with ContextBinary.open(path) as cb:
            cb.verify()
        everything.append(time.perf_counter() - start)
    print(
        f"\nshared binary, 10 graphs x 20 MB: open + read one graph {_median_ms(one):.2f} ms "
        f"(verifies 20 MB), open + verify all {_median_ms(everything):.2f} ms"
    )


CANDIDATES: dict[str, Callable[[memoryview], object]] = {
    "xxh3_64": xxhash.xxh3_64_intdigest,
    "crc32": zlib.crc32,
    "adler32": zlib.adler32,
    "sha256": lambda v: hashlib.sha256(v).digest(),
    "sha1": lambda v: hashlib.sha1(v).digest(),
    "md5": lambda v: hashlib.md5(v).digest(),
    "blake2b": lambda v: hashlib.blake2b(v).digest(),
    "numpy u64 sum": lambda v: np.frombuffer(v, np.uint64, count=v.nbytes // 8).sum(),
}


def bench_candidates(sizes: list[float], rounds: int) -> None:
    print(f"\nchecksum candidates: ms added to a warm load (% of it), medians of {rounds} interleaved rounds")
    print(f"{'payload':>9} | {'warm load':>9} | " + " | ".join(f"{name:>15}" for name in CANDIDATES))
    with tempfile.TemporaryDirectory(prefix="bench_container_") as tmp:
        for size in sizes:
            path = os.path.join(tmp, "c.bin")
            _write(path, _payload(size), "crc32")
            samples: dict[str, list[float]] = {"warm": [], **{name: [] for name in CANDIDATES}}
            for _ in range(rounds):
                samples["warm"].append(_load(path, "warm"))
                for name, fn in CANDIDATES.items():
                    samples[name].append(_load(path, "extra", fn))
            warm = _median_ms(samples["warm"])
            cells = []
            for name in CANDIDATES:
                added = _median_ms(samples[name]) - warm
                cells.append(f"{added:>+7.1f} ({100 * added / warm:>4.0f}%)")
            print(f"{size:>6g} MB | {warm:>6.1f} ms | " + " | ".join(cells))
            os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,50,200", help="payload sizes in MB, comma separated")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--checksum", default="xxh3_64", choices=["xxh3_64", "crc32"])
    parser.add_argument("--candidates", action="store_true", help="also compare checksum algorithms")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",") if s]
    bench_sizes(sizes, args.rounds, args.checksum)
    if args.candidates:
        bench_candidates(sizes, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

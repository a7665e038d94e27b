"""The compile farm's speedup against workers: jobs = 5 IREE targets x 4 models, built from scratch (empty job
cache) by the local pool with 1..N workers and, when Ray is installed, on a local Ray cluster of 1..N one-CPU
worker nodes (``ray.cluster_utils.Cluster``). Every run's package is checked byte-identical to the first.

    PYTHONPATH=src python benchmarks/bench_farm.py [--workers 1,2] [--no-ray] [--models chain,partial,...]

The models are epctx's conformance models (small, so the table takes minutes on a laptop); per job the time
splits into the worker's start (import + EP), the compile, and shipping the result back, which the printed
``per job`` columns show and ``docs/packages.md`` uses for its model of a 100-node build.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

from epctx.farm.executors import LocalPool, RayExecutor
from epctx.farm.run import build
from epctx.testing.conformance import models

TARGETS = ("host", "x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64")
MODELS = {
    "chain": lambda: models.chain(0),
    "chain_b": lambda: models.chain(3),
    "partial": lambda: models.partial(0),
    "second_stage": lambda: models.second_stage(5),
}


def write_spec(folder: Path, names: list[str]) -> Path:
    lines = []
    for name in names:
        onnx.save(MODELS[name](), folder / f"{name}.onnx")
        lines.append(f'[components.{name}]\nmodel = "{name}.onnx"\n')
    for target in TARGETS:
        lines.append(f'[[targets]]\nname = "iree-{target}"\nep = "IREEExecutionProvider"\n'
                     f'options = {{ target = "{target}" }}\n')  # fmt: skip
    spec = folder / "spec.toml"
    spec.write_text("\n".join(lines))
    return spec


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


Row = tuple[str, float, float, float, float, int]


def run(spec: Path, executor: object, label: str, reference: list[str]) -> Row:
    out = spec.parent / f"pkg-{label}"
    cache = spec.parent / f"jobs-{label}"
    start = time.perf_counter()
    report = build(spec, out, executor, cache=cache)  # type: ignore[arg-type]
    wall = time.perf_counter() - start
    found = digest(out)
    reference.append(found)
    assert found == reference[0], f"{label}: package differs from the first run's"
    per_job = statistics.median(r.seconds for r in report.rows)
    shipped = sum(r.size for r in report.rows)
    shutil.rmtree(out)
    shutil.rmtree(cache)
    return label, wall, per_job, sum(r.seconds for r in report.rows), report.assemble_seconds, shipped


def ray_rows(spec: Path, workers: list[int], reference: list[str]) -> list[Row]:
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print("ray is not installed: Ray rows skipped", file=sys.stderr)
        return []
    rows = []
    for n in workers:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(n):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            rows.append(run(spec, RayExecutor(cluster.address), f"ray-{n}", reference))
        finally:
            ray.shutdown()
            cluster.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    names = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as tmp:
        spec = write_spec(Path(tmp), names)
        reference: list[str] = []
        rows = [run(spec, LocalPool(n), f"local-{n}", reference) for n in workers]
        if not args.no_ray:
            rows += ray_rows(spec, workers, reference)
    jobs = len(names) * len(TARGETS)
    base = rows[0][1]
    print(f"{jobs} jobs ({len(names)} models x {len(TARGETS)} IREE targets); packages byte-identical: yes")
    head = f"{'executor':<10} {'wall s':>8} {'speedup':>8} {'job median s':>13} {'job sum s':>10} {'assemble s':>11}"
    print(head + f" {'results MB':>11}")
    for label, wall, per_job, total, assemble, shipped in rows:
        line = (
            f"{label:<10} {wall:>8.1f} {base / wall:>7.2f}x {per_job:>13.2f} {total:>10.1f} {assemble:>11.2f}"
        )
        print(line + f" {shipped / 1e6:>11.2f}")


if __name__ == "__main__":
    main()

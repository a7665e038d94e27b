"""A model of a large build (docs/packages.md, "A 100-node build"): a simulation of jobs on N nodes x c slots,
where every byte goes through the driver's link (sources out once per node that needs them, results back), with
Ray's per-job overhead and the assembly measured by bench_farm.py. Prints where the time goes.

    python benchmarks/farm_model.py [--nodes 100] [--models 50] [--targets 10] [--compile-s 60] [--source-mb 128]
"""

from __future__ import annotations

import argparse
import heapq


def simulate(
    nodes: int, slots: int, models: int, targets: int, compile_s: float, source_mb: float, code_mb: float,
    weightless: bool, link_gbs: float, overhead_s: float, hash_gbs: float,
) -> dict[str, float]:  # fmt: skip
    """Seconds: total and its parts. Jobs go model by model to the earliest free slot; a source crosses the link
    the first time a node needs it; results queue on the link as they finish."""
    result_mb = code_mb + (0.0 if weightless else source_mb)  # a binary holds its weights unless weightless
    free = [(0.0, n) for n in range(nodes) for _ in range(slots)]
    heapq.heapify(free)
    link = 0.0  # when the driver's link is next free
    have: set[tuple[int, int]] = set()
    shipped_in = shipped_out = 0.0
    done = []
    for m in range(models):
        for _ in range(targets):
            start, node = heapq.heappop(free)
            start += overhead_s
            if (m, node) not in have:
                have.add((m, node))
                link = max(link, start) + source_mb / 1e3 / link_gbs
                shipped_in += source_mb / 1e3 / link_gbs
                start = link
            end = start + compile_s
            heapq.heappush(free, (end, node))
            done.append(end)
    for end in sorted(done):  # results back, in finishing order
        link = max(link, end) + result_mb / 1e3 / link_gbs
        shipped_out += result_mb / 1e3 / link_gbs
    # the driver reads every result once (merging) and writes and hashes each component's asset: weights once
    distinct_gb = models * (source_mb + targets * code_mb) / 1e3
    assemble = (models * targets * result_mb / 1e3 + distinct_gb) / hash_gbs
    total = link + assemble
    jobs = models * targets
    return {
        "total": total,
        "compile (critical path)": -(-jobs // (nodes * slots)) * compile_s,
        "sources out (link)": shipped_in,
        "results back (link)": shipped_out,
        "scheduling": jobs * overhead_s / (nodes * slots),
        "assembly": assemble,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--slots", type=int, default=1, help="jobs at once per node")
    p.add_argument("--models", type=int, default=50)
    p.add_argument("--targets", type=int, default=10)
    p.add_argument("--compile-s", type=float, default=60.0)
    p.add_argument("--source-mb", type=float, default=128.0)
    p.add_argument("--code-mb", type=float, default=1.0, help="code per target (a result = weights + code)")
    p.add_argument(
        "--weightless", action="store_true", help="results carry code only (weights from the source)"
    )
    p.add_argument("--link-gbs", type=float, default=1.25, help="the driver's link, GB/s (10 Gb/s)")
    p.add_argument("--overhead-s", type=float, default=0.045, help="per job (bench_farm: Ray wall - job sum)")
    p.add_argument("--hash-gbs", type=float, default=1.0, help="sha256 + copy rate on the driver, GB/s")
    a = p.parse_args()
    parts = simulate(a.nodes, a.slots, a.models, a.targets, a.compile_s, a.source_mb, a.code_mb, a.weightless,
                     a.link_gbs, a.overhead_s, a.hash_gbs)  # fmt: skip
    one = a.models * a.targets * a.compile_s
    print(f"{a.models} models x {a.targets} targets on {a.nodes} nodes x {a.slots}: {parts['total']:.0f} s "
          f"(one slot: {one:.0f} s; speedup {one / parts['total']:.0f}x)")  # fmt: skip
    for name, seconds in parts.items():
        if name != "total":
            print(f"  {name:<24} {seconds:>8.1f} s")


if __name__ == "__main__":
    main()

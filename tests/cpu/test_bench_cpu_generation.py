"""benchmarks/bench_cpu_generation.py: a generation's decode steps timed at lengths new to the session and at
lengths seen before, with stand-in runners (no torch export): the lengths each generation meets, and the table."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from benchmarks import bench_cpu_generation
from benchmarks.llm_pair import SIZES


def _stand_ins(pasts: list[int]) -> tuple[Any, Any]:
    config = SIZES["tiny"]

    def outputs(length: int) -> list[np.ndarray]:
        present = np.zeros((1, config.kv_heads, length, config.head_dim), np.float32)
        return [np.zeros((1, 1, config.vocab), np.float32), *[present] * (2 * config.layers)]

    def prefill(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return outputs(feed["input_ids"].shape[1])

    def decode(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        past = feed["past_key_values.0.key"].shape[2]
        pasts.append(past)
        return outputs(past + 1)

    return prefill, decode


def test_each_decode_step_meets_a_past_one_longer() -> None:
    pasts: list[int] = []
    first, steps = bench_cpu_generation.generate(*_stand_ins(pasts), "tiny", 5, 4)
    assert pasts == [5, 6, 7, 8] and len(steps) == 4 and first >= 0


def test_the_rounds_meet_new_lengths_then_the_warm_up_lengths(monkeypatch: Any) -> None:
    pasts: list[int] = []
    monkeypatch.setattr(bench_cpu_generation, "_runners", lambda *a: _stand_ins(pasts))
    args = argparse.Namespace(size="tiny", prompt=4, tokens=3, rounds=2, threads=1)
    rows = bench_cpu_generation.measure(args, None, None)  # type: ignore[arg-type]
    # warm-up (both runtimes), then per round and runtime: new lengths, then the warm-up's again
    per_runtime = [4, 5, 6]
    assert pasts[:6] == per_runtime * 2
    assert pasts[6:12] == [7, 8, 9, 4, 5, 6] and pasts[18:21] == [10, 11, 12]
    text = bench_cpu_generation.report(rows, args)
    assert text.splitlines()[-1].startswith("ratio   | ") and len(text.splitlines()) == 5

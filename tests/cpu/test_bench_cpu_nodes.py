"""benchmarks/bench_cpu_nodes.py: the CPU EP's kernels against onnxruntime's profile, node by node, on a real
corpus model (the PP-OCR direction classifier, a Paddle export with depthwise, 1x1 and dense convs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import bench_cpu_nodes
from benchmarks.corpus import Unavailable, feeds, materialise

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize(
    ("shapes", "kind"),
    [
        ([(1, 32, 8, 8), (32, 1, 3, 3)], "conv depthwise"),
        ([(1, 32, 8, 8), (64, 1, 5, 5)], "conv depthwise"),  # two output channels per group
        ([(1, 32, 8, 8), (16, 32, 1, 1)], "conv 1x1"),
        ([(1, 3, 64, 64), (16, 3, 3, 3)], "conv dense"),
        ([(1, 1, 64, 64), (16, 1, 3, 3)], "conv dense"),  # one input channel: a dense conv, not depthwise
    ],
)
def test_conv_kinds(shapes: list[tuple[int, ...]], kind: str) -> None:
    assert bench_cpu_nodes.conv_kind(shapes) == kind


@pytest.mark.parametrize(
    ("ours", "theirs", "same"),
    [
        ([(1, 8, 24, 96), (8, 1, 3, 3)], [(1, 16, 24, 96), (16, 1, 3, 3), (16,)], True),  # NCHWc: 8 -> 16
        ([(1, 8, 24, 96), (8, 1, 3, 3)], [(1, 8, 24, 96), (8, 1, 3, 3)], True),
        ([(1, 8, 24, 96), (8, 1, 3, 3)], [(1, 32, 24, 96), (32, 1, 3, 3)], False),  # more than the padding
        ([(1, 8, 24, 96), (8, 1, 3, 3)], [(1, 8, 24, 96), (8, 1, 5, 5)], False),  # another kernel
        ([(1, 8, 24, 96), (8, 1, 3, 3)], [(1, 8, 12, 96), (8, 1, 3, 3)], False),  # another map
        ([(1, 16, 24, 96), (16, 16, 1, 1)], [(1, 16, 24, 96), (16, 1, 1, 1)], False),  # another kind
    ],
)
def test_convs_matched_up_to_onnxruntimes_channel_padding(
    ours: list[tuple[int, ...]], theirs: list[tuple[int, ...]], same: bool
) -> None:
    assert bench_cpu_nodes.same_conv(ours, theirs) is same


def test_nodes_of_a_real_model_against_onnxruntime(tmp_path: Path) -> None:
    try:
        model = materialise("ppocr_cls", tmp_path)
    except Unavailable as exc:
        pytest.skip(str(exc))
    feed = feeds("ppocr_cls")
    ours = bench_cpu_nodes.ours(model, feed, threads=1, runs=3)
    theirs = bench_cpu_nodes.theirs(model, feed, threads=1, runs=3)
    convs = [k for k, row in enumerate(ours) if row["op"] == "Conv"]
    assert convs and all(ours[k]["us"] > 0 and len(ours[k]["shapes"]) >= 2 for k in convs)
    assert {bench_cpu_nodes.kind(ours[k]) for k in convs} == {"conv depthwise", "conv 1x1", "conv dense"}
    # every conv of ours has onnxruntime's conv of the same shapes (fused or not; its channels padded to 16)
    matched = bench_cpu_nodes.match_convs(ours, theirs)
    assert sorted(matched) == convs
    assert all(bench_cpu_nodes.same_conv(ours[k]["shapes"], hit["shapes"]) for k, hit in matched.items())
    assert len({id(hit) for hit in matched.values()}) == len(matched)  # one of theirs per conv of ours
    lines = bench_cpu_nodes.report("ppocr_cls", ours, theirs, top=3)
    total = sum(r["us"] for r in ours) / 1e3
    assert lines[0].startswith(f"ppocr_cls: kernel floor epctx {total:.2f} ms")
    kinds = {line.split("|")[0].strip(): line for line in lines[3:] if "|" in line}
    assert {"conv depthwise", "conv 1x1", "conv dense"} <= set(kinds)
    shares = [float(line.rsplit("|", 1)[1].strip().rstrip("%")) for line in kinds.values()]
    assert sum(shares) == pytest.approx(100, abs=0.1 * len(shares))  # the kinds' shares add up to the gap
    assert len(lines) == 3 + len(kinds) + 2 + 3


def test_whole_runs_of_both_runtimes(tmp_path: Path) -> None:
    try:
        model = materialise("ppocr_cls", tmp_path)
    except Unavailable as exc:
        pytest.skip(str(exc))
    ours, theirs = bench_cpu_nodes.whole_runs(model, feeds("ppocr_cls"), threads=1, runs=2)
    assert 0 < theirs < ours < 1e6  # microseconds: onnxruntime is faster on this conv net

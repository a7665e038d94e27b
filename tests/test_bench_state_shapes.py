"""``bench_corpus.py --state-dims`` states every fed input's whole shape to epctx (``epctx.input_shapes``), so
the stated rows cover PP-OCR's anonymous dimensions (its cls input is x[-1, 3, '?', '?'])."""

from __future__ import annotations

from pathlib import Path

from benchmarks import bench_corpus
from benchmarks.corpus import feeds, materialise


def test_state_dims_states_the_anonymous_dims_of_ppocr_cls(tmp_path: Path) -> None:
    path = materialise("ppocr_cls", tmp_path)
    feed = feeds("ppocr_cls")
    assert bench_corpus.stated_shapes(path, feed) == "x[1,3,48,192]"
    assert bench_corpus.stated_dims(path, feed) == {}  # '?' is height and width: no name states them
    row = bench_corpus.run_cell(
        "ppocr_cls", path, "CPUExecutionProvider", steady_s=0.3, threads=1, state_dims=True
    )
    assert row["compiles"] == "yes" and row["max_err"] <= 1e-3, row

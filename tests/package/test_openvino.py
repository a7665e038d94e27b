"""OpenVINO variants of one model (bf16 and f32 precision, weightless blobs) share one binary: the weights are
there once, and each variant still runs as onnxruntime does (its own precision's tolerance)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.epcontext.container import ContextBinary
from epctx.farm.executors import LocalPool
from epctx.farm.run import build
from epctx.package.layout import read_package
from epctx.package.tools import validate_package
from epctx.testing.conformance import models

pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.slow  # OpenVINO compiles twice (about 10 s)

SPEC = """[components.chain]
model = "chain.onnx"
{targets}
[[targets]]
name = "cpu"
ep = "CPUExecutionProvider"
"""
TARGET = """
[[targets]]
name = "ov-{p}"
ep = "OpenVINOExecutionProvider"
device = "cpu"
options = {{ precision = "{p}", weightless = "1" }}
"""


def test_openvino_precisions_share_one_binary(tmp_path: Path) -> None:
    onnx.save(models.chain(), tmp_path / "chain.onnx")
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(targets="".join(TARGET.format(p=p) for p in ("bf16", "f32"))))
    build(spec, tmp_path / "pkg", LocalPool(1))
    (asset,) = read_package(tmp_path / "pkg").assets.values()
    (binary,) = asset.glob("*.bin")
    separate = sorted((tmp_path / "pkg.jobs").glob("*/*.bin"))
    assert len(separate) == 2
    with ContextBinary.open(binary) as merged, ContextBinary.open(separate[0]) as one:
        weights = {(e.offset, e.size) for e in map(merged.entry, merged.names()) if e.kind == "weights"}
        alone = sum(e.size for e in map(one.entry, one.names()) if e.kind == "weights")
    assert sum(size for _, size in weights) == alone  # both variants' weights: one copy
    assert binary.stat().st_size < sum(p.stat().st_size for p in separate)
    feeds = models.feeds()
    expected = ort.InferenceSession(str(tmp_path / "chain.onnx")).run(None, feeds)[0]
    for precision, tolerance in (("f32", 1e-5), ("bf16", 2e-2)):
        session = epctx.InferenceSession(
            str(asset / f"chain.ov-{precision}_ctx.onnx"), providers=["OpenVINOExecutionProvider"]
        )
        np.testing.assert_allclose(session.run(None, feeds)[0], expected, rtol=tolerance, atol=tolerance)
    assert validate_package(tmp_path / "pkg") == []

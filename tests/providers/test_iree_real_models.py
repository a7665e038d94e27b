"""IREE on models nobody here wrote, shipped inside PyPI wheels, against onnxruntime CPU:

- silero-vad (``silero_vad``): a rank-0 ``sr`` input, an ``If`` on the CPU EP between IREE partitions, the
  recurrent state carried over several chunks;
- the PP-OCR detector, recognizer and direction classifier of ``rapidocr_onnxruntime`` (Paddle exports: every
  weight is a ``Constant`` node, no initializers), with the input shape stated as rapidocr feeds them.

Each is compiled into a context model, loaded back without compiling, and compared with onnxruntime."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

# Compiles with IREE: `make test-fast` leaves it out.
pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"


def _package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        pytest.skip(f"{package} does not ship {relative}")
    return path


def _compile_and_load(model: onnx.ModelProto, folder: Path, **config: str) -> epctx.InferenceSession:
    source = folder / "model.onnx"
    onnx.save(model, source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    epctx.InferenceSession(str(source), so, providers=[EP])
    with no_compile():
        return epctx.InferenceSession(str(folder / "model_ctx.onnx"), providers=[EP])


def _max_error(got: list[np.ndarray], expected: list[np.ndarray]) -> float:
    assert [g.shape for g in got] == [e.shape for e in expected]
    assert [g.dtype for g in got] == [e.dtype for e in expected]
    return max(float(np.max(np.abs(g.astype(np.float64) - e))) for g, e in zip(got, expected))


def test_silero_vad_over_chunks_with_state(tmp_path: Path) -> None:
    model = onnx.load(_package_file("silero_vad", "data/silero_vad.onnx"))
    # By default the cost rule leaves silero's small IREE partitions around its If nodes to the CPU EP (they were
    # slower than the CPU EP alone: 0.77 ms against 0.65 per chunk); without it, the scalar sr crosses them.
    default = epctx.InferenceSession(model.SerializeToString(), providers=[EP])
    assert EP not in {ep for ep, _ in default.get_partitions()}, default.get_partitions()
    reasons = [r[EP] for r in default.get_fallback_reasons().values() if EP in r]
    assert any(why.startswith("cost rule: ") for why in reasons), reasons
    assert all(why.startswith(("cost rule: ", "control flow")) for why in reasons), reasons
    sess = _compile_and_load(model, tmp_path, **{"epctx.partition.cost_rule": "0"})
    assert EP in {ep for ep, _ in sess.get_partitions()}, sess.get_partitions()
    rng = np.random.default_rng(0)
    t = np.arange(512 * 8) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 440 * t) * (t > 0.1) + 0.02 * rng.standard_normal(t.size)).astype(
        np.float32
    )
    sr = np.array(16000, np.int64)  # a scalar, as silero_vad's wrapper passes it
    state = expected_state = np.zeros((2, 1, 128), np.float32)
    for chunk in audio.reshape(8, 1, 512):
        got = sess.run(None, {"input": chunk, "state": state, "sr": sr})
        expected = run_ort(model, {"input": chunk, "state": expected_state, "sr": sr})
        assert _max_error(got, expected) <= 1e-4
        state, expected_state = got[1], expected[1]


def _fixed_input(model: onnx.ModelProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """The model with its one input's dynamic dimensions stated (rapidocr's shapes)."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert len(dims) == len(shape)
    for dim, size in zip(dims, shape):
        dim.Clear()
        dim.dim_value = size
    return model


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (6, 3, 48, 192)),  # cls_batch_num 6, 48 x 192 crops
        ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),  # a 48-pixel text line
        ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 640, 640)),  # a page, sides multiples of 32
    ],
)
def test_rapidocr_paddle_exports(name: str, shape: tuple[int, ...], tmp_path: Path) -> None:
    model = onnx.load(_package_file("rapidocr_onnxruntime", f"models/{name}"))
    assert not model.graph.initializer  # Paddle's exporter: the weights are Constant nodes
    model = _fixed_input(model, shape)
    sess = _compile_and_load(model, tmp_path)
    assert [ep for ep, _ in sess.get_partitions()] == [EP], sess.get_partitions()
    # An image as rapidocr normalizes it: (pixel / 255 - 0.5) / 0.5, smooth regions and edges.
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(shape[0], shape[1], shape[2] // 8 + 1, shape[3] // 8 + 1))
    image = np.kron(pixels, np.ones((1, 1, 8, 8)))[:, :, : shape[2], : shape[3]]
    feeds = {model.graph.input[0].name: ((image / 255.0 - 0.5) / 0.5).astype(np.float32)}
    assert _max_error(sess.run(None, feeds), run_ort(model, feeds)) <= 1e-3

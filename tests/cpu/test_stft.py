"""STFT on the CPU EP (``kernels/signal.py``): the speech front ends of onnx-asr (whisper, NeMo, GigaAM, Kaldi
feature extractors) give it a ``(batch, length)`` signal, which onnx.reference refused ("need at least one array
to concatenate"): seven of its 29 preprocessors failed to run. Checked against onnxruntime (float32 DFTs: within
its own rounding) and against a float64 transform written out here (exact)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.errors import EPCtxError
from tests.oracle import run_ort


def _model(signal_shape: list[int], *, window: int | None, frame_length: int | None, onesided: int) -> bytes:
    inputs = ["signal", "step", "window" if window else "", "frame_length" if frame_length else ""]
    while inputs[-1] == "":
        inputs.pop()
    inits = [numpy_helper.from_array(np.array(5, np.int64), "step")]
    if window:
        inits.append(numpy_helper.from_array(np.hanning(window).astype(np.float32), "window"))
    if frame_length:
        inits.append(numpy_helper.from_array(np.array(frame_length, np.int64), "frame_length"))
    graph = helper.make_graph(
        [helper.make_node("STFT", inputs, ["y"], onesided=onesided)],
        "stft",
        [helper.make_tensor_value_info("signal", TensorProto.FLOAT, signal_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _expected(x: np.ndarray, size: int, window: np.ndarray | None, onesided: int) -> np.ndarray:
    signal = x[..., 0] + 1j * x[..., 1] if x.ndim == 3 and x.shape[-1] == 2 else x.reshape(x.shape[0], -1)
    frames = np.stack([signal[:, s : s + size] for s in range(0, signal.shape[1] - size + 1, 5)], axis=1)
    if window is not None:
        frames = frames * window
    k = np.arange(size)
    dft = np.exp(-2j * np.pi * np.outer(k, k) / size)
    spectrum = frames.astype(np.complex128) @ dft
    if onesided:
        spectrum = spectrum[..., : size // 2 + 1]
    return np.stack([spectrum.real, spectrum.imag], axis=-1)


@pytest.mark.parametrize(
    ("shape", "window", "frame_length", "onesided"),
    [
        ([2, 64], 16, None, 1),  # what onnx-asr's front ends give it
        ([2, 64, 1], 16, 16, 1),
        ([1, 50], None, 12, 1),
        ([2, 40, 1], 10, None, 0),
        ([2, 40, 2], 8, None, 0),  # a complex signal
    ],
)
def test_stft_matches_onnxruntime_and_the_transform(
    shape: list[int], window: int | None, frame_length: int | None, onesided: int
) -> None:
    model = _model(shape, window=window, frame_length=frame_length, onesided=onesided)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = epctx.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"signal": x})[0]
    size = window or frame_length
    assert size is not None
    expected = _expected(x.astype(np.float64), size, np.hanning(window) if window else None, onesided)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, run_ort(model, {"signal": x})[0], rtol=0, atol=1e-4)


def test_a_complex_signal_is_refused_one_sided_and_frames_must_fit() -> None:
    complex_onesided = _model([1, 40, 2], window=8, frame_length=None, onesided=1)
    x = np.zeros((1, 40, 2), np.float32)
    with pytest.raises(EPCtxError, match="onesided is 1, but the signal is complex"):
        epctx.InferenceSession(complex_onesided, providers=["CPUExecutionProvider"]).run(None, {"signal": x})
    too_short = _model([1, 4], window=8, frame_length=None, onesided=1)
    with pytest.raises(EPCtxError, match="do not fit a signal of 4 samples"):
        epctx.InferenceSession(too_short, providers=["CPUExecutionProvider"]).run(
            None, {"signal": np.zeros((1, 4), np.float32)}
        )

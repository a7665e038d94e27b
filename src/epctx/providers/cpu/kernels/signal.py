"""STFT: the short-time Fourier transform speech front ends compute (onnx-asr's whisper, NeMo, GigaAM and Kaldi
feature extractors), as onnxruntime's CPU kernel takes it: a signal of shape ``(batch, length)`` (real: what those
exporters write, which onnx.reference refuses) or ``(batch, length, 1 | 2)`` (real | complex), frames
``frame_step`` apart, each ``window``-weighted (its length is the frame's; else ``frame_length``), transformed by
numpy's FFT in float64 and given back in the signal's type as ``(batch, frames, bins, 2)`` (real, imaginary),
``onesided`` keeping the ``length // 2 + 1`` bins a real signal's spectrum is made of."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from epctx.ep import Kernel
from epctx.errors import InvalidArgument
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []


def _signal(x: np.ndarray, name: str) -> tuple[np.ndarray, bool]:
    """The signal as (batch, length), real or complex, and whether it is complex."""
    if x.ndim == 2:
        return x, False
    if x.ndim == 3 and x.shape[-1] == 1:
        return x[..., 0], False
    if x.ndim == 3 and x.shape[-1] == 2:
        return x[..., 0] + 1j * x[..., 1].astype(np.float64), True
    raise InvalidArgument(
        f"STFT node {name!r}: the signal must be (batch, length) or (batch, length, 1 or 2), found {x.shape}"
    )


def _frame_length(window: Any, frame_length: Any, name: str) -> int:
    if window is not None:
        size = int(np.asarray(window).shape[0])
        if frame_length is not None and int(np.asarray(frame_length)) != size:
            raise InvalidArgument(
                f"STFT node {name!r}: frame_length {int(np.asarray(frame_length))} differs from the window's "
                f"length {size}"
            )
        return size
    if frame_length is None:
        raise InvalidArgument(f"STFT node {name!r}: neither a window nor a frame_length is given")
    return int(np.asarray(frame_length))


@kernel("STFT", since=17)
def _stft(info: NodeInfo) -> Kernel:
    onesided = bool(info.get("onesided", 1))
    name = info.name

    def run(signal: np.ndarray, frame_step: Any, window: Any = None, frame_length: Any = None) -> Any:
        x, is_complex = _signal(np.asarray(signal), name)
        if onesided and is_complex:
            raise InvalidArgument(f"STFT node {name!r}: onesided is 1, but the signal is complex")
        size, step = _frame_length(window, frame_length, name), int(np.asarray(frame_step))
        if size < 1 or step < 1 or x.shape[1] < size:
            raise InvalidArgument(
                f"STFT node {name!r}: frames of {size} samples, {step} apart, do not fit a signal of "
                f"{x.shape[1]} samples"
            )
        frames = sliding_window_view(x, size, axis=1)[:, ::step].astype(
            np.complex128 if is_complex else np.float64
        )
        if window is not None:
            frames = frames * np.asarray(window, dtype=np.float64)
        spectrum = np.fft.rfft(frames, axis=-1) if onesided else np.fft.fft(frames, axis=-1)
        return (np.stack([spectrum.real, spectrum.imag], axis=-1).astype(signal.dtype),)

    return run

"""A conv input's channels as the rows of a matrix (or its pixels as the rows), without a copy where the memory
allows: contiguous NCHW memory, or channels-last memory (a depthwise conv's hand-off, ``layout.py``), whose
transposed matrix BLAS multiplies as it is."""

from __future__ import annotations

import numpy as np

__all__ = ["PixelRows", "channel_rows"]


def channel_rows(x: np.ndarray, n: int, c: int, length: int) -> np.ndarray:
    """(N, C, *spatial) as (N, C, length) matrices, without a copy for contiguous or channels-last memory (a
    depthwise conv's hand-off, ``layout.py``): BLAS takes the transposed (length, C) matrices as they are."""
    if not x.flags.c_contiguous and x.ndim >= 3:
        last = x.transpose(0, *range(2, x.ndim), 1)
        if last.flags.c_contiguous:
            return last.reshape(n, length, c).transpose(0, 2, 1)
    return x.reshape(n, c, length)


class PixelRows:
    """One image (1, C, *spatial) as its (H * W, C) matrix of pixels, without a copy for contiguous memory (a
    transposed view) or channels-last memory (a depthwise conv's hand-off, ``layout.py``): ``channel_rows``'s
    matrix transposed, for a shape laid out once."""

    __slots__ = ("channels", "last", "length")

    def __init__(self, channels: int, length: int, spatial: int) -> None:
        self.channels, self.length = channels, length
        self.last = (0, *range(2, spatial + 2), 1)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not x.flags.c_contiguous:
            last = x.transpose(self.last)
            if last.flags.c_contiguous:
                return last.reshape(self.length, self.channels)
        return x.reshape(self.channels, self.length).T

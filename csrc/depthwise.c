/* epctx's CPU EP: depthwise convolutions channels-last (2-D, float32, one output channel per group), in C.

   A plain C library (no Python API), built as an optional extension when a C compiler is at hand (setup.py) and
   loaded with ctypes (src/epctx/providers/cpu/native.py); without it the CPU EP computes the same with numpy
   (kernels/depthwise.py). ctypes releases the GIL for each call, so helper threads run other rows meanwhile.

   The input is read where it lies, channels contiguous (an (H, W, C) image: a channels-last array, or an NCHW
   value handed over channels-last, src/epctx/providers/cpu/layout.py); taps outside it (padding) are skipped.
   Output columns whose taps all land inside are computed COLS at a time, VL channels each, in vector registers
   (GCC's vector extension: AVX-512, AVX2 + FMA or SSE2 code, chosen at load by the CPU's features): each
   weight vector is loaded once for COLS products. A channel count that is no multiple of VL ends with one vector
   overlapping the one before it (those channels computed twice, to the same values); under VL channels, one
   channel at a time. */
#include "common.h"

#define COLS 4

/* The conv's geometry; ctypes mirrors it (native.py, DwGeometry). */
typedef struct {
    int h, w, c;             /* the input image (H, W, C) */
    ptrdiff_t x_row, x_col;  /* its strides in values (channels contiguous) */
    int out_w;               /* output columns; an output row is out_w * c contiguous values */
    int kh, kw, sh, sw, dh, dw, top, left;
    activation act;          /* applied to each result */
} dw_geometry;

/* One output pixel (all channels) from the taps [p0, p1) x [q0, q1); x points at the pixel's window origin. */
INLINE void pixel(const float *x, const dw_geometry *g, const float *wt, const float *bias, float *out,
                         int p0, int p1, int q0, int q1) {
    const int c = g->c;
    int k = 0;
    while (k < c) {
        if (c < VL) { /* one channel */
            float a = bias ? bias[k] : 0.0f;
            for (int p = p0; p < p1; p++)
                for (int q = q0; q < q1; q++)
                    a += x[p * g->dh * g->x_row + q * g->dw * g->x_col + k] * wt[(p * g->kw + q) * c + k];
            out[k++] = a;
            continue;
        }
        if (k + VL > c) k = c - VL; /* the last vector overlaps the one before */
        vf a = bias ? load(bias + k) : (vf){0};
        for (int p = p0; p < p1; p++)
            for (int q = q0; q < q1; q++)
                a += load(x + p * g->dh * g->x_row + q * g->dw * g->x_col + k) * load(wt + (p * g->kw + q) * c + k);
        store(out + k, a);
        k += VL;
    }
}

/* COLS output pixels side by side, every tap inside, the rows [p0, p1); c >= VL. */
INLINE void columns(const float *x, const dw_geometry *g, const float *wt, const float *bias, float *out,
                           int p0, int p1) {
    const int c = g->c;
    const ptrdiff_t step = (ptrdiff_t)g->sw * g->x_col;
    for (int k = 0; k < c; k += VL) {
        if (k + VL > c) k = c - VL;
        vf a0, a1, a2, a3;
        a0 = a1 = a2 = a3 = bias ? load(bias + k) : (vf){0};
        for (int p = p0; p < p1; p++) {
            const float *xr = x + p * g->dh * g->x_row + k;
            const float *wr = wt + p * g->kw * c + k;
            for (int q = 0; q < g->kw; q++) {
                const vf wv = load(wr + q * c);
                const float *xq = xr + q * g->dw * g->x_col;
                a0 += load(xq) * wv;
                a1 += load(xq + step) * wv;
                a2 += load(xq + 2 * step) * wv;
                a3 += load(xq + 3 * step) * wv;
            }
        }
        store(out + k, a0);
        store(out + c + k, a1);
        store(out + 2 * c + k, a2);
        store(out + 3 * c + k, a3);
    }
}

/* Output rows [r0, r1) of one image into y (the image's whole result): bias[ch] (or 0 where bias is NULL) plus the
   products of the taps inside the input, then the activation; wt the filter as (KH, KW, C). */
CLONES void epctx_dw_rows_f32(const float *x, const dw_geometry *g, const float *wt, const float *bias, float *y,
                              int r0, int r1) {
    const int c = g->c;
    /* the output columns whose taps all land inside: [inner0, inner1) */
    int inner0, inner1;
    inner_columns(g->out_w, g->sw, g->left, g->kw, g->dw, g->w, &inner0, &inner1);
    for (int r = r0; r < r1; r++) {
        const int ih = r * g->sh - g->top;
        int p0, p1;
        taps_inside(ih, g->dh, g->h, g->kh, &p0, &p1);
        float *yr = y + (ptrdiff_t)r * g->out_w * c;
        const float *xr = x + (ptrdiff_t)ih * g->x_row;
        int j = 0;
        while (j < g->out_w) {
            const int iw = j * g->sw - g->left;
            if (c >= VL && j >= inner0 && j + COLS <= inner1) {
                columns(xr + (ptrdiff_t)iw * g->x_col, g, wt, bias, yr + (ptrdiff_t)j * c, p0, p1);
                j += COLS;
                continue;
            }
            int q0, q1;
            taps_inside(iw, g->dw, g->w, g->kw, &q0, &q1);
            pixel(xr + (ptrdiff_t)iw * g->x_col, g, wt, bias, yr + (ptrdiff_t)j * c, p0, p1, q0, q1);
            j++;
        }
        activate(yr, (ptrdiff_t)g->out_w * c, &g->act); /* the row still in cache */
    }
}

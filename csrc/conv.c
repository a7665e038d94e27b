/* epctx's CPU EP: dense 2-D convolutions (a network's stem, its 3x3 convs of up to 128 input channels, 1x1 convs
   of up to 384: providers/cpu/kernels/conv_native.py says which), float32, computed directly (no im2col columns),
   in C.

   Built and loaded as csrc/depthwise.c is (see there). The input is read where it lies, any strides (NCHW or
   channels-last memory); taps in the padding are skipped. Output columns whose taps all land inside are computed
   12 or 8 at a time with AVX-512's 32 vector registers (4 with AVX2's 16), 2 * VL output channels each (8 at a
   time where M <= VL), in vector registers: for each tap and input channel (one flat loop over the filter's rows),
   the filter's vectors are loaded once for all those pixels and each input value once for all channels. The
   filter is packed as (KH * KW * C, m_pad), zeros past M, 64-byte aligned (conv_native.py). The result goes out
   channels-last (H, W, M) or as NCHW (M, H, W), after the bias (its start) and the activation (csrc/common.h). */
#include <stddef.h>
#include <string.h>

#include "common.h"


typedef struct {
    int c, h, w;                   /* the input image: channels, rows, columns */
    ptrdiff_t x_ch, x_row, x_col;  /* its strides in values */
    int m, m_pad;                  /* output channels; the packed filter's row length */
    int out_h, out_w;
    int kh, kw, sh, sw, dh, dw, top, left;
    int nhwc;                      /* 1: y is (out_h, out_w, m); 0: (m, out_h, out_w) */
    activation act;
    const ptrdiff_t *offsets;      /* per filter row (tap p, q and channel k): its input's offset from a pixel's
                                      origin, p * dh * x_row + q * dw * x_col + k * x_ch */
} conv_geometry;


/* The results of `count` pixels of output row r from column j on, channels [mc, mc + n), from `tile` (count
   rows of `width` values): activated and written out. */
INLINE void put(const conv_geometry *g, float *tile, int width, int count, int n, float *y, int r, int j, int mc) {
    for (int i = 0; i < count; i++) activate(tile + i * width, n, &g->act);
    const ptrdiff_t pixel = (ptrdiff_t)r * g->out_w + j;
    if (g->nhwc) {
        for (int i = 0; i < count; i++) {
            float *out = y + (pixel + i) * g->m + mc;
            for (int l = 0; l < n; l++) out[l] = tile[i * width + l];
        }
        return;
    }
    const ptrdiff_t plane = (ptrdiff_t)g->out_h * g->out_w;
    for (int l = 0; l < n; l++)
        for (int i = 0; i < count; i++) y[(mc + l) * plane + pixel + i] = tile[i * width + l];
}

/* 4 pixels side by side x 2 * VL output channels from mc: the products of the filter rows [t0, t1) (one per tap
   and input channel, g->offsets their input offsets from a pixel's origin x). */
INLINE void four_by_two(const float *x, const conv_geometry *g, const float *wp, const float *bias, int t0,
                               int t1, int mc, float *tile) {
    const ptrdiff_t step = (ptrdiff_t)g->sw * g->x_col;
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    if (bias) {
        a0 = a1 = a2 = a3 = load(bias + mc);
        b0 = b1 = b2 = b3 = load(bias + mc + VL);
    }
    const float *wt = wp + (ptrdiff_t)t0 * g->m_pad + mc;
    for (int t = t0; t < t1; t++, wt += g->m_pad) {
        const vf w0 = load(wt), w1 = load(wt + VL);
        const float *xt = x + g->offsets[t];
        const float s0 = xt[0], s1 = xt[step], s2 = xt[2 * step], s3 = xt[3 * step];
        a0 += w0 * s0;
        b0 += w1 * s0;
        a1 += w0 * s1;
        b1 += w1 * s1;
        a2 += w0 * s2;
        b2 += w1 * s2;
        a3 += w0 * s3;
        b3 += w1 * s3;
    }
    store(tile, a0);
    store(tile + VL, b0);
    store(tile + 2 * VL, a1);
    store(tile + 3 * VL, b1);
    store(tile + 4 * VL, a2);
    store(tile + 5 * VL, b2);
    store(tile + 6 * VL, a3);
    store(tile + 7 * VL, b3);
}

/* P pixels side by side x 2 * VL output channels from mc, as four_by_two: 2 * P sums in registers (12 and 8 here;
   AVX-512 has 32 vector registers). */
#define PIXELS_BY_TWO(P)                                                                                        \
    INLINE void pixels##P##_by_two(const float *x, const conv_geometry *g, const float *wp, const float *bias,  \
                                   int t0, int t1, int mc, float *tile) {                                       \
        const ptrdiff_t step = (ptrdiff_t)g->sw * g->x_col;                                                     \
        vf a[P], b[P];                                                                                          \
        for (int i = 0; i < P; i++) {                                                                           \
            a[i] = bias ? load(bias + mc) : (vf){0};                                                            \
            b[i] = bias ? load(bias + mc + VL) : (vf){0};                                                       \
        }                                                                                                       \
        const float *wt = wp + (ptrdiff_t)t0 * g->m_pad + mc;                                                   \
        for (int t = t0; t < t1; t++, wt += g->m_pad) {                                                         \
            const vf w0 = load(wt), w1 = load(wt + VL);                                                         \
            const float *xt = x + g->offsets[t];                                                                \
            for (int i = 0; i < P; i++) {                                                                       \
                const float s = xt[i * step];                                                                   \
                a[i] += w0 * s;                                                                                 \
                b[i] += w1 * s;                                                                                 \
            }                                                                                                   \
        }                                                                                                       \
        for (int i = 0; i < P; i++) {                                                                           \
            store(tile + 2 * i * VL, a[i]);                                                                     \
            store(tile + (2 * i + 1) * VL, b[i]);                                                               \
        }                                                                                                       \
    }
PIXELS_BY_TWO(12)
PIXELS_BY_TWO(8)

/* 8 pixels side by side x VL output channels (M <= VL), as four_by_two. */
INLINE void eight_by_one(const float *x, const conv_geometry *g, const float *wp, const float *bias, int t0,
                                int t1, float *tile) {
    const ptrdiff_t step = (ptrdiff_t)g->sw * g->x_col;
    vf a[8];
    for (int i = 0; i < 8; i++) a[i] = bias ? load(bias) : (vf){0};
    const float *wt = wp + (ptrdiff_t)t0 * g->m_pad;
    for (int t = t0; t < t1; t++, wt += g->m_pad) {
        const vf w0 = load(wt);
        const float *xt = x + g->offsets[t];
        for (int i = 0; i < 8; i++) a[i] += w0 * xt[i * step];
    }
    for (int i = 0; i < 8; i++) store(tile + i * VL, a[i]);
}

/* One pixel, the filter rows of taps inside: kernel rows [p0, p1), columns [q0, q1); x at its origin. */
INLINE void pixel(const float *x, const conv_geometry *g, const float *wp, const float *bias, int p0, int p1,
                         int q0, int q1, int mc, int width, float *tile) {
    vf ca[4] = {{0}}, cb[4] = {{0}};
    if (bias) {
        ca[0] = load(bias + mc);
        if (width > VL) cb[0] = load(bias + mc + VL);
    }
    for (int p = p0; p < p1; p++)
        for (int q = q0; q < q1; q++) {
            const int t0 = (p * g->kw + q) * g->c;
            const float *wt = wp + (ptrdiff_t)t0 * g->m_pad + mc;
            int k = 0;
            for (; k + 4 <= g->c; k += 4, wt += 4 * g->m_pad) { /* four chains of sums: not latency-bound */
                for (int u = 0; u < 4; u++) {
                    const float s = x[g->offsets[t0 + k + u]];
                    ca[u] += load(wt + u * g->m_pad) * s;
                    if (width > VL) cb[u] += load(wt + u * g->m_pad + VL) * s;
                }
            }
            for (; k < g->c; k++, wt += g->m_pad) {
                const float s = x[g->offsets[t0 + k]];
                ca[0] += load(wt) * s;
                if (width > VL) cb[0] += load(wt + VL) * s;
            }
        }
    store(tile, (ca[0] + ca[1]) + (ca[2] + ca[3]));
    if (width > VL) store(tile + VL, (cb[0] + cb[1]) + (cb[2] + cb[3]));
}

/* Output rows [r0, r1) of one image; y the whole image's result (its layout per g->nhwc), wp the packed filter
   (KH * KW * C rows of m_pad values: VL where M <= VL, else a multiple of 2 * VL; zeros past M), bias m_pad
   values or NULL. */
CLONES void epctx_conv_rows_f32(const float *x, const conv_geometry *g, const float *wp, const float *bias, float *y,
                                int r0, int r1) {
    float tile[24 * VL];
    const int width = g->m_pad == VL ? VL : 2 * VL, cols = width == VL ? 8 : 4, wide = wide_registers();
    int inner0, inner1;
    inner_columns(g->out_w, g->sw, g->left, g->kw, g->dw, g->w, &inner0, &inner1);
    for (int r = r0; r < r1; r++) {
        const int ih = r * g->sh - g->top;
        int p0, p1;
        taps_inside(ih, g->dh, g->h, g->kh, &p0, &p1);
        const int t0 = p0 * g->kw * g->c, t1 = p1 * g->kw * g->c; /* the filter rows of kernel rows inside */
        const float *xr = x + (ptrdiff_t)ih * g->x_row;
        for (int mc = 0; mc < g->m; mc += width) {
            const int n = g->m - mc < width ? g->m - mc : width;
            int j = 0;
            while (j < g->out_w) {
                const float *origin = xr + (ptrdiff_t)(j * g->sw - g->left) * g->x_col;
                if (wide && width > VL && j >= inner0 && j + 8 <= inner1) { /* 12 pixels, or 8 */
                    const int count = j + 12 <= inner1 ? 12 : 8;
                    if (count == 12)
                        pixels12_by_two(origin, g, wp, bias, t0, t1, mc, tile);
                    else
                        pixels8_by_two(origin, g, wp, bias, t0, t1, mc, tile);
                    put(g, tile, width, count, n, y, r, j, mc);
                    j += count;
                    continue;
                }
                if (j >= inner0 && j + cols <= inner1) {
                    if (width == VL)
                        eight_by_one(origin, g, wp, bias, t0, t1, tile);
                    else
                        four_by_two(origin, g, wp, bias, t0, t1, mc, tile);
                    put(g, tile, width, cols, n, y, r, j, mc);
                    j += cols;
                    continue;
                }
                int q0, q1;
                taps_inside(j * g->sw - g->left, g->dw, g->w, g->kw, &q0, &q1);
                pixel(origin, g, wp, bias, p0, p1, q0, q1, mc, width, tile);
                put(g, tile, width, 1, n, y, r, j, mc);
                j++;
            }
        }
    }
}

/* What the CPU EP's C kernels share: the vector type, unaligned loads and stores, the CPU-feature clones, the
   activation applied to results (providers/cpu/fusion.py, NativeForm, gives its code and parameters), and the
   taps of a window that land inside the input. */
#ifndef EPCTX_COMMON_H
#define EPCTX_COMMON_H

#include <stddef.h>
#include <string.h>

/* AVX-512, AVX2 + FMA and baseline code of each kernel, the one for this CPU chosen at load (GCC, x86-64 ELF);
   EPCTX_ONE_ISA: only the code of the compiler's -march (tests build each instruction set this way). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) && !defined(EPCTX_ONE_ISA)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define CLONED 1
#else
#define CLONES
#endif

/* Every helper of a kernel is inlined into it, so that it is compiled for each clone's instruction set (a helper
   left out of line is compiled once, for the baseline). */
#define INLINE static inline __attribute__((always_inline))

/* Whether this CPU's code has AVX-512's 32 vector registers: register tiles of more than 8 vectors of sums fit
   there, and spill to memory in AVX2's 16 (each 16-float vector two of them). Clones share one body, so it is
   asked of the CPU (a flag read); code built for one instruction set knows it. */
INLINE int wide_registers(void) {
#ifdef CLONED
    /* the features that make the v4 clone the one picked (named one by one: GCC before 12 knows no "x86-64-v4") */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512cd");
#elif defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

#define VL 16
typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float))));

INLINE vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* code: ACT_CLIP min(max(v, a), hi) (ReLU: a = 0, hi = inf); ACT_TIMES_CLIP v * min(max(v * a + b, 0), hi)
   (HardSwish); ACT_CLIP_SCALED min(max(v * a + b, 0), hi) (HardSigmoid); ACT_SILU t * sigmoid(t), t = v * a
   (SiLU; a = 2 on a conv output halved, conv_activations.silu_halved). ctypes mirrors it (native.py). */
typedef struct {
    int code;
    float a, b, hi;
} activation;

enum { ACT_NONE = 0, ACT_CLIP = 1, ACT_TIMES_CLIP = 2, ACT_CLIP_SCALED = 3, ACT_SILU = 4 };

typedef int vi __attribute__((vector_size(VL * sizeof(int))));

INLINE vf splat(float x) { return (vf){0} + x; }

INLINE vf select_where(vi mask, vf yes, vf no) { return (vf)((mask & (vi)yes) | (~mask & (vi)no)); }

/* e^x for x in [-87, 88] (clamped there; NaN stays NaN): Cephes' expf, 2^n times a degree-7 polynomial of the
   remainder, within 2 ulp. */
INLINE vf exp_clamped(vf x) {
    x = select_where(x > splat(88.0f), splat(88.0f), x);
    x = select_where(x < splat(-87.0f), splat(-87.0f), x);
    const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)e;
}

/* t * sigmoid(t), t = v * a: -inf gives NaN as -inf * sigmoid(-inf) does (the sigmoid under 1e-37 flushed to 0). */
INLINE vf silu(vf v, float a) {
    const vf t = v * a;
    vf s = 1.0f / (1.0f + exp_clamped(-t));
    s = select_where(s < splat(1e-37f), splat(0.0f), s);
    return t * s;
}

/* In place over n values. A NaN stays NaN, as numpy's maximum and minimum keep it. */
INLINE void activate(float *v, ptrdiff_t n, const activation *act) {
    const float a = act->a, b = act->b, hi = act->hi;
    switch (act->code) {
    case ACT_SILU: {
        ptrdiff_t i = 0;
        for (; i + VL <= n; i += VL) store(v + i, silu(load(v + i), a));
        if (i < n) { /* the last values, through a vector of zeros */
            float tail[VL] = {0};
            memcpy(tail, v + i, (size_t)(n - i) * sizeof(float));
            store(tail, silu(load(tail), a));
            memcpy(v + i, tail, (size_t)(n - i) * sizeof(float));
        }
        break;
    }
    case ACT_CLIP:
        for (ptrdiff_t i = 0; i < n; i++) {
            float t = v[i] < a ? a : v[i];
            v[i] = t > hi ? hi : t;
        }
        break;
    case ACT_TIMES_CLIP:
        for (ptrdiff_t i = 0; i < n; i++) {
            float t = v[i] * a + b;
            t = t < 0.0f ? 0.0f : t;
            v[i] *= t > hi ? hi : t;
        }
        break;
    case ACT_CLIP_SCALED:
        for (ptrdiff_t i = 0; i < n; i++) {
            float t = v[i] * a + b;
            t = t < 0.0f ? 0.0f : t;
            v[i] = t > hi ? hi : t;
        }
        break;
    default:
        break;
    }
}

/* [first, end) of the taps k with 0 <= at + k * dil < size, of k taps. */
INLINE void taps_inside(int at, int dil, int size, int k, int *first, int *end) {
    int f = at >= 0 ? 0 : (-at + dil - 1) / dil;
    int e = at >= size ? 0 : (size - 1 - at) / dil + 1;
    *first = f;
    *end = e < k ? e : k;
}

/* [first, end) of the output columns whose kernel columns all land inside an input of `width` columns. */
INLINE void inner_columns(int out_w, int stride, int left, int kw, int dil, int width, int *first, int *end) {
    int f = 0, e = out_w;
    while (f < out_w && f * stride - left < 0) f++;
    while (e > f && (e - 1) * stride - left + (kw - 1) * dil >= width) e--;
    *first = f;
    *end = e;
}

#endif

/* What the CPU EP's C kernels share: the vector type, unaligned loads and stores, the CPU-feature clones, and the
   activation applied to results (providers/cpu/fusion.py, NativeForm, gives its code and parameters). */
#ifndef EPCTX_ACTIVATION_H
#define EPCTX_ACTIVATION_H

#include <stddef.h>
#include <string.h>

/* AVX-512, AVX2 + FMA and baseline code of each kernel, the one for this CPU chosen at load (GCC, x86-64 ELF). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

#define VL 16
typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float))));

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* code: ACT_CLIP min(max(v, a), hi) (ReLU: a = 0, hi = inf); ACT_TIMES_CLIP v * min(max(v * a + b, 0), hi)
   (HardSwish); ACT_CLIP_SCALED min(max(v * a + b, 0), hi) (HardSigmoid). ctypes mirrors it (native.py). */
typedef struct {
    int code;
    float a, b, hi;
} activation;

enum { ACT_NONE = 0, ACT_CLIP = 1, ACT_TIMES_CLIP = 2, ACT_CLIP_SCALED = 3 };

/* In place over n values. A NaN stays NaN, as numpy's maximum and minimum keep it. */
static inline void activate(float *v, ptrdiff_t n, const activation *act) {
    const float a = act->a, b = act->b, hi = act->hi;
    switch (act->code) {
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
static inline void taps_inside(int at, int dil, int size, int k, int *first, int *end) {
    int f = at >= 0 ? 0 : (-at + dil - 1) / dil;
    int e = at >= size ? 0 : (size - 1 - at) / dil + 1;
    *first = f;
    *end = e < k ? e : k;
}

#endif

/* m4's forward pass over one union graph, compiled: the arithmetic of
 * m4ray/models/numpy_step.py NumpyModel._pass (GRU time cells on the rows with dt > 0, SAGE
 * layers with sum aggregation in edge order and LayerNorm, GRU rate cells, the slowdown head),
 * for the small graphs where numpy's per-operation cost is most of a pass. Built and loaded by
 * numpy_step.py's native_step_library; no Python API, called through ctypes.
 *
 * Two entry points, one code (_step_pass.h, included once per float type): m4ray_m4_pass in
 * float64 and m4ray_m4_pass_f32 in float32 (twice the lanes per vector, half the weights'
 * bytes: precision="float32"). Both take and give float64 arrays.
 *
 * Every output row is computed by the same loop whatever the other rows are (no blocking that
 * changes a sum's order, no fused multiply-add: -ffp-contract=off), so a graph's answers do not
 * depend on the batch it is stepped in, nor on the CPU's vector width, in either type. Against
 * numpy's products (BLAS, its own summation order) they agree to the type's rounding, not to the
 * bit.
 *
 * Weights: one buffer of the pass's type, each tensor at off[k] in the order of numpy_step.py's
 * native_layout (matrices as (in, out), y = x W + b, in strips of 2 vectors' columns: 8 in
 * float64, 16 in float32). Returns 0, or 2 when memory runs out. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC optimize("O3")

#define LN_EPS 1e-5 /* torch.nn.LayerNorm's default */

/* GCC's vector extension: 32 bytes, AVX2 where the CPU has it (the CLONES build), SSE2 pairs
 * otherwise */
typedef double v4 __attribute__((vector_size(32), aligned(8)));
typedef float v8f __attribute__((vector_size(32), aligned(4)));

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* exp over an array, branch-free so that it vectorizes: x = n ln2 + r (|r| <= ln2 / 2, n by
 * the 1.5 * 2^52 rounding trick, ln2 split so that n * LN2_HI is exact), e^r by its Taylor
 * series to r^13 (relative error ~2e-16), times 2^n built in the exponent bits. x is clamped to
 * [-708, 709] first: beyond it a gate is 0 or 1 to float64's precision either way. */
#define LN2_HI 6.93147180369123816490e-01
#define LN2_LO 1.90821492927058770002e-10
#define LOG2E 1.44269504088896338700e+00
#define SHIFTER 6755399441055744.0 /* 1.5 * 2^52 */
typedef int64_t i4 __attribute__((vector_size(32), aligned(8)));

static double exp_one_f64(double x) { /* the same steps as exp_array's lanes, for its tail */
    x = x < -708.0 ? -708.0 : x;
    x = x > 709.0 ? 709.0 : x;
    double t = x * LOG2E + SHIFTER;
    double k = t - SHIFTER;
    double r = (x - k * LN2_HI) - k * LN2_LO;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0, p = p * r + 1.0 / 39916800.0, p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0, p = p * r + 1.0 / 40320.0, p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0, p = p * r + 1.0 / 120.0, p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0, p = p * r + 0.5, p = p * r + 1.0, p = p * r + 1.0;
    int64_t kb, bits;
    memcpy(&kb, &t, sizeof kb);
    bits = (kb - 0x4338000000000000LL + 1023) * ((int64_t)1 << 52);
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

CLONES static void exp_array_f64(double *restrict v, int n) {
    const v4 lo = {-708.0, -708.0, -708.0, -708.0}, hi = {709.0, 709.0, 709.0, 709.0};
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        v4 x = *(v4 *)(v + j);
        i4 m = x < lo; /* clamp by masks (C has no ?: on vectors) */
        x = (v4)(((i4)x & ~m) | ((i4)lo & m));
        m = x > hi;
        x = (v4)(((i4)x & ~m) | ((i4)hi & m));
        v4 t = x * LOG2E + SHIFTER;
        v4 k = t - SHIFTER;
        v4 r = (x - k * LN2_HI) - k * LN2_LO;
        v4 p = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
        p = p * r + 1.0 / 39916800.0, p = p * r + 1.0 / 3628800.0;
        p = p * r + 1.0 / 362880.0, p = p * r + 1.0 / 40320.0, p = p * r + 1.0 / 5040.0;
        p = p * r + 1.0 / 720.0, p = p * r + 1.0 / 120.0, p = p * r + 1.0 / 24.0;
        p = p * r + 1.0 / 6.0, p = p * r + 0.5, p = p * r + 1.0, p = p * r + 1.0;
        i4 bits = ((i4)t - 0x4338000000000000LL + 1023) << 52; /* t's low bits hold k */
        *(v4 *)(v + j) = p * (v4)bits;
    }
    for (; j < n; j++) v[j] = exp_one_f64(v[j]);
}


/* exp_array's float32 steps: x clamped to [-87, 88] (2^k stays a normal float), n by the
 * 1.5 * 2^23 trick, ln2 split so that n * LN2_HI_F is exact, e^r by its Taylor series to r^7
 * (relative error ~5e-9, under float32's 6e-8) */
#define LN2_HI_F 0.693145751953125f
#define LN2_LO_F 1.428606765330187045e-06f
#define SHIFTER_F 12582912.0f /* 1.5 * 2^23 */
typedef int32_t i8 __attribute__((vector_size(32), aligned(4)));

static float exp_one_f32(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float t = x * (float)LOG2E + SHIFTER_F;
    float k = t - SHIFTER_F;
    float r = (x - k * LN2_HI_F) - k * LN2_LO_F;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f, p = p * r + 1.0f / 120.0f, p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f, p = p * r + 0.5f, p = p * r + 1.0f, p = p * r + 1.0f;
    int32_t kb, bits;
    memcpy(&kb, &t, sizeof kb);
    bits = (kb - 0x4B400000 + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

CLONES static void exp_array_f32(float *restrict v, int n) {
    const v8f lo = {-87, -87, -87, -87, -87, -87, -87, -87}, hi = {88, 88, 88, 88, 88, 88, 88, 88};
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f x = *(v8f *)(v + j);
        i8 m = x < lo;
        x = (v8f)(((i8)x & ~m) | ((i8)lo & m));
        m = x > hi;
        x = (v8f)(((i8)x & ~m) | ((i8)hi & m));
        v8f t = x * (float)LOG2E + SHIFTER_F;
        v8f k = t - SHIFTER_F;
        v8f r = (x - k * LN2_HI_F) - k * LN2_LO_F;
        v8f p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
        p = p * r + 1.0f / 120.0f, p = p * r + 1.0f / 24.0f, p = p * r + 1.0f / 6.0f;
        p = p * r + 0.5f, p = p * r + 1.0f, p = p * r + 1.0f;
        i8 bits = ((i8)t - 0x4B400000 + 127) << 23; /* t's low bits hold k */
        *(v8f *)(v + j) = p * (v8f)bits;
    }
    for (; j < n; j++) v[j] = exp_one_f32(v[j]);
}

/* A per-thread scratch block of at least `words` 8-byte words, grown as needed and kept between
 * calls up to KEEP_WORDS (a larger one, for a component of thousands of flows, is given back
 * after its pass: arena_trim); NULL when memory runs out. */
#define KEEP_WORDS ((int64_t)8 << 20) /* 64 MB */
static __thread int64_t *block = NULL;
static __thread int64_t size = 0;

static void arena_trim(void) {
    if (size > KEEP_WORDS) free(block), block = NULL, size = 0;
}

static int64_t *arena(int64_t words) {
    if (words > size) {
        int64_t *grown = realloc(block, words * sizeof *grown);
        if (!grown) return NULL;
        block = grown, size = words;
    }
    return block;
}

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define F(x) CAT(x, SFX)

#define REAL double
#define VEC v4
#define LANES 4
#define SQRT sqrt
#define SFX f64
#define PASS m4ray_m4_pass
#include "_step_pass.h"
#undef REAL
#undef VEC
#undef LANES
#undef SQRT
#undef SFX
#undef PASS

#define REAL float
#define VEC v8f
#define LANES 8
#define SQRT sqrtf
#define SFX f32
#define PASS m4ray_m4_pass_f32
#include "_step_pass.h"

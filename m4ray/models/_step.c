/* m4's forward pass over one union graph, compiled: the arithmetic of
 * m4ray/models/numpy_step.py NumpyModel._pass (GRU time cells on the rows with dt > 0, SAGE
 * layers with sum aggregation in edge order and LayerNorm, GRU rate cells, the slowdown head),
 * in float64, for the small graphs where numpy's per-operation cost is most of a pass. Built and
 * loaded by numpy_step.py's native_step_library; no Python API, called through ctypes.
 *
 * Every output row is computed by the same loop whatever the other rows are (no blocking that
 * changes a sum's order, no fused multiply-add: -ffp-contract=off), so a graph's answers do not
 * depend on the batch it is stepped in, nor on the CPU's vector width. Against numpy's products
 * (BLAS, its own summation order) they agree to float64 rounding, not to the bit.
 *
 * Weights: one float64 buffer, each tensor at off[k] in the order of numpy_step.py's
 * native_layout (matrices as (in, out), y = x W + b, in strips of 8 columns: matmul). Returns 0, or 2 when memory
 * runs out. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC optimize("O3")

#define LN_EPS 1e-5 /* torch.nn.LayerNorm's default */

/* y[r][0..out) = x[r][0..in) W (no bias), rows of x at stride ldx, of y at stride ldy. W comes
 * in strips of 8 columns (numpy_step.py's _strips: strip s holds W[:, 8s:8s+8], zero-padded, as
 * in rows of 8), so a strip stays in L1 while every tile of rows walks it; a tile of R rows x 8
 * columns keeps its sums in registers (GCC's vector extension: AVX2 where the CPU has it, SSE2
 * pairs otherwise). Each y[r][j] is summed over i in order (one product, one add), as one row
 * alone would be, so every path gives the same bits. */
typedef double v4 __attribute__((vector_size(32), aligned(8)));

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* Tiles of 4, 2 and 1 rows x 8 columns; every sum in a register (no arrays: they would be
 * zeroed and spilled through the stack). */
CLONES static void tile4(int in, const double *restrict x, int ldx, const double *restrict ws,
                         double *restrict y, int ldy) {
    v4 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    const double *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    for (int i = 0; i < in; i++) {
        v4 lo = *(const v4 *)(ws + 8 * i), hi = *(const v4 *)(ws + 8 * i + 4);
        a0 += x0[i] * lo, b0 += x0[i] * hi;
        a1 += x1[i] * lo, b1 += x1[i] * hi;
        a2 += x2[i] * lo, b2 += x2[i] * hi;
        a3 += x3[i] * lo, b3 += x3[i] * hi;
    }
    *(v4 *)y = a0, *(v4 *)(y + 4) = b0, y += ldy;
    *(v4 *)y = a1, *(v4 *)(y + 4) = b1, y += ldy;
    *(v4 *)y = a2, *(v4 *)(y + 4) = b2, y += ldy;
    *(v4 *)y = a3, *(v4 *)(y + 4) = b3;
}

CLONES static void tile2(int in, const double *restrict x, int ldx, const double *restrict ws,
                         double *restrict y, int ldy) {
    v4 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0};
    const double *x0 = x, *x1 = x + ldx;
    for (int i = 0; i < in; i++) {
        v4 lo = *(const v4 *)(ws + 8 * i), hi = *(const v4 *)(ws + 8 * i + 4);
        a0 += x0[i] * lo, b0 += x0[i] * hi;
        a1 += x1[i] * lo, b1 += x1[i] * hi;
    }
    *(v4 *)y = a0, *(v4 *)(y + 4) = b0, y += ldy;
    *(v4 *)y = a1, *(v4 *)(y + 4) = b1;
}

CLONES static void tile1(int in, const double *restrict x, const double *restrict ws,
                         double *restrict y) {
    v4 a0 = {0}, b0 = {0};
    for (int i = 0; i < in; i++) {
        v4 lo = *(const v4 *)(ws + 8 * i), hi = *(const v4 *)(ws + 8 * i + 4);
        a0 += x[i] * lo, b0 += x[i] * hi;
    }
    *(v4 *)y = a0, *(v4 *)(y + 4) = b0;
}

/* The last rows of a block, 2 or 1, over 2 or 4 strips at once: as many sums in flight as a
 * 4-row tile has (a sum's adds wait on each other; 2 rows x 8 columns kept the FP units idle
 * half the time). Each sum's order is a 4-row tile's, so the bits are the same. */
CLONES static void tile2x16(int in, const double *restrict x, int ldx, const double *restrict ws,
                            double *restrict y, int ldy) {
    v4 a0 = {0}, b0 = {0}, c0 = {0}, d0 = {0}, a1 = {0}, b1 = {0}, c1 = {0}, d1 = {0};
    const double *x0 = x, *x1 = x + ldx, *w2 = ws + 8 * (int64_t)in;
    for (int i = 0; i < in; i++) {
        v4 lo = *(const v4 *)(ws + 8 * i), hi = *(const v4 *)(ws + 8 * i + 4);
        v4 lo2 = *(const v4 *)(w2 + 8 * i), hi2 = *(const v4 *)(w2 + 8 * i + 4);
        a0 += x0[i] * lo, b0 += x0[i] * hi, c0 += x0[i] * lo2, d0 += x0[i] * hi2;
        a1 += x1[i] * lo, b1 += x1[i] * hi, c1 += x1[i] * lo2, d1 += x1[i] * hi2;
    }
    *(v4 *)y = a0, *(v4 *)(y + 4) = b0, *(v4 *)(y + 8) = c0, *(v4 *)(y + 12) = d0;
    y += ldy;
    *(v4 *)y = a1, *(v4 *)(y + 4) = b1, *(v4 *)(y + 8) = c1, *(v4 *)(y + 12) = d1;
}

CLONES static void tile1x32(int in, const double *restrict x, const double *restrict ws,
                            double *restrict y) {
    v4 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    const int64_t s = 8 * (int64_t)in;
    const double *w1 = ws + s, *w2 = ws + 2 * s, *w3 = ws + 3 * s;
    for (int i = 0; i < in; i++) {
        const double v = x[i];
        a0 += v * *(const v4 *)(ws + 8 * i), b0 += v * *(const v4 *)(ws + 8 * i + 4);
        a1 += v * *(const v4 *)(w1 + 8 * i), b1 += v * *(const v4 *)(w1 + 8 * i + 4);
        a2 += v * *(const v4 *)(w2 + 8 * i), b2 += v * *(const v4 *)(w2 + 8 * i + 4);
        a3 += v * *(const v4 *)(w3 + 8 * i), b3 += v * *(const v4 *)(w3 + 8 * i + 4);
    }
    *(v4 *)y = a0, *(v4 *)(y + 4) = b0, *(v4 *)(y + 8) = a1, *(v4 *)(y + 12) = b1;
    *(v4 *)(y + 16) = a2, *(v4 *)(y + 20) = b2, *(v4 *)(y + 24) = a3, *(v4 *)(y + 28) = b3;
}

CLONES static void matmul(int64_t n, int in, int out, const double *restrict x, int ldx,
                   const double *restrict w, double *restrict y, int ldy) {
    double part[4 * 8]; /* a last strip narrower than 8 columns lands here first */
    const int full = out / 8 * 8; /* columns in whole strips */
    for (int64_t r0 = 0; r0 < n; r0 += 64) { /* 64 rows of x stay in L2 across the strips */
        int64_t r1 = r0 + 64 < n ? r0 + 64 : n;
        int64_t r4 = r0 + (r1 - r0) / 4 * 4; /* rows from r4 on: wide tiles where they fit */
        int j2 = r1 - r4 >= 2 ? full / 16 * 16 : 0, j1 = (r1 - r4) % 2 ? full / 32 * 32 : 0;
        if (j2)
            for (int j0 = 0; j0 < j2; j0 += 16)
                tile2x16(in, x + r4 * ldx, ldx, w + (int64_t)j0 * in, y + r4 * ldy + j0, ldy);
        if (j1)
            for (int j0 = 0; j0 < j1; j0 += 32)
                tile1x32(in, x + (r1 - 1) * ldx, w + (int64_t)j0 * in, y + (r1 - 1) * ldy + j0);
        for (int j0 = 0; j0 < out; j0 += 8) {
            const double *ws = w + (int64_t)j0 * in; /* strip j0 / 8: in rows of 8 */
            int cnt = out - j0 < 8 ? out - j0 : 8;
            for (int64_t r = r0; r < r1;) {
                int step = r1 - r >= 4 ? 4 : r1 - r >= 2 ? 2 : 1;
                if ((step == 2 && j0 < j2) || (step == 1 && j0 < j1)) { /* done wide above */
                    r += step;
                    continue;
                }
                double *yt = cnt == 8 ? y + r * ldy + j0 : part;
                int ldt = cnt == 8 ? ldy : 8;
                if (step == 4)
                    tile4(in, x + r * ldx, ldx, ws, yt, ldt);
                else if (step == 2)
                    tile2(in, x + r * ldx, ldx, ws, yt, ldt);
                else
                    tile1(in, x + r * ldx, ws, yt);
                if (cnt < 8)
                    for (int q = 0; q < step; q++)
                        for (int j = 0; j < cnt; j++) y[(r + q) * ldy + j0 + j] = part[q * 8 + j];
                r += step;
            }
        }
    }
}

CLONES static void add_bias(int64_t n, int out, double *y, int ldy, const double *b) {
    for (int64_t r = 0; r < n; r++)
        for (int j = 0; j < out; j++) y[r * ldy + j] += b[j];
}

/* exp over an array, branch-free so that it vectorizes: x = n ln2 + r (|r| <= ln2 / 2, n by
 * the 1.5 * 2^52 rounding trick, ln2 split so that n * LN2_HI is exact), e^r by its Taylor
 * series to r^13 (relative error ~2e-16), times 2^n built in the exponent bits. x is clamped to
 * [-708, 709] first: beyond it a gate is 0 or 1 to float64's precision either way. */
#define LN2_HI 6.93147180369123816490e-01
#define LN2_LO 1.90821492927058770002e-10
#define LOG2E 1.44269504088896338700e+00
#define SHIFTER 6755399441055744.0 /* 1.5 * 2^52 */
typedef int64_t i4 __attribute__((vector_size(32), aligned(8)));

static double exp_one(double x) { /* the same steps as exp_array's lanes, for its tail */
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

CLONES static void exp_array(double *restrict v, int n) {
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
    for (; j < n; j++) v[j] = exp_one(v[j]);
}

/* One GRU cell (torch.nn.GRUCell) on the n rows listed in rows (NULL: rows 0..n-1): input x
 * (width in, stride ldx), state h (width H), new state into out (stride H); gi, gh: scratch of
 * n x 3H. A row not listed keeps nothing here: the caller copies it. */
CLONES static void gru(int64_t n, const int64_t *rows, int in, int H, const double *x, int ldx,
                const double *h, const double *w_ih, const double *w_hh, const double *b_ih,
                const double *b_hh, double *out, double *xs, double *hs, double *gi,
                double *gh) {
    const double *xx = x, *hh = h;
    int lx = ldx;
    if (rows) { /* gather the rows that move */
        for (int64_t k = 0; k < n; k++) {
            memcpy(xs + k * in, x + rows[k] * ldx, in * sizeof(double));
            memcpy(hs + k * H, h + rows[k] * H, H * sizeof(double));
        }
        xx = xs, hh = hs, lx = in;
    }
    matmul(n, in, 3 * H, xx, lx, w_ih, gi, 3 * H);
    add_bias(n, 3 * H, gi, 3 * H, b_ih);
    matmul(n, H, 3 * H, hh, H, w_hh, gh, 3 * H);
    add_bias(n, 3 * H, gh, 3 * H, b_hh);
    for (int64_t k = 0; k < n; k++) {
        double *a = gi + k * 3 * H, *b = gh + k * 3 * H;
        const double *hk = hh + k * H;
        double *o = out + (rows ? rows[k] : k) * H;
        for (int j = 0; j < 2 * H; j++) a[j] = -(a[j] + b[j]); /* r and z: sigmoid(a + b) */
        exp_array(a, 2 * H);
        for (int j = 0; j < 2 * H; j++) a[j] = 1.0 / (1.0 + a[j]);
        double *nn = a + 2 * H; /* n = tanh(a + r b) = 1 - 2 / (e^2(a + r b) + 1) */
        for (int j = 0; j < H; j++) nn[j] = 2.0 * (nn[j] + a[j] * b[2 * H + j]);
        exp_array(nn, H);
        for (int j = 0; j < H; j++) {
            double z = a[H + j], t = 1.0 - 2.0 / (nn[j] + 1.0);
            o[j] = (1 - z) * t + z * hk[j];
        }
    }
}

/* The GRU time cell on the rows with dt > 0; the others keep their state. */
CLONES static void timed(int64_t n, int H, const double *h, const double *dt, const double *const *w,
                  double *out, int64_t *rows, double *xs, double *hs, double *gi, double *gh) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (dt[i] > 0) rows[m++] = i;
    memcpy(out, h, n * H * sizeof(double));
    if (m) gru(m, rows, 1, H, dt, 1, h, w[0], w[1], w[2], w[3], out, xs, hs, gi, gh);
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

/* dims: H (hidden), G (GNN hidden), layers, P (per-flow inputs), F (fluid inputs, 0 without the
 * anchor). Rows: n_f flows, n_l links, n_e (flow, link) edges (inc_f[e], inc_l[e], local rows).
 * Outputs: new_flow (n_f x H), new_link (n_l x H), slowdown (n_f). */
CLONES int m4ray_m4_pass(const int64_t *dims, const double *wbuf, const int64_t *off, int64_t n_f,
                  int64_t n_l, const double *h_flow, const double *h_link, const double *dt_flow,
                  const double *dt_link, int64_t n_e, const int64_t *inc_f,
                  const int64_t *inc_l, const double *params, const double *n_links,
                  const double *base, const double *fluid, double *new_flow, double *new_link,
                  double *slowdown) {
    const int H = (int)dims[0], G = (int)dims[1], layers = (int)dims[2], P = (int)dims[3],
              F = (int)dims[4];
    const int64_t n = n_f + n_l;
    int wide = 3 * H > G ? 3 * H : G;
    int d_rate = H + P + F, d_head = 1 + P + F + H;
    if (d_rate > wide) wide = d_rate;
    if (d_head > wide) wide = d_head;
    int64_t k = 0; /* next tensor */
#define W(i) (wbuf + off[i])
    int rc = 2;
    /* scratch from one per-thread arena, kept between calls (fresh megabytes per call cost
     * page faults on the large components): 8-byte words throughout */
    int64_t m = n ? n : 1, words = m * (5 * wide + 8 * H + 3) + 2 * n_e + 2;
    int64_t *base_ = arena(words);
    if (!base_) goto out;
    double *x = (double *)base_, *x2 = x + m * wide, *msg = x2 + m * wide, *agg = msg + m * wide;
    double *xs = agg + m * wide, *gi = xs + m * wide, *gh = gi + m * 3 * H, *hs = gh + m * 3 * H;
    double *ht = hs + m * H;
    int64_t *rows = (int64_t *)(ht + m * H), *fill = rows + m, *ptr = fill + m;
    int64_t *src = ptr + m + 1;
    memset(ptr, 0, (n + 1) * sizeof *ptr);

    /* GRU time cells: ht = [h_flow'; h_link'] (H wide), the GNN's input x */
    const double *tw[4] = {W(k), W(k + 1), W(k + 2), W(k + 3)};
    const double *tlw[4] = {W(k + 4), W(k + 5), W(k + 6), W(k + 7)};
    k += 8;
    timed(n_f, H, h_flow, dt_flow, tw, ht, rows, xs, hs, gi, gh);
    timed(n_l, H, h_link, dt_link, tlw, ht + n_f * H, rows, xs, hs, gi, gh);
    memcpy(x, ht, n * H * sizeof(double));

    /* in-edges of each node in edge order: a link's from its flows (the edges as listed), a
     * flow's from its links (the edges as listed): numpy's stable sort by target */
    for (int64_t e = 0; e < n_e; e++) ptr[inc_f[e] + 1]++, ptr[n_f + inc_l[e] + 1]++;
    for (int64_t i = 0; i < n; i++) ptr[i + 1] += ptr[i], fill[i] = ptr[i];
    for (int64_t e = 0; e < n_e; e++) src[fill[n_f + inc_l[e]]++] = inc_f[e];
    for (int64_t e = 0; e < n_e; e++) src[fill[inc_f[e]]++] = n_f + inc_l[e];

    /* SAGE layers: x (width a) -> x (width b) */
    int a = H;
    for (int layer = 0; layer < layers; layer++) {
        int b = layer == layers - 1 ? H : G;
        const double *w_lin = W(k), *b_lin = W(k + 1), *w_l = W(k + 2), *b_l = W(k + 3),
                     *w_r = W(k + 4), *g_n = W(k + 5), *b_n = W(k + 6);
        k += 7;
        matmul(n, a, a, x, a, w_lin, msg, a);
        add_bias(n, a, msg, a, b_lin);
        for (int64_t i = 0; i < n * a; i++) msg[i] = msg[i] > 0.0 ? msg[i] : 0.0;
        for (int64_t t = 0; t < n; t++) {
            double *s = agg + t * a;
            for (int j = 0; j < a; j++) s[j] = 0.0;
            for (int64_t q = ptr[t]; q < ptr[t + 1]; q++) {
                const double *m = msg + src[q] * a;
                for (int j = 0; j < a; j++) s[j] += m[j];
            }
        }
        matmul(n, a, b, agg, a, w_l, x2, b);
        add_bias(n, b, x2, b, b_l);
        matmul(n, a, b, x, a, w_r, msg, b); /* msg is free again */
        for (int64_t t = 0; t < n; t++) {
            double *y = x2 + t * b;
            const double *rr = msg + t * b;
            double sum = 0.0;
            for (int j = 0; j < b; j++) y[j] += rr[j], sum += y[j];
            double mean = sum / b, var = 0.0;
            for (int j = 0; j < b; j++) var += (y[j] - mean) * (y[j] - mean);
            double sd = sqrt(var / b + LN_EPS);
            double *o = x + t * b;
            for (int j = 0; j < b; j++) o[j] = (y[j] - mean) / sd * g_n[j] + b_n[j];
        }
        a = b;
    }

    /* GRU rate cells: flows read [x, params, fluid] with their timed states, links x */
    const int64_t rf = k, rl = k + 4, hd = k + 8;
    for (int64_t i = 0; i < n_f; i++) {
        double *r = x2 + i * d_rate;
        memcpy(r, x + i * H, H * sizeof(double));
        memcpy(r + H, params + i * P, P * sizeof(double));
        if (F) memcpy(r + H + P, fluid + i * F, F * sizeof(double));
    }
    gru(n_f, NULL, d_rate, H, x2, d_rate, ht, W(rf), W(rf + 1), W(rf + 2), W(rf + 3), new_flow,
        xs, hs, gi, gh);
    gru(n_l, NULL, H, H, x + n_f * H, H, ht + n_f * H, W(rl), W(rl + 1), W(rl + 2), W(rl + 3),
        new_link, xs, hs, gi, gh);

    /* the head: [n_links, params, fluid, new state] -> ReLU layer -> slowdown */
    for (int64_t i = 0; i < n_f; i++) {
        double *r = x2 + i * d_head;
        r[0] = n_links[i];
        memcpy(r + 1, params + i * P, P * sizeof(double));
        if (F) memcpy(r + 1 + P, fluid + i * F, F * sizeof(double));
        memcpy(r + 1 + P + F, new_flow + i * H, H * sizeof(double));
    }
    matmul(n_f, d_head, H, x2, d_head, W(hd), msg, H);
    add_bias(n_f, H, msg, H, W(hd + 1));
    for (int64_t i = 0; i < n_f * H; i++) msg[i] = msg[i] > 0.0 ? msg[i] : 0.0;
    matmul(n_f, H, 1, msg, H, W(hd + 2), agg, 1);
    const double b_out = W(hd + 3)[0];
    for (int64_t i = 0; i < n_f; i++) {
        double o = agg[i] + b_out;
        double s = F ? base[i] * (1 + o) : o;
        slowdown[i] = s > 1.0 ? s : 1.0; /* np.maximum: a NaN stays NaN */
        if (isnan(s)) slowdown[i] = s;
    }
    rc = 0;
out:
    arena_trim();
#undef W
    return rc;
}

/* m4's forward pass in one float type, included by _step.c once per type with
 *   REAL   the float type (double, float)    VEC   REAL's 32-byte vector (GCC's extension)
 *   LANES  VEC's lanes (4, 8)                SQRT  REAL's square root
 *   F(x)   x with the type's suffix (x_f64, x_f32): static names stay apart
 *   PASS   the exported entry point           exp_array's F(...) is defined before, per type
 * Weights come in strips of STRIP = 2 LANES columns (numpy_step.py's _strips), so a tile's sums
 * are 2 vectors per row in either type. Nothing here depends on the type beyond these names. */
#define STRIP (2 * LANES)
#define K(x) ((REAL)(x))

/* y[r][0..out) = x[r][0..in) W (no bias), rows of x at stride ldx, of y at stride ldy. W comes
 * in strips of STRIP columns (strip s holds W[:, STRIP s : STRIP (s + 1)], zero-padded, as in
 * rows of STRIP), so a strip stays in L1 while every tile of rows walks it; a tile of R rows x
 * STRIP columns keeps its sums in registers (AVX2 where the CPU has it, SSE2 pairs otherwise).
 * Each y[r][j] is summed over i in order (one product, one add), as one row alone would be, so
 * every path gives the same bits. Tiles of 4, 2 and 1 rows; every sum in a register (no arrays:
 * they would be zeroed and spilled through the stack). */
CLONES static void F(tile4)(int in, const REAL *restrict x, int ldx, const REAL *restrict ws,
                            REAL *restrict y, int ldy) {
    VEC a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    const REAL *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    for (int i = 0; i < in; i++) {
        VEC lo = *(const VEC *)(ws + STRIP * i), hi = *(const VEC *)(ws + STRIP * i + LANES);
        a0 += x0[i] * lo, b0 += x0[i] * hi;
        a1 += x1[i] * lo, b1 += x1[i] * hi;
        a2 += x2[i] * lo, b2 += x2[i] * hi;
        a3 += x3[i] * lo, b3 += x3[i] * hi;
    }
    *(VEC *)y = a0, *(VEC *)(y + LANES) = b0, y += ldy;
    *(VEC *)y = a1, *(VEC *)(y + LANES) = b1, y += ldy;
    *(VEC *)y = a2, *(VEC *)(y + LANES) = b2, y += ldy;
    *(VEC *)y = a3, *(VEC *)(y + LANES) = b3;
}

CLONES static void F(tile2)(int in, const REAL *restrict x, int ldx, const REAL *restrict ws,
                            REAL *restrict y, int ldy) {
    VEC a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0};
    const REAL *x0 = x, *x1 = x + ldx;
    for (int i = 0; i < in; i++) {
        VEC lo = *(const VEC *)(ws + STRIP * i), hi = *(const VEC *)(ws + STRIP * i + LANES);
        a0 += x0[i] * lo, b0 += x0[i] * hi;
        a1 += x1[i] * lo, b1 += x1[i] * hi;
    }
    *(VEC *)y = a0, *(VEC *)(y + LANES) = b0, y += ldy;
    *(VEC *)y = a1, *(VEC *)(y + LANES) = b1;
}

CLONES static void F(tile1)(int in, const REAL *restrict x, const REAL *restrict ws,
                            REAL *restrict y) {
    VEC a0 = {0}, b0 = {0};
    for (int i = 0; i < in; i++) {
        VEC lo = *(const VEC *)(ws + STRIP * i), hi = *(const VEC *)(ws + STRIP * i + LANES);
        a0 += x[i] * lo, b0 += x[i] * hi;
    }
    *(VEC *)y = a0, *(VEC *)(y + LANES) = b0;
}

/* The last rows of a block, 2 or 1, over 2 or 4 strips at once: as many sums in flight as a
 * 4-row tile has (a sum's adds wait on each other; 2 rows x 1 strip kept the FP units idle
 * half the time). Each sum's order is a 4-row tile's, so the bits are the same. */
CLONES static void F(tile2x2)(int in, const REAL *restrict x, int ldx, const REAL *restrict ws,
                              REAL *restrict y, int ldy) {
    VEC a0 = {0}, b0 = {0}, c0 = {0}, d0 = {0}, a1 = {0}, b1 = {0}, c1 = {0}, d1 = {0};
    const REAL *x0 = x, *x1 = x + ldx, *w2 = ws + STRIP * (int64_t)in;
    for (int i = 0; i < in; i++) {
        VEC lo = *(const VEC *)(ws + STRIP * i), hi = *(const VEC *)(ws + STRIP * i + LANES);
        VEC lo2 = *(const VEC *)(w2 + STRIP * i), hi2 = *(const VEC *)(w2 + STRIP * i + LANES);
        a0 += x0[i] * lo, b0 += x0[i] * hi, c0 += x0[i] * lo2, d0 += x0[i] * hi2;
        a1 += x1[i] * lo, b1 += x1[i] * hi, c1 += x1[i] * lo2, d1 += x1[i] * hi2;
    }
    *(VEC *)y = a0, *(VEC *)(y + LANES) = b0;
    *(VEC *)(y + STRIP) = c0, *(VEC *)(y + STRIP + LANES) = d0;
    y += ldy;
    *(VEC *)y = a1, *(VEC *)(y + LANES) = b1;
    *(VEC *)(y + STRIP) = c1, *(VEC *)(y + STRIP + LANES) = d1;
}

CLONES static void F(tile1x4)(int in, const REAL *restrict x, const REAL *restrict ws,
                              REAL *restrict y) {
    VEC a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    const int64_t s = STRIP * (int64_t)in;
    const REAL *w1 = ws + s, *w2 = ws + 2 * s, *w3 = ws + 3 * s;
    for (int i = 0; i < in; i++) {
        const REAL v = x[i];
        const int64_t o = STRIP * i;
        a0 += v * *(const VEC *)(ws + o), b0 += v * *(const VEC *)(ws + o + LANES);
        a1 += v * *(const VEC *)(w1 + o), b1 += v * *(const VEC *)(w1 + o + LANES);
        a2 += v * *(const VEC *)(w2 + o), b2 += v * *(const VEC *)(w2 + o + LANES);
        a3 += v * *(const VEC *)(w3 + o), b3 += v * *(const VEC *)(w3 + o + LANES);
    }
    *(VEC *)y = a0, *(VEC *)(y + LANES) = b0;
    *(VEC *)(y + STRIP) = a1, *(VEC *)(y + STRIP + LANES) = b1;
    *(VEC *)(y + 2 * STRIP) = a2, *(VEC *)(y + 2 * STRIP + LANES) = b2;
    *(VEC *)(y + 3 * STRIP) = a3, *(VEC *)(y + 3 * STRIP + LANES) = b3;
}

CLONES static void F(matmul)(int64_t n, int in, int out, const REAL *restrict x, int ldx,
                             const REAL *restrict w, REAL *restrict y, int ldy) {
    REAL part[4 * STRIP]; /* a last strip narrower than STRIP columns lands here first */
    const int full = out / STRIP * STRIP; /* columns in whole strips */
    for (int64_t r0 = 0; r0 < n; r0 += 64) { /* 64 rows of x stay in L2 across the strips */
        int64_t r1 = r0 + 64 < n ? r0 + 64 : n;
        int64_t r4 = r0 + (r1 - r0) / 4 * 4; /* rows from r4 on: wide tiles where they fit */
        int j2 = r1 - r4 >= 2 ? full / (2 * STRIP) * (2 * STRIP) : 0;
        int j1 = (r1 - r4) % 2 ? full / (4 * STRIP) * (4 * STRIP) : 0;
        if (j2)
            for (int j0 = 0; j0 < j2; j0 += 2 * STRIP)
                F(tile2x2)(in, x + r4 * ldx, ldx, w + (int64_t)j0 * in, y + r4 * ldy + j0, ldy);
        if (j1)
            for (int j0 = 0; j0 < j1; j0 += 4 * STRIP)
                F(tile1x4)(in, x + (r1 - 1) * ldx, w + (int64_t)j0 * in, y + (r1 - 1) * ldy + j0);
        for (int j0 = 0; j0 < out; j0 += STRIP) {
            const REAL *ws = w + (int64_t)j0 * in; /* strip j0 / STRIP: in rows of STRIP */
            int cnt = out - j0 < STRIP ? out - j0 : STRIP;
            for (int64_t r = r0; r < r1;) {
                int step = r1 - r >= 4 ? 4 : r1 - r >= 2 ? 2 : 1;
                if ((step == 2 && j0 < j2) || (step == 1 && j0 < j1)) { /* done wide above */
                    r += step;
                    continue;
                }
                REAL *yt = cnt == STRIP ? y + r * ldy + j0 : part;
                int ldt = cnt == STRIP ? ldy : STRIP;
                if (step == 4)
                    F(tile4)(in, x + r * ldx, ldx, ws, yt, ldt);
                else if (step == 2)
                    F(tile2)(in, x + r * ldx, ldx, ws, yt, ldt);
                else
                    F(tile1)(in, x + r * ldx, ws, yt);
                if (cnt < STRIP)
                    for (int q = 0; q < step; q++)
                        for (int j = 0; j < cnt; j++)
                            y[(r + q) * ldy + j0 + j] = part[q * STRIP + j];
                r += step;
            }
        }
    }
}

CLONES static void F(add_bias)(int64_t n, int out, REAL *y, int ldy, const REAL *b) {
    for (int64_t r = 0; r < n; r++)
        for (int j = 0; j < out; j++) y[r * ldy + j] += b[j];
}

/* One GRU cell (torch.nn.GRUCell) on the n rows listed in rows (NULL: rows 0..n-1): input x
 * (width in, stride ldx), state h (width H), new state into out (stride H); gi, gh: scratch of
 * n x 3H. A row not listed keeps nothing here: the caller copies it. */
CLONES static void F(gru)(int64_t n, const int64_t *rows, int in, int H, const REAL *x, int ldx,
                          const REAL *h, const REAL *w_ih, const REAL *w_hh, const REAL *b_ih,
                          const REAL *b_hh, REAL *out, REAL *xs, REAL *hs, REAL *gi, REAL *gh) {
    const REAL *xx = x, *hh = h;
    int lx = ldx;
    if (rows) { /* gather the rows that move */
        for (int64_t k = 0; k < n; k++) {
            memcpy(xs + k * in, x + rows[k] * ldx, in * sizeof(REAL));
            memcpy(hs + k * H, h + rows[k] * H, H * sizeof(REAL));
        }
        xx = xs, hh = hs, lx = in;
    }
    F(matmul)(n, in, 3 * H, xx, lx, w_ih, gi, 3 * H);
    F(add_bias)(n, 3 * H, gi, 3 * H, b_ih);
    F(matmul)(n, H, 3 * H, hh, H, w_hh, gh, 3 * H);
    F(add_bias)(n, 3 * H, gh, 3 * H, b_hh);
    for (int64_t k = 0; k < n; k++) {
        REAL *a = gi + k * 3 * H, *b = gh + k * 3 * H;
        const REAL *hk = hh + k * H;
        REAL *o = out + (rows ? rows[k] : k) * H;
        for (int j = 0; j < 2 * H; j++) a[j] = -(a[j] + b[j]); /* r and z: sigmoid(a + b) */
        F(exp_array)(a, 2 * H);
        for (int j = 0; j < 2 * H; j++) a[j] = K(1) / (K(1) + a[j]);
        REAL *nn = a + 2 * H; /* n = tanh(a + r b) = 1 - 2 / (e^2(a + r b) + 1) */
        for (int j = 0; j < H; j++) nn[j] = K(2) * (nn[j] + a[j] * b[2 * H + j]);
        F(exp_array)(nn, H);
        for (int j = 0; j < H; j++) {
            REAL z = a[H + j], t = K(1) - K(2) / (nn[j] + K(1));
            o[j] = (K(1) - z) * t + z * hk[j];
        }
    }
}

/* The GRU time cell on the rows with dt > 0; the others keep their state. */
CLONES static void F(timed)(int64_t n, int H, const REAL *h, const REAL *dt,
                            const REAL *const *w, REAL *out, int64_t *rows, REAL *xs, REAL *hs,
                            REAL *gi, REAL *gh) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (dt[i] > 0) rows[m++] = i;
    memcpy(out, h, n * H * sizeof(REAL));
    if (m) F(gru)(m, rows, 1, H, dt, 1, h, w[0], w[1], w[2], w[3], out, xs, hs, gi, gh);
}

/* n values of a float64 array as REAL, into scratch (float64 itself is read where it is) */
static const REAL *F(as_real)(const double *v, int64_t n, REAL **scratch) {
    if (sizeof(REAL) == sizeof(double) || !v) return (const REAL *)v;
    REAL *out = *scratch;
    for (int64_t i = 0; i < n; i++) out[i] = (REAL)v[i];
    *scratch += n;
    return out;
}

/* dims: H (hidden), G (GNN hidden), layers, P (per-flow inputs), F (fluid inputs, 0 without the
 * anchor). Rows: n_f flows, n_l links, n_e (flow, link) edges (inc_f[e], inc_l[e], local rows).
 * Inputs and outputs are float64 whatever REAL is (the engine keeps float64 states): new_flow
 * (n_f x H), new_link (n_l x H), slowdown (n_f: the anchor's base times 1 + the head's output,
 * formed in float64). */
CLONES int PASS(const int64_t *dims, const REAL *wbuf, const int64_t *off, int64_t n_f,
                int64_t n_l, const double *h_flow_, const double *h_link_,
                const double *dt_flow_, const double *dt_link_, int64_t n_e,
                const int64_t *inc_f, const int64_t *inc_l, const double *params_,
                const double *n_links_, const double *base, const double *fluid_,
                double *new_flow_, double *new_link_, double *slowdown) {
    const int H = (int)dims[0], G = (int)dims[1], layers = (int)dims[2], P = (int)dims[3],
              Fl = (int)dims[4];
    const int64_t n = n_f + n_l;
    int wide = 3 * H > G ? 3 * H : G;
    int d_rate = H + P + Fl, d_head = 1 + P + Fl + H;
    if (d_rate > wide) wide = d_rate;
    if (d_head > wide) wide = d_head;
    int64_t k = 0; /* next tensor */
#define W(i) (wbuf + off[i])
    int rc = 2;
    const int conv = sizeof(REAL) != sizeof(double); /* inputs and states to convert */
    /* scratch from one per-thread arena, kept between calls (fresh megabytes per call cost
     * page faults on the large components): the index arrays in 8-byte words, then REALs */
    int64_t m = n ? n : 1;
    int64_t reals = m * (5 * wide + 8 * H) + conv * (2 * n * H + n_f * (P + Fl + 2) + n_l);
    int64_t idx = 3 * m + 2 * n_e + 2;
    int64_t *base_ = arena(idx + (reals * (int64_t)sizeof(REAL) + 7) / 8);
    if (!base_) goto out;
    int64_t *rows = base_, *fill = rows + m, *ptr = fill + m, *src = ptr + m + 1;
    REAL *x = (REAL *)(base_ + idx), *x2 = x + m * wide, *msg = x2 + m * wide;
    REAL *agg = msg + m * wide, *xs = agg + m * wide, *gi = xs + m * wide, *gh = gi + m * 3 * H;
    REAL *hs = gh + m * 3 * H, *ht = hs + m * H;
    REAL *more = ht + m * H; /* conv: the inputs as REAL, the new states before float64 */
    const REAL *h_flow = F(as_real)(h_flow_, n_f * H, &more);
    const REAL *h_link = F(as_real)(h_link_, n_l * H, &more);
    const REAL *dt_flow = F(as_real)(dt_flow_, n_f, &more);
    const REAL *dt_link = F(as_real)(dt_link_, n_l, &more);
    const REAL *params = F(as_real)(params_, n_f * P, &more);
    const REAL *n_links = F(as_real)(n_links_, n_f, &more);
    const REAL *fluid = F(as_real)(fluid_, n_f * Fl, &more);
    REAL *new_flow = conv ? more : (REAL *)new_flow_;
    REAL *new_link = conv ? new_flow + n_f * H : (REAL *)new_link_;
    memset(ptr, 0, (n + 1) * sizeof *ptr);

    /* GRU time cells: ht = [h_flow'; h_link'] (H wide), the GNN's input x */
    const REAL *tw[4] = {W(k), W(k + 1), W(k + 2), W(k + 3)};
    const REAL *tlw[4] = {W(k + 4), W(k + 5), W(k + 6), W(k + 7)};
    k += 8;
    F(timed)(n_f, H, h_flow, dt_flow, tw, ht, rows, xs, hs, gi, gh);
    F(timed)(n_l, H, h_link, dt_link, tlw, ht + n_f * H, rows, xs, hs, gi, gh);
    memcpy(x, ht, n * H * sizeof(REAL));

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
        const REAL *w_lin = W(k), *b_lin = W(k + 1), *w_l = W(k + 2), *b_l = W(k + 3),
                   *w_r = W(k + 4), *g_n = W(k + 5), *b_n = W(k + 6);
        k += 7;
        F(matmul)(n, a, a, x, a, w_lin, msg, a);
        F(add_bias)(n, a, msg, a, b_lin);
        for (int64_t i = 0; i < n * a; i++) msg[i] = msg[i] > K(0) ? msg[i] : K(0);
        for (int64_t t = 0; t < n; t++) {
            REAL *s = agg + t * a;
            for (int j = 0; j < a; j++) s[j] = K(0);
            for (int64_t q = ptr[t]; q < ptr[t + 1]; q++) {
                const REAL *mq = msg + src[q] * a;
                for (int j = 0; j < a; j++) s[j] += mq[j];
            }
        }
        F(matmul)(n, a, b, agg, a, w_l, x2, b);
        F(add_bias)(n, b, x2, b, b_l);
        F(matmul)(n, a, b, x, a, w_r, msg, b); /* msg is free again */
        for (int64_t t = 0; t < n; t++) {
            REAL *y = x2 + t * b;
            const REAL *rr = msg + t * b;
            REAL sum = K(0);
            for (int j = 0; j < b; j++) y[j] += rr[j], sum += y[j];
            REAL mean = sum / b, var = K(0);
            for (int j = 0; j < b; j++) var += (y[j] - mean) * (y[j] - mean);
            REAL sd = SQRT(var / b + K(LN_EPS));
            REAL *o = x + t * b;
            for (int j = 0; j < b; j++) o[j] = (y[j] - mean) / sd * g_n[j] + b_n[j];
        }
        a = b;
    }

    /* GRU rate cells: flows read [x, params, fluid] with their timed states, links x */
    const int64_t rf = k, rl = k + 4, hd = k + 8;
    for (int64_t i = 0; i < n_f; i++) {
        REAL *r = x2 + i * d_rate;
        memcpy(r, x + i * H, H * sizeof(REAL));
        memcpy(r + H, params + i * P, P * sizeof(REAL));
        if (Fl) memcpy(r + H + P, fluid + i * Fl, Fl * sizeof(REAL));
    }
    F(gru)(n_f, NULL, d_rate, H, x2, d_rate, ht, W(rf), W(rf + 1), W(rf + 2), W(rf + 3),
           new_flow, xs, hs, gi, gh);
    F(gru)(n_l, NULL, H, H, x + n_f * H, H, ht + n_f * H, W(rl), W(rl + 1), W(rl + 2),
           W(rl + 3), new_link, xs, hs, gi, gh);

    /* the head: [n_links, params, fluid, new state] -> ReLU layer -> slowdown */
    for (int64_t i = 0; i < n_f; i++) {
        REAL *r = x2 + i * d_head;
        r[0] = n_links[i];
        memcpy(r + 1, params + i * P, P * sizeof(REAL));
        if (Fl) memcpy(r + 1 + P, fluid + i * Fl, Fl * sizeof(REAL));
        memcpy(r + 1 + P + Fl, new_flow + i * H, H * sizeof(REAL));
    }
    F(matmul)(n_f, d_head, H, x2, d_head, W(hd), msg, H);
    F(add_bias)(n_f, H, msg, H, W(hd + 1));
    for (int64_t i = 0; i < n_f * H; i++) msg[i] = msg[i] > K(0) ? msg[i] : K(0);
    F(matmul)(n_f, H, 1, msg, H, W(hd + 2), agg, 1);
    const REAL b_out = W(hd + 3)[0];
    for (int64_t i = 0; i < n_f; i++) {
        double o = (double)(agg[i] + b_out);
        double s = Fl ? base[i] * (1 + o) : o;
        slowdown[i] = s > 1.0 ? s : 1.0; /* np.maximum: a NaN stays NaN */
        if (isnan(s)) slowdown[i] = s;
    }
    if (conv) {
        for (int64_t i = 0; i < n_f * H; i++) new_flow_[i] = (double)new_flow[i];
        for (int64_t i = 0; i < n_l * H; i++) new_link_[i] = (double)new_link[i];
    }
    rc = 0;
out:
    arena_trim();
#undef W
    return rc;
}

#undef STRIP
#undef K

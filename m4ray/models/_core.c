/* The m4 engine's compiled core. The fluid anchor's hot loops: the same algorithm, operation for operation, as
 * m4ray/models/fluid.py (Fluid._drain, Fluid._share, Fluid.advance) and
 * m4ray/sim/flowsim.py (max_min_rates with per-flow caps), so the two agree to rounding.
 * Built and loaded by m4ray/native.py; no Python API, called through ctypes.
 *
 * Flow state is one row-major block `state[N_FIELDS][n_rows]` (Fluid's arrays are its rows); the
 * flows an update covers are `rows[n]` with their links in CSR form: flow i crosses
 * `idx[off[i]] .. idx[off[i + 1] - 1]`, ids into `capacity`. `slot` is caller-owned scratch of
 * one int64 per link, all -1 on entry and left so.
 *
 * With ACK load (`ackload`, NULL: off; fluid.py's `acks`), a link's capacity for max-min is what
 * the ACKs of the data on its reverse link leave (flowsim.ack_capacity), and a share runs three times,
 * the rows' rates going into the per-link data rates after each (Fluid._share); `data` changes
 * only through set_rates, in the same order as Python's loops, so the two agree to the bit.
 *
 * Returns 0, or 2 when memory runs out. Units: bits, bits/s, seconds. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REL_TIE 1e-9
#define ACK_PASSES 3 /* flowsim.ACK_PASSES */

/* the order of Fluid._ARRAYS */
enum { WORK, LEFT, RATE, CAP, T_LAST, START, IDEAL, DELAY, BOTTLENECK, DRAINED, N_FIELDS };

typedef struct {
    double *f[N_FIELDS];
    /* FIFO service (Fluid's fifo_bits; flowSim's service="fifo"): rows of at most fifo_bits of
     * work are shared in order of arrival (fairshare.fifo_rates); fifo 0: max-min */
    int fifo;
    double fifo_bits;
} fluid;

typedef struct {
    double frac;            /* ACK wire bits per data wire bit */
    const int64_t *reverse; /* [n_links] the link that carries a link's data's ACKs' (-1: none) */
    double *data;           /* [n_links] Σ rates of the rows crossing each link */
} ackload;

/* flowsim.ack_capacity for one link */
static double effective(const double *capacity, const ackload *a, int64_t link) {
    double c = capacity[link];
    if (!a) return c;
    int64_t r = a->reverse[link];
    if (r < 0) return c;
    double d = a->data[r];
    double x = c - a->frac * (d > 0 ? d : 0.0), floor = 0.01 * c;
    return x > floor ? x : floor;
}

static fluid view(double *state, int64_t n_rows) {
    fluid s;
    for (int k = 0; k < N_FIELDS; k++) s.f[k] = state + (int64_t)k * n_rows;
    s.fifo = 0;
    s.fifo_bits = 0.0;
    return s;
}

/* the exported calls' FIFO service: off where bits < 0 (Python's None) */
static fluid fifo_view(double *state, int64_t n_rows, double bits) {
    fluid s = view(state, n_rows);
    s.fifo = bits >= 0;
    s.fifo_bits = bits;
    return s;
}

/* Max-min fair rates of flows `sel[0..n-1]` (indices into off) by progressive filling, each
 * capped at caps[i]: max_min_rates, step for step. */
static int max_min(int64_t n, const int64_t *sel, const int64_t *off, const int64_t *idx,
                   const double *capacity, const ackload *ack, const double *caps, int64_t *slot,
                   double *rate) {
    int64_t n_edges = 0;
    for (int64_t i = 0; i < n; i++) n_edges += off[sel[i] + 1] - off[sel[i]];
    /* one block (8-byte slots: eight arrays of n_edges + 1, one of n + 1, then the flags) */
    int64_t e1 = n_edges + 1;
    char *block = malloc(8 * (8 * e1 + n + 1) + n + 1);
    if (!block) return 2;
    int64_t *used = (int64_t *)block, *flow_of = used + e1, *link_of = flow_of + e1;
    int64_t *open_links = link_of + e1, *open_flows = open_links + e1;
    double *remaining = (double *)(open_flows + n + 1), *load = remaining + e1;
    double *used_bw = load + e1, *counts = used_bw + e1;
    char *hit = (char *)(counts + e1);
    int rc = 0;
    int64_t n_used = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = off[sel[i]]; j < off[sel[i] + 1]; j++, e++) {
            int64_t link = idx[j];
            if (slot[link] < 0) {
                slot[link] = n_used;
                used[n_used] = link;
                remaining[n_used] = effective(capacity, ack, link);
                load[n_used] = 0.0;
                n_used++;
            }
            flow_of[e] = i;
            link_of[e] = slot[link];
            load[slot[link]] += 1.0;
        }
    }
    for (int64_t l = 0; l < n_used; l++) slot[used[l]] = -1;
    for (int64_t i = 0; i < n; i++) {
        open_flows[i] = i;
        rate[i] = 0.0;
        hit[i] = 0;
    }
    /* Each round scans only what is still open: the open edges (flow_of / link_of compacted in
     * place, in their order), the links some open edge crosses and the open flows, each in its
     * original order, so every sum and minimum is the full scan's (a closed edge added nothing
     * to counts or used_bw; a link without load shares INFINITY and is never the level). */
    int64_t n_open = n_edges, n_links_open = 0, n_flows_open = n;
    for (int64_t l = 0; l < n_used; l++)
        if (load[l] > 0) open_links[n_links_open++] = l;
    for (;;) {
        double level = INFINITY;
        for (int64_t q = 0; q < n_links_open; q++) {
            int64_t l = open_links[q];
            double share = remaining[l] / load[l];
            if (share < level) level = share;
        }
        double capped = INFINITY;
        for (int64_t q = 0; q < n_flows_open; q++) {
            int64_t i = open_flows[q];
            if (caps[i] < capped) capped = caps[i];
        }
        int by_cap = capped < level;
        double lvl = level > 0 ? level : 0.0;
        if (by_cap) {
            /* the lowest caps bind before any link does: those flows freeze at their cap */
            for (int64_t q = 0; q < n_flows_open; q++) {
                int64_t i = open_flows[q];
                if (caps[i] <= capped * (1 + REL_TIE)) {
                    hit[i] = 1;
                    rate[i] = caps[i];
                }
            }
            for (int64_t q = 0; q < n_links_open; q++) used_bw[open_links[q]] = 0.0;
        } else {
            /* every unfrozen flow crossing a bottleneck link freezes at its fair share */
            for (int64_t k = 0; k < n_open; k++) {
                int64_t l = link_of[k];
                double share = load[l] > 0 ? remaining[l] / load[l] : INFINITY;
                if (share <= level * (1 + REL_TIE)) hit[flow_of[k]] = 1;
            }
            for (int64_t q = 0; q < n_flows_open; q++)
                if (hit[open_flows[q]]) rate[open_flows[q]] = lvl;
        }
        for (int64_t q = 0; q < n_links_open; q++) counts[open_links[q]] = 0.0;
        int64_t kept = 0;
        for (int64_t k = 0; k < n_open; k++) {
            int64_t f = flow_of[k], l = link_of[k];
            if (hit[f]) {
                counts[l] += 1.0;
                if (by_cap) used_bw[l] += rate[f];
            } else {
                flow_of[kept] = f, link_of[kept] = l, kept++;
            }
        }
        n_open = kept;
        int64_t links_kept = 0;
        for (int64_t q = 0; q < n_links_open; q++) {
            int64_t l = open_links[q];
            load[l] -= counts[l];
            remaining[l] -= by_cap ? used_bw[l] : counts[l] * lvl;
            if (load[l] > 0) open_links[links_kept++] = l;
        }
        n_links_open = links_kept;
        if (!n_open) break;
        int64_t flows_kept = 0;
        for (int64_t q = 0; q < n_flows_open; q++) {
            int64_t i = open_flows[q];
            if (hit[i])
                hit[i] = 0;
            else
                open_flows[flows_kept++] = i;
        }
        n_flows_open = flows_kept;
    }
    free(block);
    return rc;
}

/* Fluid._set_rates: rows take their new rates; the data rate of their links follows. Returns
 * whether any rate changed. */
static int set_rates(fluid *s, const ackload *a, int64_t n, const int64_t *rows,
                     const int64_t *pos, const int64_t *off, const int64_t *idx,
                     const double *rate) {
    int changed = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = rate[i] - s->f[RATE][rows[i]];
        if (d == 0) continue;
        int64_t e = pos ? pos[i] : i;
        for (int64_t j = off[e]; j < off[e + 1]; j++) a->data[idx[j]] += d;
        s->f[RATE][rows[i]] = rate[i];
        changed = 1;
    }
    return changed;
}

/* A flow fifo_share serves in order: at most fifo_bits of work. */
static int fits(const fluid *s, int64_t row) { return s->f[WORK][row] <= s->fifo_bits; }

/* fifo_share's scratch: the residual per link and each link's sum over a group (0 between
 * groups), and a group's CSR entries, caps and rates */
typedef struct {
    double *resid, *used, *mcaps, *mgot;
    int64_t *msel, *slot;
} fifo_scratch;

/* One group of fifo_share: flows mem[0..k-1] (indices into sel, caps, got) share max-min what
 * w->resid has left; their rates into got; then per link the group's rates summed in flow
 * order (np.bincount) and the residual reduced once per link, floored at 0 (used back to 0,
 * so a second visit of a link is a no-op). */
static int fifo_group(fifo_scratch *w, int64_t k, const int64_t *mem, const int64_t *sel,
                      const double *caps, const int64_t *off, const int64_t *idx, double *got) {
    if (!k) return 0;
    for (int64_t i = 0; i < k; i++) w->msel[i] = sel[mem[i]], w->mcaps[i] = caps[mem[i]];
    int rc = max_min(k, w->msel, off, idx, w->resid, NULL, w->mcaps, w->slot, w->mgot);
    if (rc) return rc;
    for (int64_t i = 0; i < k; i++) {
        got[mem[i]] = w->mgot[i];
        for (int64_t e = off[w->msel[i]]; e < off[w->msel[i] + 1]; e++)
            w->used[idx[e]] += w->mgot[i];
    }
    for (int64_t i = 0; i < k; i++)
        for (int64_t e = off[w->msel[i]]; e < off[w->msel[i] + 1]; e++) {
            int64_t l = idx[e];
            double x = w->resid[l] - w->used[l];
            w->resid[l] = x > 0.0 ? x : 0.0;
            w->used[l] = 0.0;
        }
    return 0;
}

static int cmp_order(const void *a, const void *b) {
    const double *x = a, *y = b;
    if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* fairshare.fifo_rates over the live flows (m of them: CSR entries sel[j], caps[j], rows
 * rows[live[j]]): the flows of at most fifo_bits of work in order of START (stably), each
 * instant's max-min on what the earlier instants left per link (floored at 0), then the others
 * on what is left; rates into got[m]. The residual starts at each link's capacity for data
 * (with ACK load, effective()), as Python's _rates receives it. 0, or 2 on no memory. */
static int fifo_share(fluid *s, const ackload *ack, int64_t m, const int64_t *sel,
                      const int64_t *live, const int64_t *rows, const int64_t *off,
                      const int64_t *idx, const double *capacity, const double *caps,
                      int64_t *slot, double *got) {
    int64_t n_links = 0;
    for (int64_t j = 0; j < m; j++)
        for (int64_t e = off[sel[j]]; e < off[sel[j] + 1]; e++)
            if (idx[e] + 1 > n_links) n_links = idx[e] + 1;
    /* one block of 8-byte slots: two per link, (start, j) of the in-order, four per flow */
    double *block = malloc(sizeof(double) * (2 * (n_links + 1) + 6 * (m + 1)));
    if (!block) return 2;
    fifo_scratch w = {.resid = block, .used = block + n_links + 1, .slot = slot};
    double (*order)[2] = (double (*)[2])(w.used + n_links + 1);
    w.msel = (int64_t *)(order + m + 1);
    int64_t *mem = w.msel + m + 1;
    w.mcaps = (double *)(mem + m + 1), w.mgot = w.mcaps + m + 1;
    for (int64_t j = 0; j < m; j++)
        for (int64_t e = off[sel[j]]; e < off[sel[j] + 1]; e++) {
            w.resid[idx[e]] = effective(capacity, ack, idx[e]);
            w.used[idx[e]] = 0.0;
        }
    int64_t n_in = 0;
    for (int64_t j = 0; j < m; j++)
        if (fits(s, rows[live[j]])) {
            order[n_in][0] = s->f[START][rows[live[j]]];
            order[n_in++][1] = (double)j;
        }
    qsort(order, n_in, sizeof(double[2]), cmp_order); /* by start, then j: a stable sort */
    int rc = 0;
    for (int64_t q = 0, k = 0; q < n_in && !rc; k = 0) { /* one arrival instant at a time */
        double t0 = order[q][0];
        while (q < n_in && order[q][0] == t0) mem[k++] = (int64_t)order[q++][1];
        rc = fifo_group(&w, k, mem, sel, caps, off, idx, got);
    }
    int64_t k = 0; /* then the flows larger than the window */
    for (int64_t j = 0; j < m; j++)
        if (!fits(s, rows[live[j]])) mem[k++] = j;
    if (!rc) rc = fifo_group(&w, k, mem, sel, caps, off, idx, got);
    free(block);
    return rc;
}

/* Fluid._rates: max-min rates of the rows with bits left (0 for the others) into rate[n].
 * Flow i is row rows[i] with the links of CSR entry pos[i] (pos NULL: entry i). */
static int rates(fluid *s, const ackload *ack, int64_t n, const int64_t *rows, const int64_t *pos,
                 const double *left, const int64_t *off, const int64_t *idx,
                 const double *capacity, int64_t *slot, double *rate) {
    int64_t *live = malloc(sizeof(int64_t) * 4 * (n + 1)); /* and sel, caps, got */
    if (!live) return 2;
    int64_t *sel = live + n + 1;
    double *caps = (double *)(sel + n + 1), *got = caps + n + 1;
    int rc = 0;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        rate[i] = 0.0;
        if (left[i] > 0) {
            caps[m] = s->f[CAP][rows[i]];
            sel[m] = pos ? pos[i] : i;
            live[m++] = i;
        }
    }
    if (m) {
        rc = s->fifo ? fifo_share(s, ack, m, sel, live, rows, off, idx, capacity, caps, slot, got)
                     : max_min(m, sel, off, idx, capacity, ack, caps, slot, got);
        if (!rc)
            for (int64_t j = 0; j < m; j++) rate[live[j]] = got[j];
    }
    free(live);
    return rc;
}

/* Fluid._share: the rates; with ACK load up to ACK_PASSES times, each pass's rates set
 * (Fluid._set_rates): a pass that changes no rate leaves the data rates, so every later pass
 * would give the same rates (stopping there is exact). */
static int share(fluid *s, const ackload *ack, int64_t n, const int64_t *rows, const int64_t *pos,
                 const double *left, const int64_t *off, const int64_t *idx,
                 const double *capacity, int64_t *slot, double *rate) {
    if (!ack) return rates(s, NULL, n, rows, pos, left, off, idx, capacity, slot, rate);
    for (int pass = 0; pass < ACK_PASSES; pass++) {
        int rc = rates(s, ack, n, rows, pos, left, off, idx, capacity, slot, rate);
        if (rc) return rc;
        if (!set_rates(s, ack, n, rows, pos, off, idx, rate)) break;
    }
    return 0;
}

/* fluid._next_drain: how long until the next drain among rows with left[i] bits at rate[i]
 * (each row's time to drain into to_go[n]), or -1 when no row drains. */
static double next_drain(int64_t n, const double *left, const double *rate, double *to_go) {
    int any = 0;
    double dt = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        int live = left[i] > 0 && rate[i] > 0;
        to_go[i] = live ? left[i] / rate[i] : INFINITY;
        any |= live;
        if (to_go[i] < dt) dt = to_go[i];
    }
    return any ? dt : -1.0;
}

/* The rows move by dt to `now`: those draining within the tie of dt are empty and their end is
 * now (end[at ? at[i] : i]); the others lose rate × dt. */
static void drain_step(int64_t n, double *left, const double *rate, const double *to_go,
                       double dt, double now, double *end, const int64_t *at) {
    double tie = dt * (1 + REL_TIE);
    for (int64_t i = 0; i < n; i++) {
        if (left[i] > 0 && rate[i] > 0 && to_go[i] <= tie) {
            left[i] = 0.0;
            end[at ? at[i] : i] = now;
        } else {
            double x = left[i] - rate[i] * dt;
            left[i] = x > 0 ? x : 0.0;
        }
    }
}

/* Fluid._drain over rows `sub[0..n-1]` (indices into rows/off) last updated at `now`: they
 * drain at their rates, re-shared among themselves whenever one drains, until t. */
static int drain(fluid *s, const ackload *ack, int64_t n, const int64_t *sub, const int64_t *rows,
                 const int64_t *off, const int64_t *idx, const double *capacity, int64_t *slot,
                 double now, double t) {
    int64_t *r = malloc(sizeof(int64_t) * (n + 1));
    double *left = malloc(sizeof(double) * (n + 1));
    double *rate = malloc(sizeof(double) * (n + 1));
    double *to_go = malloc(sizeof(double) * (n + 1));
    int rc = 0;
    if (!r || !left || !rate || !to_go) {
        rc = 2;
        goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        r[i] = rows[sub[i]];
        left[i] = s->f[LEFT][r[i]];
        rate[i] = s->f[RATE][r[i]];
    }
    for (;;) {
        double dt = next_drain(n, left, rate, to_go);
        if (dt < 0) break;
        if (now + dt > t) {
            for (int64_t i = 0; i < n; i++) {
                double x = left[i] - rate[i] * (t - now);
                left[i] = x > 0 ? x : 0.0;
            }
            break;
        }
        now += dt;
        drain_step(n, left, rate, to_go, dt, now, s->f[DRAINED], r);
        rc = share(s, ack, n, r, sub, left, off, idx, capacity, slot, rate);
        if (rc) goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        s->f[LEFT][r[i]] = left[i];
        s->f[RATE][r[i]] = rate[i];
    }
out:
    free(r);
    free(left);
    free(rate);
    free(to_go);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int catch_up(fluid *s, const ackload *ack, int64_t n, const int64_t *rows,
                    const int64_t *off, const int64_t *idx, const double *capacity, int64_t *slot,
                    double t);

/* the ACK load of the exported calls: off where reverse is NULL */
static const ackload *acks_of(ackload *a, double frac, const int64_t *reverse, double *data) {
    if (!reverse) return NULL;
    a->frac = frac;
    a->reverse = reverse;
    a->data = data;
    return a;
}

/* Fluid.catch_up: rows grouped by their last update time (ascending), each group drained to t. */
int m4ray_fluid_catch_up(double *state, int64_t n_rows, int64_t n, const int64_t *rows,
                         const int64_t *off, const int64_t *idx, const double *capacity,
                         int64_t *slot, double t, double ack_frac, const int64_t *reverse,
                         double *data, double fifo_bits) {
    fluid s = fifo_view(state, n_rows, fifo_bits);
    ackload a;
    return catch_up(&s, acks_of(&a, ack_frac, reverse, data), n, rows, off, idx, capacity, slot,
                    t);
}

static int catch_up(fluid *sp, const ackload *ack, int64_t n, const int64_t *rows,
                    const int64_t *off, const int64_t *idx, const double *capacity, int64_t *slot,
                    double t) {
    fluid s = *sp;
    double *times = malloc(sizeof(double) * (n + 1));
    int64_t *sub = malloc(sizeof(int64_t) * (n + 1));
    int rc = 0;
    if (!times || !sub) {
        rc = 2;
        goto out;
    }
    int64_t m = 0;
    int same = 1; /* one last-update time (the common case): no sort */
    for (int64_t i = 0; i < n; i++) {
        double t0 = s.f[T_LAST][rows[i]];
        if (t0 < t) {
            if (m && t0 != times[0]) same = 0;
            times[m++] = t0;
        }
    }
    if (same && m > 1)
        m = 1;
    else
        qsort(times, m, sizeof(double), cmp_double);
    for (int64_t u = 0; u < m && !rc; u++) {
        if (u && times[u] == times[u - 1]) continue;
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++)
            if (s.f[T_LAST][rows[i]] == times[u]) sub[k++] = i;
        rc = drain(&s, ack, k, sub, rows, off, idx, capacity, slot, times[u], t);
    }
    if (!rc)
        for (int64_t i = 0; i < n; i++) s.f[T_LAST][rows[i]] = t;
out:
    free(times);
    free(sub);
    return rc;
}

/* Fluid.catch_up_frozen: rows `rows[0..n-1]` move from their last update to t at their rates,
 * each draining on its own (no re-share); a drained row keeps its rate until the next share. */
static void catch_up_frozen(fluid *sp, int64_t n, const int64_t *rows, double t) {
    fluid s = *sp;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows[i];
        double t0 = s.f[T_LAST][r];
        if (!(t0 < t)) continue;
        double left = s.f[LEFT][r], rate = s.f[RATE][r];
        if (left > 0 && rate > 0) {
            double end = t0 + left / rate;
            if (end <= t) {
                s.f[LEFT][r] = 0.0;
                s.f[DRAINED][r] = end;
            } else {
                double x = left - rate * (t - t0);
                s.f[LEFT][r] = x > 0 ? x : 0.0;
            }
        }
        s.f[T_LAST][r] = t;
    }
}

void m4ray_fluid_catch_up_frozen(double *state, int64_t n_rows, int64_t n, const int64_t *rows,
                                 double t) {
    fluid s = view(state, n_rows);
    catch_up_frozen(&s, n, rows, t);
}

/* Fluid.advance: catch up, re-share, project; base[n] and features[n][3] (row-major). */
static int advance(fluid *sp, const ackload *ack, int64_t n, const int64_t *rows,
                   const int64_t *off, const int64_t *idx, const double *capacity, int64_t *slot,
                   double t, int hold, double *base, double *features);

int m4ray_fluid_advance(double *state, int64_t n_rows, int64_t n, const int64_t *rows,
                        const int64_t *off, const int64_t *idx, const double *capacity,
                        int64_t *slot, double t, int hold, double *base, double *features,
                        double ack_frac, const int64_t *reverse, double *data,
                        double fifo_bits) {
    fluid s = fifo_view(state, n_rows, fifo_bits);
    ackload a;
    return advance(&s, acks_of(&a, ack_frac, reverse, data), n, rows, off, idx, capacity, slot,
                   t, hold, base, features);
}

/* Fluid._fifo_ends: each row's drain end if nothing else arrives, the rows drained forward
 * from t (their left and rate copied, the state not moved), re-shared as each drains on the
 * capacity the ACKs leave now (rates without set_rates: the data rates stay); ends[n] holds
 * today's projection on entry (INFINITY for a row with no rate yet). */
static int fifo_ends(fluid *s, const ackload *ack, int64_t n, const int64_t *rows,
                     const double *left0, const double *rate0, const int64_t *off,
                     const int64_t *idx, const double *capacity, int64_t *slot, double t,
                     double *ends) {
    double *left = malloc(sizeof(double) * 3 * (n + 1)); /* and rate, to_go */
    if (!left) return 2;
    double *rate = left + n + 1, *to_go = rate + n + 1;
    int rc = 0;
    memcpy(left, left0, sizeof(double) * n);
    memcpy(rate, rate0, sizeof(double) * n);
    double now = t;
    for (;;) {
        double dt = next_drain(n, left, rate, to_go);
        if (dt < 0) break;
        now += dt;
        drain_step(n, left, rate, to_go, dt, now, ends, NULL);
        if ((rc = rates(s, ack, n, rows, NULL, left, off, idx, capacity, slot, rate))) break;
    }
    free(left);
    return rc;
}

static int advance(fluid *sp, const ackload *ack, int64_t n, const int64_t *rows,
                   const int64_t *off, const int64_t *idx, const double *capacity, int64_t *slot,
                   double t, int hold, double *base, double *features) {
    int rc = catch_up(sp, ack, n, rows, off, idx, capacity, slot, t);
    if (rc) return rc;
    fluid s = *sp;
    double *left = malloc(sizeof(double) * (n + 1));
    double *rate = malloc(sizeof(double) * (n + 1));
    double *ends = NULL;
    if (!left || !rate) {
        rc = 2;
        goto out;
    }
    for (int64_t i = 0; i < n; i++) left[i] = s.f[LEFT][rows[i]];
    rc = share(&s, ack, n, rows, NULL, left, off, idx, capacity, slot, rate);
    if (rc) goto out;
    if (s.fifo) { /* a flow queued behind others has no rate yet: Fluid._fifo_ends */
        ends = malloc(sizeof(double) * (n + 1));
        if (!ends) {
            rc = 2;
            goto out;
        }
        for (int64_t i = 0; i < n; i++)
            ends[i] = left[i] > 0 ? t + left[i] / rate[i] : s.f[DRAINED][rows[i]];
        if ((rc = fifo_ends(&s, ack, n, rows, left, rate, off, idx, capacity, slot, t, ends)))
            goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows[i];
        s.f[RATE][r] = rate[i];
        double drain_end = ends ? ends[i] : left[i] > 0 ? t + left[i] / rate[i] : s.f[DRAINED][r];
        double end = drain_end + s.f[DELAY][r];
        double projected = (hold ? (end > t ? end : t) : end) - s.f[START][r];
        double b = projected / s.f[IDEAL][r];
        b = b > 1.0 ? b : 1.0;
        base[i] = b;
        features[3 * i] = log2(b);
        features[3 * i + 1] = rate[i] / s.f[BOTTLENECK][r];
        features[3 * i + 2] = left[i] / s.f[WORK][r];
    }
out:
    free(left);
    free(rate);
    free(ends);
    return rc;
}

/* ======================================================================================
 * The engine's bookkeeping (m4ray/sim/m4/engine.py, M4Engine), for NativeM4Engine: links'
 * users and owning components, flow rows (path, start, ideal FCT, last slowdown), components
 * (their flows in arrival order, merged on arrival, never split), the touched set, and the
 * fluid anchor's rows. The neural states stay in Python (numpy), except that a link going idle
 * is reset here from `link_init` into `h_link` (both [n_links][hidden], Python-owned).
 * ====================================================================================== */

typedef struct {
    int64_t head, tail, n_flows; /* rows in arrival order (next/prev links) */
    double t_last, t_fluid;
    char alive, touched;
    char arrived; /* a flow arrived since its last update (components.Batching) */
    int64_t left; /* completions since its last update */
} comp;

typedef struct {
    int64_t n_links, hidden;
    const double *capacity, *latency; /* Python-owned [n_links]; latency may be NULL */
    double *h_link;
    const double *link_init;
    int64_t *users, *owner, *slot;
    /* rows */
    int64_t n_rows, max_len, n_free, n_active;
    int64_t *path, *plen, *comp_of, *next, *prev, *free_rows;
    double *start, *ideal, *slow, *state; /* state: the fluid block [N_FIELDS][n_rows] */
    /* the flows' neural states [n_rows][hidden]; a fresh row gets its initial state (from its
     * size feature and path length) when it is first gathered */
    double *h_flow, *size_feature;
    int64_t *fresh;
    /* components */
    comp *comps;
    int64_t n_comps, cap_comps, n_live;
    int64_t *touched;
    int64_t n_touched, cap_touched;
    /* the anchor: on, hold, and a window (0 bytes: none) */
    int fluid, hold;
    double mtu, header, window_bytes, ack_bytes;
    /* the anchor's ACK load (ack.reverse NULL: off) */
    ackload ack;
    /* completion batching of components above batch_above flows (< 0: off) */
    int64_t batch_above, frozen_above;
    double batch_fraction;
    struct fused *fused; /* the compiled pass and its memo (m4ray_engine_model), or NULL */
    double fifo_bits;    /* the anchor's FIFO service (m4ray_engine_fifo; < 0: max-min) */
} engine;

/* the anchor's rows with the engine's service */
static fluid engine_view(const engine *e) { return fifo_view(e->state, e->n_rows, e->fifo_bits); }

static void fused_free(struct fused *m);

static const ackload *engine_acks(const engine *e) { return e->ack.reverse ? &e->ack : NULL; }

static void *grow(void *p, int64_t n, size_t size) { return realloc(p, (n ? n : 1) * size); }

void m4ray_engine_free(engine *e) {
    if (!e) return;
    free(e->users);
    free(e->owner);
    free(e->slot);
    free(e->path);
    free(e->plen);
    free(e->comp_of);
    free(e->next);
    free(e->prev);
    free(e->free_rows);
    free(e->start);
    free(e->ideal);
    free(e->slow);
    free(e->state);
    free(e->h_flow);
    free(e->size_feature);
    free(e->fresh);
    free(e->comps);
    free(e->touched);
    free((int64_t *)e->ack.reverse);
    free(e->ack.data);
    fused_free(e->fused);
    free(e);
}

/* rows 0..n_rows-1 with paths up to max_len links (grown, contents kept; new rows free) */
static int alloc_rows(engine *e, int64_t n_rows, int64_t max_len) {
    int64_t old = e->n_rows, old_len = e->max_len;
    int64_t *path = calloc(n_rows * max_len + 1, sizeof(int64_t));
    double *state = calloc(N_FIELDS * n_rows + 1, sizeof(double));
    if (!path || !state) {
        free(path);
        free(state);
        return 2;
    }
    for (int64_t r = 0; r < old; r++)
        memcpy(path + r * max_len, e->path + r * old_len, old_len * sizeof(int64_t));
    for (int k = 0; k < N_FIELDS; k++)
        memcpy(state + k * n_rows, e->state + k * old, old * sizeof(double));
    free(e->path);
    free(e->state);
    e->path = path;
    e->state = state;
    int64_t **ints[] = {&e->plen, &e->comp_of, &e->next, &e->prev, &e->free_rows, &e->fresh};
    for (int i = 0; i < 6; i++) {
        int64_t *p = grow(*ints[i], n_rows, sizeof(int64_t));
        if (!p) return 2;
        *ints[i] = p;
    }
    double **reals[] = {&e->start, &e->ideal, &e->slow, &e->size_feature};
    for (int i = 0; i < 4; i++) {
        double *p = grow(*reals[i], n_rows, sizeof(double));
        if (!p) return 2;
        *reals[i] = p;
    }
    double *h = grow(e->h_flow, n_rows * e->hidden, sizeof(double)); /* rows keep their place */
    if (!h) return 2;
    e->h_flow = h;
    /* new rows are taken in increasing order (the free list is a stack) */
    memmove(e->free_rows + (n_rows - old), e->free_rows, e->n_free * sizeof(int64_t));
    for (int64_t r = old; r < n_rows; r++) e->free_rows[n_rows - 1 - r] = r;
    e->n_free += n_rows - old;
    e->n_rows = n_rows;
    e->max_len = max_len;
    return 0;
}

engine *m4ray_engine_new(int64_t n_links, int64_t hidden, const double *capacity,
                         const double *latency, double *h_link, const double *link_init,
                         int fluid, int hold, double mtu, double header, double window_bytes,
                         double ack_bytes, double ack_frac) {
    engine *e = calloc(1, sizeof(engine));
    if (!e) return NULL;
    e->n_links = n_links;
    e->hidden = hidden;
    e->capacity = capacity;
    e->latency = latency;
    e->h_link = h_link;
    e->link_init = link_init;
    e->fluid = fluid;
    e->hold = hold;
    e->mtu = mtu;
    e->header = header;
    e->window_bytes = window_bytes;
    e->ack_bytes = ack_bytes;
    e->batch_above = -1;
    e->fifo_bits = -1.0;
    e->users = calloc(n_links + 1, sizeof(int64_t));
    e->owner = malloc((n_links + 1) * sizeof(int64_t));
    e->slot = malloc((n_links + 1) * sizeof(int64_t));
    if (!e->users || !e->owner || !e->slot || alloc_rows(e, 64, 8)) {
        m4ray_engine_free(e);
        return NULL;
    }
    for (int64_t l = 0; l < n_links; l++) e->owner[l] = e->slot[l] = -1;
    if (fluid && ack_frac > 0) {
        int64_t *reverse = malloc((n_links + 1) * sizeof(int64_t));
        e->ack.data = calloc(n_links + 1, sizeof(double));
        e->ack.frac = ack_frac;
        if (!reverse || !e->ack.data) {
            free(reverse);
            m4ray_engine_free(e);
            return NULL;
        }
        for (int64_t l = 0; l < n_links; l++) reverse[l] = l ^ 1; /* flowsim.reverse_links */
        e->ack.reverse = reverse;
    }
    return e;
}

/* The anchor serves rows of at most `bits` of work in order of arrival (Fluid's fifo_bits,
 * INFINITY: every row; < 0: max-min, the default). */
void m4ray_engine_fifo(engine *e, double bits) { e->fifo_bits = bits; }

/* components.Batching: components of more than `above` flows (< 0: none) wait for an arrival
 * or for completions numbering `fraction` of their flows; above `frozen_above` flows too, their
 * anchor is frozen between updates */
void m4ray_engine_batching(engine *e, int64_t above, double fraction, int64_t frozen_above) {
    e->batch_above = above;
    e->batch_fraction = fraction;
    e->frozen_above = frozen_above;
}

/* a batched component's anchor is frozen between its updates (Fluid.catch_up_frozen) */
static int frozen(const engine *e, const comp *c) {
    return e->batch_above >= 0 && c->n_flows > e->batch_above && c->n_flows > e->frozen_above;
}

static int due(const engine *e, const comp *c) {
    return e->batch_above < 0 || c->arrived || c->n_flows <= e->batch_above ||
           (double)c->left >= e->batch_fraction * (double)c->n_flows;
}

static int touch(engine *e, int64_t c) {
    if (e->comps[c].touched) return 0;
    if (e->n_touched == e->cap_touched) {
        int64_t cap = 2 * e->cap_touched + 16;
        int64_t *p = realloc(e->touched, cap * sizeof(int64_t));
        if (!p) return 2;
        e->touched = p;
        e->cap_touched = cap;
    }
    e->comps[c].touched = 1;
    e->touched[e->n_touched++] = c;
    return 0;
}

/* Window.limit_on over the path's links: (rate cap, bits to drain); (inf, bits) where it does
 * not bind */
static void window_limit(const engine *e, const int64_t *links, int64_t n, double bits,
                         double *cap, double *work) {
    *cap = INFINITY;
    *work = bits;
    if (e->window_bytes <= 0) return;
    double latency = 0, inverse = 0, bottleneck = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        latency += e->latency[links[i]];
        inverse += 1 / e->capacity[links[i]];
        if (e->capacity[links[i]] < bottleneck) bottleneck = e->capacity[links[i]];
    }
    double packet = (e->mtu + e->header) * 8.0;
    double rtt = 2 * latency + (packet + e->ack_bytes * 8.0) * inverse;
    double k = ceil(e->window_bytes / e->mtu);
    double tx = packet / bottleneck;
    if (rtt <= k * tx) return;
    double packets = ceil(bits / packet - 1e-9);
    double late = floor((packets - 1) / k) * (rtt - k * tx);
    *cap = k * packet / rtt;
    *work = (bits / bottleneck + late) * *cap;
}

/* A flow on `links` arrives at t: joins (merging) the components owning its links; returns its
 * row, -1 for a link id out of range, -2 when memory runs out. */
int64_t m4ray_engine_arrive(engine *e, const int64_t *links, int64_t n, double wire_bytes,
                            double ideal, double t, double size_feature) {
    if (n < 1) return -1;
    for (int64_t i = 0; i < n; i++)
        if (links[i] < 0 || links[i] >= e->n_links) return -1;
    if (!e->n_free || n > e->max_len) {
        int64_t rows = e->n_free ? e->n_rows : 2 * e->n_rows;
        if (alloc_rows(e, rows, n > e->max_len ? n : e->max_len)) return -2;
    }
    /* the distinct owners, ascending (Python: sorted({owner} - {-1})) */
    int64_t owners[64], n_own = 0;
    int64_t *own = n <= 64 ? owners : malloc(n * sizeof(int64_t));
    if (!own) return -2;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = e->owner[links[i]];
        if (c < 0) continue;
        int64_t j = 0;
        while (j < n_own && own[j] != c) j++;
        if (j == n_own) own[n_own++] = c;
    }
    for (int64_t i = 1; i < n_own; i++)
        for (int64_t j = i; j > 0 && own[j - 1] > own[j]; j--) {
            int64_t x = own[j];
            own[j] = own[j - 1];
            own[j - 1] = x;
        }
    int64_t root;
    if (!n_own) {
        if (e->n_comps == e->cap_comps) {
            int64_t cap = 2 * e->cap_comps + 16;
            comp *p = realloc(e->comps, cap * sizeof(comp));
            if (!p) {
                if (own != owners) free(own);
                return -2;
            }
            e->comps = p;
            e->cap_comps = cap;
        }
        root = e->n_comps++;
        e->comps[root] = (comp){-1, -1, 0, t, t, 1, 0, 1, 0};
        e->n_live++;
    } else {
        /* the one with most flows; ties: the lowest id */
        root = own[0];
        for (int64_t j = 1; j < n_own; j++)
            if (e->comps[own[j]].n_flows > e->comps[root].n_flows) root = own[j];
        comp *keep = &e->comps[root];
        for (int64_t j = 0; j < n_own; j++) {
            int64_t other = own[j];
            if (other == root) continue;
            comp *gone = &e->comps[other];
            for (int64_t r = gone->head; r >= 0; r = e->next[r]) {
                e->comp_of[r] = root;
                for (int64_t i = 0; i < e->plen[r]; i++) e->owner[e->path[r * e->max_len + i]] = root;
            }
            if (gone->head >= 0) { /* its flows follow keep's, in their order */
                if (keep->tail >= 0) {
                    e->next[keep->tail] = gone->head;
                    e->prev[gone->head] = keep->tail;
                } else {
                    keep->head = gone->head;
                }
                keep->tail = gone->tail;
            }
            keep->n_flows += gone->n_flows;
            if (gone->t_last < keep->t_last) keep->t_last = gone->t_last;
            if (gone->t_fluid < keep->t_fluid) keep->t_fluid = gone->t_fluid;
            keep->left += gone->left;
            gone->alive = 0;
            gone->touched = 0; /* dropped from the touched list at the next prepare */
            e->n_live--;
        }
    }
    if (own != owners) free(own);
    int64_t row = e->free_rows[--e->n_free];
    comp *c = &e->comps[root];
    for (int64_t i = 0; i < n; i++) {
        e->owner[links[i]] = root;
        e->users[links[i]]++;
        e->path[row * e->max_len + i] = links[i];
    }
    e->plen[row] = n;
    e->start[row] = t;
    e->ideal[row] = ideal;
    e->slow[row] = 1.0;
    e->size_feature[row] = size_feature;
    e->fresh[row] = 1;
    e->comp_of[row] = root;
    e->next[row] = -1;
    e->prev[row] = c->tail;
    if (c->tail >= 0)
        e->next[c->tail] = row;
    else
        c->head = row;
    c->tail = row;
    c->n_flows++;
    c->arrived = 1;
    e->n_active++;
    if (e->fluid) {
        double bits = wire_bytes * 8.0, cap = INFINITY, work = bits, bottleneck = INFINITY;
        for (int64_t i = 0; i < n; i++)
            if (e->capacity[links[i]] < bottleneck) bottleneck = e->capacity[links[i]];
        if (e->latency) window_limit(e, links, n, bits, &cap, &work);
        fluid s = engine_view(e);
        double delay = ideal - bits / bottleneck;
        double v[N_FIELDS] = {work, work, 0.0, cap, t, t, ideal, delay > 0 ? delay : 0.0,
                              bottleneck, INFINITY};
        for (int k = 0; k < N_FIELDS; k++) s.f[k][row] = v[k];
    }
    if (touch(e, root)) return -2;
    return row;
}

/* the rows of component c in order, their links as CSR (fresh arrays; NULL on no memory) */
static int64_t comp_rows(const engine *e, const comp *c, int64_t *rows, int64_t *off,
                         int64_t *idx) {
    int64_t n = 0;
    off[0] = 0;
    for (int64_t r = c->head; r >= 0; r = e->next[r]) {
        rows[n] = r;
        memcpy(idx + off[n], e->path + r * e->max_len, e->plen[r] * sizeof(int64_t));
        off[n + 1] = off[n] + e->plen[r];
        n++;
    }
    return n;
}

/* Row `row` completes at t: the flows left behind are caught up to t (the anchor), the row
 * leaves its component, idle links are reset and released. Returns 0, 2 on no memory. */
int m4ray_engine_complete(engine *e, int64_t row, double t) {
    int64_t ci = e->comp_of[row];
    comp *c = &e->comps[ci];
    /* the flows left behind (none when it was alone) shared with it until now */
    if (e->fluid && c->t_fluid < t && c->n_flows > 1 && !frozen(e, c)) {
        int64_t *rows = malloc((c->n_flows + 1) * sizeof(int64_t));
        int64_t *off = malloc((c->n_flows + 2) * sizeof(int64_t));
        int64_t *idx = malloc((c->n_flows * e->max_len + 1) * sizeof(int64_t));
        int rc = (!rows || !off || !idx) ? 2 : 0;
        if (!rc) {
            int64_t n = comp_rows(e, c, rows, off, idx);
            fluid s = engine_view(e);
            rc = catch_up(&s, engine_acks(e), n, rows, off, idx, e->capacity, e->slot, t);
        }
        free(rows);
        free(off);
        free(idx);
        if (rc) return rc;
        c->t_fluid = t;
    }
    if (engine_acks(e)) { /* Fluid.release: its data leaves its links */
        fluid s = engine_view(e);
        int64_t entry[2] = {0, e->plen[row]};
        double zero = 0.0;
        set_rates(&s, &e->ack, 1, &row, NULL, entry, e->path + row * e->max_len, &zero);
    }
    if (e->prev[row] >= 0)
        e->next[e->prev[row]] = e->next[row];
    else
        c->head = e->next[row];
    if (e->next[row] >= 0)
        e->prev[e->next[row]] = e->prev[row];
    else
        c->tail = e->prev[row];
    c->n_flows--;
    e->n_active--;
    e->free_rows[e->n_free++] = row;
    for (int64_t i = 0; i < e->plen[row]; i++) {
        int64_t l = e->path[row * e->max_len + i];
        if (--e->users[l] == 0) {
            e->owner[l] = -1;
            memcpy(e->h_link + l * e->hidden, e->link_init + l * e->hidden,
                   e->hidden * sizeof(double));
        }
    }
    if (c->n_flows) {
        c->left++;
        return touch(e, ci);
    }
    c->alive = 0;
    c->touched = 0;
    e->n_live--;
    return 0;
}

static int cmp_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The step graph's rows of an update (Python-owned, written by prepare): the flows' states
 * h_flow [F][hidden] and Δt dt_flow [F] (µs), the links' h_link [L][hidden] and dt_link [L],
 * and the network parameters params [F][n_params] (each row a copy of `params`). */
typedef struct {
    double *h_flow, *dt_flow, *h_link, *dt_link, *params;
    const double *params_row;
    int64_t n_params;
} graph_out;

static void gather(engine *e, const graph_out *g, int64_t k, const int64_t *n_flows,
                   const int64_t *n_links, const double *dt, int64_t F, const int64_t *rows,
                   int64_t L, const int64_t *links) {
    int64_t H = e->hidden;
    for (int64_t f = 0; f < F; f++) {
        int64_t r = rows[f];
        double *h = e->h_flow + r * H;
        if (e->fresh[r]) { /* train.model.initial_flow_state */
            memset(h, 0, H * sizeof(double));
            h[0] = 1.0;
            h[2] = e->size_feature[r];
            h[3] = (double)e->plen[r];
            e->fresh[r] = 0;
        }
        memcpy(g->h_flow + f * H, h, H * sizeof(double));
        memcpy(g->params + f * g->n_params, g->params_row, g->n_params * sizeof(double));
    }
    for (int64_t i = 0; i < L; i++)
        memcpy(g->h_link + i * H, e->h_link + links[i] * H, H * sizeof(double));
    for (int64_t j = 0, f = 0, l = 0; j < k; j++) {
        for (int64_t i = 0; i < n_flows[j]; i++) g->dt_flow[f++] = dt[j];
        for (int64_t i = 0; i < n_links[j]; i++) g->dt_link[l++] = dt[j];
    }
}

/* Sizes of the next prepare: [components, flows, links, edges] (the touched components that
 * are due). */
void m4ray_engine_pending(engine *e, int64_t *sizes) {
    int64_t k = 0, flows = 0, edges = 0;
    for (int64_t j = 0; j < e->n_touched; j++) {
        comp *c = &e->comps[e->touched[j]];
        if (!c->touched || !due(e, c)) continue;
        k++;
        flows += c->n_flows;
        for (int64_t r = c->head; r >= 0; r = e->next[r]) edges += e->plen[r];
    }
    sizes[0] = k;
    sizes[1] = flows;
    sizes[2] = edges; /* an upper bound on links */
    sizes[3] = edges;
}

/* The touched components at t as one graph (sizes from m4ray_engine_pending): comps[k]
 * ascending, per component its flows / links / Δt (µs) in n_flows / n_links / dt, rows[F],
 * their path lengths plen[F], links[L] (each component's sorted), incidence [2][E] (flow row,
 * then local link, of every path link in order); with the anchor base[F] and features[F][3];
 * the graph's rows into g (fresh flows get their initial states first). Takes the due
 * components off the touched set; returns the number of links, or -2 on no memory. */
int64_t m4ray_engine_prepare(engine *e, double t, int64_t *comps, int64_t *n_flows,
                             int64_t *n_links, double *dt, int64_t *rows, int64_t *plen,
                             int64_t *links, int64_t *incidence, double *base,
                             double *features, const graph_out *g) {
    int64_t k = 0, kept = 0;
    for (int64_t j = 0; j < e->n_touched; j++) {
        int64_t ci = e->touched[j];
        comp *c = &e->comps[ci];
        if (!c->touched) continue;
        if (due(e, c))
            comps[k++] = ci;
        else
            e->touched[kept++] = ci; /* waits, still touched */
    }
    e->n_touched = kept;
    qsort(comps, k, sizeof(int64_t), cmp_int64);
    int64_t F = 0, L = 0;
    for (int64_t j = 0; j < k; j++) {
        comp *c = &e->comps[comps[j]];
        c->touched = 0;
        c->arrived = 0;
        c->left = 0;
        int64_t l0 = L;
        for (int64_t r = c->head; r >= 0; r = e->next[r]) {
            rows[F] = r;
            plen[F] = e->plen[r];
            F++;
            for (int64_t i = 0; i < e->plen[r]; i++) {
                int64_t l = e->path[r * e->max_len + i];
                if (e->slot[l] < 0) {
                    e->slot[l] = 0;
                    links[L++] = l;
                }
            }
        }
        qsort(links + l0, L - l0, sizeof(int64_t), cmp_int64);
        n_flows[j] = c->n_flows;
        n_links[j] = L - l0;
        double d = t - c->t_last;
        dt[j] = (d > 0 ? d : 0.0) * 1e6;
    }
    int64_t n_edges = 0;
    for (int64_t f = 0; f < F; f++) n_edges += plen[f];
    for (int64_t i = 0; i < L; i++) e->slot[links[i]] = i;
    for (int64_t f = 0, j = 0; f < F; f++)
        for (int64_t i = 0; i < plen[f]; i++, j++) {
            incidence[j] = f;
            incidence[n_edges + j] = e->slot[e->path[rows[f] * e->max_len + i]];
        }
    for (int64_t i = 0; i < L; i++) e->slot[links[i]] = -1;
    gather(e, g, k, n_flows, n_links, dt, F, rows, L, links);
    int64_t *tmp = malloc((F + n_edges + 2) * sizeof(int64_t));
    if (!tmp) return -2;
    if (e->fluid && F) {
        int64_t *off = tmp, *idx = tmp + F + 1;
        off[0] = 0;
        for (int64_t f = 0; f < F; f++) {
            memcpy(idx + off[f], e->path + rows[f] * e->max_len, plen[f] * sizeof(int64_t));
            off[f + 1] = off[f] + plen[f];
        }
        fluid s = engine_view(e);
        for (int64_t j = 0, f = 0; j < k; f += n_flows[j], j++)
            if (frozen(e, &e->comps[comps[j]])) catch_up_frozen(&s, n_flows[j], rows + f, t);
        int rc = advance(&s, engine_acks(e), F, rows, off, idx, e->capacity, e->slot, t, e->hold,
                         base, features);
        if (rc) {
            free(tmp);
            return -2;
        }
        for (int64_t j = 0; j < k; j++) e->comps[comps[j]].t_fluid = t;
    }
    free(tmp);
    return L;
}

/* Write back an update at t: each row's new state h_flow [n][hidden] and slowdown, each
 * link's new state h_link [n_links][hidden]; predicted completion times (rounded to the
 * picosecond) into finish[n]; the components' last update time. */
void m4ray_engine_finish(engine *e, double t, int64_t k, const int64_t *comps, int64_t n,
                         const int64_t *rows, const double *slowdown, double *finish,
                         const double *h_flow, int64_t n_links, const int64_t *links,
                         const double *h_link) {
    int64_t H = e->hidden;
    for (int64_t i = 0; i < n_links; i++)
        memcpy(e->h_link + links[i] * H, h_link + i * H, H * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows[i];
        memcpy(e->h_flow + r * H, h_flow + i * H, H * sizeof(double));
        e->slow[r] = slowdown[i];
        finish[i] = nearbyint((e->start[r] + slowdown[i] * e->ideal[r]) * 1e12) / 1e12;
    }
    for (int64_t j = 0; j < k; j++) e->comps[comps[j]].t_last = t;
}

double m4ray_engine_slowdown(const engine *e, int64_t row) { return e->slow[row]; }
int64_t m4ray_engine_users(const engine *e, int64_t link) { return e->users[link]; }
int64_t m4ray_engine_components(const engine *e) { return e->n_live; }

/* ======================================================================================
 * An update in one call (NativeM4Engine.use_compiled_pass): m4ray_engine_prepare, the forward
 * pass (numpy_step.py's compiled m4ray_m4_pass, called by address) and m4ray_engine_finish, with
 * a memo of passes by their input bytes (m4ray/sim/m4/memo.py's, here): the per-update Python
 * between them was most of a small update's cost. The pass gives the same bits for the same
 * input bytes (_step.c), so a memo answer is the pass's answer.
 * ====================================================================================== */
typedef int (*pass_fn)(const int64_t *, const void *, const int64_t *, int64_t, int64_t,
                       const double *, const double *, const double *, const double *, int64_t,
                       const int64_t *, const int64_t *, const double *, const double *,
                       const double *, const double *, double *, double *, double *);

typedef struct {
    uint64_t hash;
    int64_t n_key;  /* key words (the outputs' sizes are in the key's first words) */
    uint64_t *blob; /* the key's words, then new_flow, new_link, slowdown */
} memo_entry;

struct fused {
    pass_fn pass;
    const int64_t *dims, *off; /* Python-owned (NumpyModel._packed), as the pass reads them */
    const void *wbuf; /* the pass's own float type */
    const double *params_row;
    int64_t n_params, n_fluid;
    int64_t memo_flows, memo_bytes, memo_used; /* keep graphs of <= memo_flows flows */
    memo_entry *table;                         /* open addressing, cap a power of two */
    int64_t cap, used, hits, misses;
    uint64_t *scratch;
    int64_t n_scratch;
};

static void memo_clear(struct fused *m) {
    for (int64_t i = 0; i < m->cap; i++) free(m->table[i].blob), m->table[i].blob = NULL;
    m->used = m->memo_used = 0;
}

static void fused_free(struct fused *m) {
    if (!m) return;
    memo_clear(m);
    free(m->table);
    free(m->scratch);
    free(m);
}

/* The compiled pass for this engine's updates: the pass's address, the model's packed weights
 * (dims, wbuf, off as m4ray_m4_pass or its float32 twin takes them), the parameter row every flow reads; graphs of
 * at most memo_flows flows are remembered up to memo_bytes (then the memo starts over).
 * Returns 0, or 2 when memory runs out. */
int m4ray_engine_model(engine *e, void *pass, const int64_t *dims, const void *wbuf,
                       const int64_t *off, const double *params_row, int64_t n_params,
                       int64_t memo_flows, int64_t memo_bytes) {
    fused_free(e->fused);
    struct fused *m = e->fused = calloc(1, sizeof *m);
    if (!m) return 2;
    m->pass = (pass_fn)pass;
    m->dims = dims, m->wbuf = wbuf, m->off = off;
    m->params_row = params_row, m->n_params = n_params, m->n_fluid = dims[4];
    m->memo_flows = memo_flows, m->memo_bytes = memo_bytes;
    return 0;
}

static uint64_t hash_words(const uint64_t *w, int64_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    return h;
}

static memo_entry *memo_slot(struct fused *m, uint64_t hash, const uint64_t *key, int64_t n) {
    if (!m->cap) return NULL;
    for (int64_t i = (int64_t)(hash & (uint64_t)(m->cap - 1));; i = (i + 1) & (m->cap - 1)) {
        memo_entry *s = &m->table[i];
        if (!s->blob) return s; /* free: where it would go */
        if (s->hash == hash && s->n_key == n && !memcmp(s->blob, key, n * sizeof *key)) return s;
    }
}

/* Remember the pass's outputs for key (a no-op when they do not fit or memory runs out). */
static void memo_store(struct fused *m, uint64_t hash, const uint64_t *key, int64_t n,
                       int64_t n_f, int64_t n_l, int64_t H, const double *new_flow,
                       const double *new_link, const double *slowdown) {
    int64_t words = n + (n_f + n_l) * H + n_f, bytes = words * 8 + (int64_t)sizeof(memo_entry);
    if (bytes > m->memo_bytes) return;
    if (m->memo_used + bytes > m->memo_bytes) memo_clear(m);
    if (2 * (m->used + 1) > m->cap) { /* grow (rehash) at half full */
        int64_t cap = m->cap ? 2 * m->cap : 1024;
        memo_entry *old = m->table, *table = calloc(cap, sizeof *table);
        if (!table) return;
        int64_t old_cap = m->cap;
        m->table = table, m->cap = cap;
        for (int64_t i = 0; i < old_cap; i++)
            if (old[i].blob) *memo_slot(m, old[i].hash, old[i].blob, old[i].n_key) = old[i];
        free(old);
    }
    memo_entry *s = memo_slot(m, hash, key, n);
    if (s->blob) return; /* known already (the same component twice in one update) */
    uint64_t *blob = malloc(words * sizeof *blob);
    if (!blob) return;
    memcpy(blob, key, n * sizeof *blob);
    memcpy(blob + n, new_flow, n_f * H * sizeof(double));
    memcpy(blob + n + n_f * H, new_link, n_l * H * sizeof(double));
    memcpy(blob + n + (n_f + n_l) * H, slowdown, n_f * sizeof(double));
    *s = (memo_entry){hash, n, blob};
    m->used++;
    m->memo_used += bytes;
}

/* One update at t through the compiled pass: sizes as m4ray_engine_pending gave them (the
 * touched components that are due); the updated rows into rows[sizes[1]], their predicted
 * completion times into finish. The memo answers component by component (a component's inputs
 * in its own local numbering are its key); a component whose key another component of the
 * same update has takes that one's answers (a collective's steps touch many alike, as
 * numpy_step's _distinct finds them on the stepper's path); the rest go through one pass
 * together, which gives each the bits it gets alone (_step.c). Where no component is known or
 * repeated, the pass reads the prepared rows in place (no key is built for a lone component
 * too large for the memo). stats[0] += the components updated, stats[1] += 1 when the memo
 * answered every one (no pass), stats[2] += the flows updated, stats[4] += the flows the pass
 * carried, stats[5] += the components answered by another of their update. Returns the number
 * of flows, -2 when memory runs out, -3 without a model. */
int64_t m4ray_engine_update(engine *e, double t, const int64_t *sizes, int64_t *rows,
                            double *finish, int64_t *stats) {
    struct fused *m = e->fused;
    if (!m) return -3;
    const int64_t k = sizes[0], F = sizes[1], Lb = sizes[2], E = sizes[3], H = e->hidden;
    const int64_t P = m->n_params, Q = e->fluid ? m->n_fluid : 0, B = e->fluid ? 1 : 0;
    /* one scratch block of 8-byte words: what prepare writes (links up to the bound Lb); each
     * component's key (its graph in the pass's order, local numbering); the unknown ones
     * packed as one graph; the outputs of that pass; the update's outputs; per component its
     * key's place and length, hash, representative and first flow, link and edge; the path
     * lengths as the pass reads them; the update's table of keys (pages never written are
     * never touched: a lone component too large for the memo costs no key) */
    int64_t cap = 4;
    while (cap < 2 * k) cap *= 2;
    int64_t n_loose = 3 * k + F + Lb + 2 * E + k + (F + Lb) * H + F + Lb + F * P + B * F + Q * F;
    int64_t n_key = 3 * k + (F + Lb) * H + F + Lb + 2 * E + F * P + F + B * F + Q * F;
    int64_t n_out = (F + Lb) * H + F;
    int64_t words = n_loose + 2 * n_key + 2 * n_out + 7 * k + F + cap + 2;
    if (words > m->n_scratch) {
        uint64_t *p = realloc(m->scratch, words * sizeof *p);
        if (!p) return -2;
        m->scratch = p, m->n_scratch = words;
    }
    int64_t *comps = (int64_t *)m->scratch, *n_flows = comps + k, *n_links = n_flows + k;
    int64_t *plen = n_links + k, *links = plen + F, *incidence = links + Lb;
    double *dt = (double *)(incidence + 2 * E), *h_flow = dt + k, *h_link = h_flow + F * H;
    double *dt_flow = h_link + Lb * H, *dt_link = dt_flow + F, *params = dt_link + Lb;
    double *base = params + F * P, *features = base + B * F;
    uint64_t *keys = (uint64_t *)(features + Q * F), *packed = keys + n_key;
    double *out_packed = (double *)(packed + n_key), *out = out_packed + n_out;
    int64_t *key_at = (int64_t *)(out + n_out), *key_len = key_at + k;
    uint64_t *hashes = (uint64_t *)(key_len + k);
    int64_t *rep = (int64_t *)(hashes + k), *fo = rep + k, *lo = fo + k, *eo = lo + k;
    double *plen_d = (double *)(eo + k + 1);
    int64_t *table = (int64_t *)(plen_d + F);
    graph_out g = {h_flow, dt_flow, h_link, dt_link, params, m->params_row, P};
    int64_t L = m4ray_engine_prepare(e, t, comps, n_flows, n_links, dt, rows, plen, links,
                                     incidence, B ? base : NULL, B ? features : NULL, &g);
    if (L < 0) return -2;
    double *new_flow = out, *new_link = out + F * H, *slowdown = new_link + L * H;
    for (int64_t i = 0; i < cap; i++) table[i] = -1;
    /* each component's first flow, link and edge */
    fo[0] = lo[0] = eo[0] = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t ne = 0;
        for (int64_t f = fo[j]; f < fo[j] + n_flows[j]; f++) ne += plen[f];
        if (j + 1 < k) fo[j + 1] = fo[j] + n_flows[j], lo[j + 1] = lo[j] + n_links[j];
        eo[j + 1] = eo[j] + ne;
        rep[j] = j;
    }
    /* each component's key (where the memo or another component of the update can use it);
     * the memo's answer where it has one; else an earlier component of this update with the
     * same key (its representative), if any */
    int64_t w = 0, n_known = 0, n_same = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t nf = n_flows[j], nl = n_links[j], f0 = fo[j], l0 = lo[j], e0 = eo[j];
        int64_t ne = eo[j + 1] - e0;
        key_at[j] = w;
        if (k > 1 || nf <= m->memo_flows) {
            uint64_t *key = keys + w;
            key[0] = (uint64_t)nf, key[1] = (uint64_t)nl, key[2] = (uint64_t)ne;
            uint64_t *q = key + 3;
#define PUT(src, n) memcpy(q, src, (size_t)(n) * sizeof *q), q += (n)
            PUT(h_flow + f0 * H, nf * H);
            PUT(h_link + l0 * H, nl * H);
            PUT(dt_flow + f0, nf);
            PUT(dt_link + l0, nl);
            for (int64_t x = 0; x < ne; x++) q[x] = (uint64_t)(incidence[e0 + x] - f0);
            q += ne;
            for (int64_t x = 0; x < ne; x++) q[x] = (uint64_t)(incidence[E + e0 + x] - l0);
            q += ne;
            PUT(params + f0 * P, nf * P);
            for (int64_t f = 0; f < nf; f++) ((double *)q)[f] = (double)plen[f0 + f];
            q += nf;
            PUT(base + f0, B * nf);
            PUT(features + f0 * Q, Q * nf);
#undef PUT
            key_len[j] = q - key, w += key_len[j];
            hashes[j] = hash_words(key, key_len[j]);
            memo_entry *hit = NULL;
            if (nf <= m->memo_flows) {
                memo_entry *s = memo_slot(m, hashes[j], key, key_len[j]);
                if (s && s->blob) hit = s;
            }
            if (hit) {
                const uint64_t *o = hit->blob + key_len[j];
                memcpy(new_flow + f0 * H, o, nf * H * sizeof(double));
                memcpy(new_link + l0 * H, o + nf * H, nl * H * sizeof(double));
                memcpy(slowdown + f0, o + (nf + nl) * H, nf * sizeof(double));
                n_known++;
                rep[j] = -1; /* known: no pass */
            } else {
                uint64_t mask = (uint64_t)(cap - 1);
                for (int64_t i = (int64_t)(hashes[j] & mask);; i = (int64_t)((i + 1) & mask)) {
                    int64_t o = table[i];
                    if (o < 0) {
                        table[i] = j;
                        break;
                    }
                    if (hashes[o] == hashes[j] && key_len[o] == key_len[j] &&
                        !memcmp(keys + key_at[o], key, key_len[j] * sizeof *key)) {
                        rep[j] = o, n_same++;
                        break;
                    }
                }
            }
        } else {
            key_len[j] = 0;
        }
    }
    int64_t carried = 0;
    if (n_known == k) {
        stats[1]++;
    } else if (n_known == 0 && n_same == 0) { /* every row through the pass, as prepared */
        for (int64_t f = 0; f < F; f++) plen_d[f] = (double)plen[f];
        int rc = m->pass(m->dims, m->wbuf, m->off, F, L, h_flow, h_link, dt_flow, dt_link, E,
                         incidence, incidence + E, params, plen_d, B ? base : NULL,
                         Q ? features : NULL, new_flow, new_link, slowdown);
        if (rc) return -2;
        m->misses++;
        carried = F;
        for (int64_t j = 0; j < k; j++)
            if (n_flows[j] <= m->memo_flows)
                memo_store(m, hashes[j], keys + key_at[j], key_len[j], n_flows[j], n_links[j], H,
                           new_flow + fo[j] * H, new_link + lo[j] * H, slowdown + fo[j]);
    } else { /* the components to step packed as one graph, numbered as in it */
        int64_t pf = 0, pl = 0, pe = 0;
        for (int64_t j = 0; j < k; j++)
            if (rep[j] == j)
                pf += n_flows[j], pl += n_links[j], pe += eo[j + 1] - eo[j];
        double *ph_flow = (double *)packed, *ph_link = ph_flow + pf * H;
        double *pdt_flow = ph_link + pl * H, *pdt_link = pdt_flow + pf;
        int64_t *pinc = (int64_t *)(pdt_link + pl);
        double *pparams = (double *)(pinc + 2 * pe), *pnl = pparams + pf * P;
        double *pbase = pnl + pf, *pfeat = pbase + B * pf;
        int64_t af = 0, al = 0, ae = 0;
        for (int64_t j = 0; j < k; j++) {
            if (rep[j] != j) continue;
            int64_t nf = n_flows[j], nl = n_links[j], f0 = fo[j], l0 = lo[j], e0 = eo[j];
            int64_t ne = eo[j + 1] - e0;
            memcpy(ph_flow + af * H, h_flow + f0 * H, nf * H * sizeof(double));
            memcpy(ph_link + al * H, h_link + l0 * H, nl * H * sizeof(double));
            memcpy(pdt_flow + af, dt_flow + f0, nf * sizeof(double));
            memcpy(pdt_link + al, dt_link + l0, nl * sizeof(double));
            for (int64_t x = 0; x < ne; x++) pinc[ae + x] = incidence[e0 + x] - f0 + af;
            for (int64_t x = 0; x < ne; x++) pinc[pe + ae + x] = incidence[E + e0 + x] - l0 + al;
            memcpy(pparams + af * P, params + f0 * P, nf * P * sizeof(double));
            for (int64_t f = 0; f < nf; f++) pnl[af + f] = (double)plen[f0 + f];
            memcpy(pbase + af, base + f0, B * nf * sizeof(double));
            memcpy(pfeat + af * Q, features + f0 * Q, Q * nf * sizeof(double));
            af += nf, al += nl, ae += ne;
        }
        double *o_flow = out_packed, *o_link = o_flow + pf * H, *o_slow = o_link + pl * H;
        int rc = m->pass(m->dims, m->wbuf, m->off, pf, pl, ph_flow, ph_link, pdt_flow, pdt_link,
                         pe, pinc, pinc + pe, pparams, pnl, B ? pbase : NULL, Q ? pfeat : NULL,
                         o_flow, o_link, o_slow);
        if (rc) return -2;
        m->misses++;
        carried = pf;
        /* the pass's answers to their places, and into the memo; then each repeated
         * component takes its representative's (an earlier component: already in place) */
        af = al = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t nf = n_flows[j], nl = n_links[j], r = rep[j];
            if (r == j) {
                memcpy(new_flow + fo[j] * H, o_flow + af * H, nf * H * sizeof(double));
                memcpy(new_link + lo[j] * H, o_link + al * H, nl * H * sizeof(double));
                memcpy(slowdown + fo[j], o_slow + af, nf * sizeof(double));
                if (nf <= m->memo_flows)
                    memo_store(m, hashes[j], keys + key_at[j], key_len[j], nf, nl, H,
                               new_flow + fo[j] * H, new_link + lo[j] * H, slowdown + fo[j]);
                af += nf, al += nl;
            } else if (r >= 0) {
                memcpy(new_flow + fo[j] * H, new_flow + fo[r] * H, nf * H * sizeof(double));
                memcpy(new_link + lo[j] * H, new_link + lo[r] * H, nl * H * sizeof(double));
                memcpy(slowdown + fo[j], slowdown + fo[r], nf * sizeof(double));
            }
        }
    }
    m4ray_engine_finish(e, t, k, comps, F, rows, slowdown, finish, new_flow, L, links, new_link);
    stats[0] += k, stats[2] += F, stats[4] += carried, stats[5] += n_same;
    return F;
}

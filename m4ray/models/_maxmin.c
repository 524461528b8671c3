/* Max-min fair rates by progressive filling, compiled: the twin of
 * m4ray.models.fairshare.max_min_rates (the reference and the fallback), which flowSim calls at every
 * arrival and completion. The same algorithm and tie rule — each level freezes every open flow on
 * a link whose share is within REL_TIE of the lowest (or, with caps, the flows whose cap binds
 * first) — and the same order of arithmetic per link (a level's frozen count times the level,
 * a cap level's frozen rates summed in flow order), so the two agree to rounding. Built and
 * loaded by m4ray.native; called through ctypes. Units: bits/s.
 *
 * Flow i crosses links idx[off[i] .. off[i+1]); capacity is indexed by link id (< n_links);
 * caps is NULL or one cap per flow. Writes rate[0..n). Returns 0, or 2 out of memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REL_TIE 1e-9
#define QUEUE_FULL 1e-6 /* a link whose data are within this share of its capacity is full */

typedef struct {
    double cap;
    int64_t flow;
} capkey;

static int by_cap_then_flow(const void *x, const void *y) {
    const capkey *a = x, *b = y;
    if (a->cap != b->cap) return a->cap < b->cap ? -1 : 1;
    return (a->flow > b->flow) - (a->flow < b->flow);
}

static inline int cap_less(capkey a, capkey b) {
    return a.cap < b.cap || (a.cap == b.cap && a.flow < b.flow);
}

/* The flows by cap then flow (a total order, so any sort gives qsort's answer): quicksort with
 * a median of three and insertion sort below 24, qsort past a depth that means a bad pivot run.
 * qsort's indirect comparisons cost a lot at every event of a lot's DCQCN trace. */
static void sort_caps(capkey *a, int64_t n, int depth) {
    while (n > 24) {
        if (depth-- <= 0) {
            qsort(a, n, sizeof(capkey), by_cap_then_flow);
            return;
        }
        int64_t m = n / 2;
        capkey t;
#define SWAP(i, j) (t = a[i], a[i] = a[j], a[j] = t)
        if (cap_less(a[m], a[0])) SWAP(m, 0);
        if (cap_less(a[n - 1], a[0])) SWAP(n - 1, 0);
        if (cap_less(a[n - 1], a[m])) SWAP(n - 1, m);
        capkey pivot = a[m];
        int64_t i = 0, j = n - 1;
        for (;;) { /* Hoare: a[0..j] <= pivot <= a[j+1..n) */
            while (cap_less(a[i], pivot)) ++i;
            while (cap_less(pivot, a[j])) --j;
            if (i >= j) break;
            SWAP(i, j);
            ++i, --j;
        }
#undef SWAP
        if (j + 1 < n - j - 1) { /* the smaller side first; loop on the larger */
            sort_caps(a, j + 1, depth);
            a += j + 1, n -= j + 1;
        } else {
            sort_caps(a + j + 1, n - j - 1, depth);
            n = j + 1;
        }
    }
    for (int64_t i = 1; i < n; ++i) {
        capkey x = a[i];
        int64_t j = i;
        for (; j > 0 && cap_less(x, a[j - 1]); --j) a[j] = a[j - 1];
        a[j] = x;
    }
}

static int by_flow(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The capped max-min's scratch, kept between calls by a fluid state (a lot's DCQCN trace calls
 * it at every event: allocating it each time cost a third of the trace); grown as needed. */
typedef struct {
    int64_t cap_l, cap_n, cap_e;
    double *remaining, *used;      /* per link */
    int64_t *load, *frozen;        /* per link, zeroed per call */
    int64_t *links;                /* loaded links, first-use order */
    int64_t *open, *batch;         /* open flows, ascending; a cap level's flows */
    char *hit, *done;              /* per flow; done: frozen at a cap level, maybe still open */
    capkey *sorted;                /* the flows by cap */
} scanws;

static void sc_free(scanws *w) {
    if (!w) return;
    free(w->remaining), free(w->used), free(w->load), free(w->frozen), free(w->links);
    free(w->open), free(w->batch), free(w->hit), free(w->done), free(w->sorted);
    free(w);
}

static int sc_reserve(scanws *w, int64_t n_links, int64_t n, int64_t n_edges) {
#define SC_GROW(p, T, c)                                 \
    do {                                                 \
        void *q = realloc(w->p, ((c) + 1) * sizeof(T));  \
        if (!q) return 2;                                \
        w->p = q;                                        \
    } while (0)
    if (n_links + 1 > w->cap_l) {
        SC_GROW(remaining, double, n_links);
        SC_GROW(used, double, n_links);
        SC_GROW(load, int64_t, n_links);
        SC_GROW(frozen, int64_t, n_links);
        w->cap_l = n_links + 1;
    }
    if (n + 1 > w->cap_n) {
        int64_t c = 2 * (n + 1);
        SC_GROW(open, int64_t, c);
        SC_GROW(batch, int64_t, c);
        SC_GROW(hit, char, c);
        SC_GROW(done, char, c);
        SC_GROW(sorted, capkey, c);
        w->cap_n = c;
    }
    if (n_edges + 1 > w->cap_e) {
        int64_t c = 2 * (n_edges + 1);
        SC_GROW(links, int64_t, c);
        w->cap_e = c;
    }
#undef SC_GROW
    return 0;
}

static int max_min_scan(scanws *w, int64_t n, const int64_t *off, const int64_t *idx,
                        int64_t n_links, const double *capacity, const double *caps,
                        double *rate) {
    /* Each level scans only the flows still open and the links still loaded (both kept in
     * their first order), so a computation costs the levels times what is left, not times
     * everything: the same arithmetic in the same order as scanning all of them. With caps
     * (DCQCN's rates make nearly every flow's its own), the flows sorted by cap find each cap
     * level's flows without a scan: they freeze in flow order (the same sums), and the open
     * list drops them at the next link level's scan. w: the scratch (NULL: made here). */
    scanws *own = NULL;
    if (!w && !(w = own = calloc(1, sizeof(scanws)))) return 2;
    int status = sc_reserve(w, n_links, n, off[n]);
    if (status) goto out;
    double *remaining = w->remaining, *used = w->used;
    int64_t *load = w->load, *frozen = w->frozen, *links = w->links, *open = w->open;
    int64_t *batch = w->batch;
    char *hit = w->hit, *done = w->done;
    capkey *sorted = w->sorted;
    memset(load, 0, n_links * sizeof(int64_t));
    memset(frozen, 0, n_links * sizeof(int64_t));
    memset(done, 0, n + 1);
    int64_t n_used = 0;
    for (int64_t e = 0; e < off[n]; ++e) {
        int64_t l = idx[e];
        if (load[l]++ == 0) {
            links[n_used++] = l;
            remaining[l] = capacity[l];
        }
    }
    int64_t n_open = n, n_left = n, next_cap = 0;
    for (int64_t i = 0; i < n; ++i) open[i] = i;
    if (caps) {
        for (int64_t i = 0; i < n; ++i) sorted[i].cap = caps[i], sorted[i].flow = i;
        int depth = 8;
        for (int64_t m = n; m > 1; m >>= 1) depth += 2;
        sort_caps(sorted, n, depth);
    }
    while (n_left > 0) {
        double level = INFINITY;
        for (int64_t k = 0; k < n_used; ++k) {
            int64_t l = links[k];
            double share = remaining[l] / (double)load[l];
            if (share < level) level = share;
        }
        double capped = INFINITY;
        if (caps) {
            while (next_cap < n && done[sorted[next_cap].flow]) ++next_cap;
            if (next_cap < n) capped = sorted[next_cap].cap;
        }
        int by_cap = caps && capped < level;
        double at = level > 0.0 ? level : 0.0;
        for (int64_t k = 0; k < n_used; ++k) {
            frozen[links[k]] = 0;
            used[links[k]] = 0.0;
        }
        if (by_cap) { /* the lowest caps bind first: those flows, in flow order */
            int64_t n_batch = 0;
            double bound = capped * (1 + REL_TIE);
            for (int64_t q = next_cap; q < n && sorted[q].cap <= bound; ++q)
                if (!done[sorted[q].flow]) batch[n_batch++] = sorted[q].flow;
            if (n_batch > 16) {
                qsort(batch, n_batch, sizeof(int64_t), by_flow);
            } else {
                for (int64_t j = 1; j < n_batch; ++j) { /* a few flows: insertion */
                    int64_t x = batch[j], q = j;
                    for (; q > 0 && batch[q - 1] > x; --q) batch[q] = batch[q - 1];
                    batch[q] = x;
                }
            }
            for (int64_t j = 0; j < n_batch; ++j) {
                int64_t i = batch[j];
                rate[i] = caps[i];
                done[i] = 1;
                for (int64_t e = off[i]; e < off[i + 1]; ++e) {
                    frozen[idx[e]] += 1;
                    used[idx[e]] += rate[i];
                }
            }
            n_left -= n_batch;
        } else {
            for (int64_t j = 0; j < n_open; ++j) {
                int64_t i = open[j];
                hit[i] = 0;
                if (done[i]) continue;
                for (int64_t e = off[i]; e < off[i + 1]; ++e) {
                    int64_t l = idx[e];
                    if (remaining[l] / (double)load[l] <= level * (1 + REL_TIE)) {
                        hit[i] = 1;
                        break;
                    }
                }
            }
            int64_t still = 0;
            for (int64_t j = 0; j < n_open; ++j) {
                int64_t i = open[j];
                if (done[i]) continue;
                if (!hit[i]) {
                    open[still++] = i;
                    continue;
                }
                rate[i] = at;
                done[i] = 1;
                --n_left;
                for (int64_t e = off[i]; e < off[i + 1]; ++e) {
                    frozen[idx[e]] += 1;
                    used[idx[e]] += rate[i];
                }
            }
            n_open = still;
        }
        int64_t loaded = 0;
        for (int64_t k = 0; k < n_used; ++k) {
            int64_t l = links[k];
            if (frozen[l]) {
                load[l] -= frozen[l];
                remaining[l] -= by_cap ? used[l] : (double)frozen[l] * at;
            }
            if (load[l] > 0) links[loaded++] = l;
        }
        n_used = loaded;
    }
out:
    sc_free(own);
    return status;
}

/* Uncapped max-min with a workspace kept between calls (flowSim's, or one made per call): the
 * same levels, tie rule and arithmetic as max_min_scan, but each level finds its flows through
 * the flows of the links at the level (a link-to-flows index built once per call), so a level
 * costs the loaded links plus the flows it freezes, not every open flow's links again. The
 * per-link arrays are indexed by link id and left zero (load, frozen) between calls. */
typedef struct {
    int64_t n_links, cap_n, cap_e;
    double *rem;                          /* per link: capacity not yet given */
    int64_t *load, *frozen, *start, *end; /* per link: open flows, frozen now, its flows' span */
    int64_t *links, *lf;                  /* loaded links (first-use order); flows by link */
    double *sh;                           /* the loaded links' shares, as links */
    int64_t *hits;                        /* flows frozen at this level */
    char *state;                          /* per flow: 0 open, 1 frozen */
} mmws;

static void mm_free(mmws *w) {
    if (!w) return;
    free(w->rem), free(w->load), free(w->frozen), free(w->start), free(w->end);
    free(w->links), free(w->lf), free(w->sh), free(w->hits), free(w->state);
    free(w);
}

static mmws *mm_new(int64_t n_links) {
    mmws *w = calloc(1, sizeof(mmws));
    if (!w) return NULL;
    w->n_links = n_links;
    w->rem = malloc((n_links + 1) * sizeof(double));
    w->load = calloc(n_links + 1, sizeof(int64_t));
    w->frozen = calloc(n_links + 1, sizeof(int64_t));
    w->start = malloc((n_links + 1) * sizeof(int64_t));
    w->end = malloc((n_links + 1) * sizeof(int64_t));
    if (!w->rem || !w->load || !w->frozen || !w->start || !w->end) {
        mm_free(w);
        return NULL;
    }
    return w;
}

static int mm_reserve(mmws *w, int64_t n, int64_t n_edges) {
    if (n + 1 > w->cap_n) {
        int64_t c = 2 * (n + 1);
        void *h = realloc(w->hits, c * sizeof(int64_t)), *st = realloc(w->state, c);
        if (h) w->hits = h;
        if (st) w->state = st;
        if (!h || !st) return 2;
        w->cap_n = c;
    }
    if (n_edges + 1 > w->cap_e) {
        int64_t c = 2 * (n_edges + 1);
        void *l = realloc(w->links, c * sizeof(int64_t)), *f = realloc(w->lf, c * sizeof(int64_t));
        void *h = realloc(w->sh, c * sizeof(double));
        if (l) w->links = l;
        if (f) w->lf = f;
        if (h) w->sh = h;
        if (!l || !f || !h) return 2;
        w->cap_e = c;
    }
    return 0;
}

static int max_min_fill(mmws *w, int64_t n, const int64_t *off, const int64_t *idx,
                        const double *capacity, double *rate) {
    int64_t n_edges = off[n], n_used = 0;
    if (mm_reserve(w, n, n_edges)) return 2;
    double *rem = w->rem;
    int64_t *load = w->load, *frozen = w->frozen, *links = w->links, *lf = w->lf;
    for (int64_t e = 0; e < n_edges; ++e) {
        int64_t l = idx[e];
        if (load[l]++ == 0) {
            links[n_used++] = l;
            rem[l] = capacity[l];
        }
    }
    int64_t pos = 0;
    for (int64_t k = 0; k < n_used; ++k) {
        int64_t l = links[k];
        w->start[l] = w->end[l] = pos;
        pos += load[l];
    }
    for (int64_t i = 0; i < n; ++i) {
        w->state[i] = 0;
        for (int64_t e = off[i]; e < off[i + 1]; ++e) lf[w->end[idx[e]]++] = i;
    }
    /* each loaded link's share (sh, aligned with links) is computed once per change: the
     * pass that applies a level's freezes also finds the next level */
    double *sh = w->sh, level = INFINITY;
    for (int64_t k = 0; k < n_used; ++k) {
        int64_t l = links[k];
        sh[k] = rem[l] / (double)load[l];
        if (sh[k] < level) level = sh[k];
    }
    int64_t n_open = n;
    while (n_open > 0 && n_used > 0) {
        double at = level > 0.0 ? level : 0.0, bound = level * (1 + REL_TIE);
        int64_t n_hit = 0;
        for (int64_t k = 0; k < n_used; ++k) {
            if (!(sh[k] <= bound)) continue;
            int64_t l = links[k];
            for (int64_t p = w->start[l]; p < w->end[l]; ++p) {
                int64_t i = lf[p];
                if (w->state[i]) continue;
                w->state[i] = 1;
                w->hits[n_hit++] = i;
            }
        }
        if (!n_hit) break; /* no link at its own level: cannot happen with finite shares */
        for (int64_t j = 0; j < n_hit; ++j) {
            int64_t i = w->hits[j];
            rate[i] = at;
            for (int64_t e = off[i]; e < off[i + 1]; ++e) frozen[idx[e]] += 1;
        }
        n_open -= n_hit;
        int64_t loaded = 0;
        level = INFINITY;
        for (int64_t k = 0; k < n_used; ++k) {
            int64_t l = links[k];
            double share = sh[k];
            if (frozen[l]) {
                load[l] -= frozen[l];
                rem[l] -= (double)frozen[l] * at;
                frozen[l] = 0;
                if (load[l] > 0) share = rem[l] / (double)load[l];
            }
            if (load[l] > 0) {
                links[loaded] = l, sh[loaded++] = share;
                if (share < level) level = share;
            }
        }
        n_used = loaded;
    }
    for (int64_t k = 0; k < n_used; ++k) load[links[k]] = 0; /* only after a break */
    if (n_open) /* flows crossing no link: rate 0, as the numpy reference leaves them */
        for (int64_t i = 0; i < n; ++i)
            if (!w->state[i]) rate[i] = 0.0;
    return 0;
}

/* Max-min rates (module comment); uncapped through max_min_fill, capped by scanning. */
int m4ray_max_min(int64_t n, const int64_t *off, const int64_t *idx, int64_t n_links,
                  const double *capacity, const double *caps, double *rate) {
    if (caps) return max_min_scan(NULL, n, off, idx, n_links, capacity, caps, rate);
    mmws *w = mm_new(n_links);
    if (!w) return 2;
    int rc = max_min_fill(w, n, off, idx, capacity, rate);
    mm_free(w);
    return rc;
}

/* flowSim's active flows, compiled: the twin of m4ray.sim.flowsim.FlowSim's numpy state (the
 * reference and the fallback). Flows are kept in arrival order as parallel arrays with their
 * links as CSR; rates are recomputed (max-min, then ACK_PASSES - 1 more passes over the
 * capacity the ACKs leave, as FlowSim._share) only when something changed. Each step of the
 * numpy loop (next completion, advance, complete) is one function here with the same arithmetic
 * in the same order, so finish times agree with the numpy path to the bit (tests hold them to
 * it); m4ray/sim/_dagloop.c drives them. A flow carries a caller's tag. */
typedef struct {
    int64_t n, cap, n_idx, cap_idx, n_links, ack_passes;
    int64_t *tag, *len, *off, *idx, *finishing, n_finishing;
    double *delay, *caps, *remaining, *rates, *left;
    double *capacity, *ack_cap, *data, ack_fraction;
    int capped, dirty;
    mmws *ws;
    scanws *sc; /* the capped max-min's scratch */
    /* standing queues (m4ray_fluidsim_queued; FlowSim's StandingQueues): each flow's round
     * trip and start, the window on the wire, each link's queue cap, and per-link sums at a
     * rate computation; q_first: only flows in their first round trip keep an excess;
     * q_buffer > 0: first windows over the level, up to it (q_young: their per-link sums) */
    double *rtt, *t_start, *q_cap, *q_load, *q_excess, *q_young, q_window, q_buffer;
    int queued, q_fresh, q_first;
    /* DCQCN's rates (m4ray_fluidsim_dcqcn; FlowSim's _DcqcnState): per flow its rate, target,
     * line rate, last cut, next increase and increases since the cut, with scratch for its
     * capped share and its share under contention (queue waits); per link whether a switch
     * sends on it, K_min, and the sums that find the links that cut */
    double *d_rate, *d_target, *d_line, *d_tcut, *d_tinc, *d_caps, *d_cont;
    int64_t *d_stage;
    unsigned char *d_switch;
    double *d_kmin, *d_load, *d_held, *d_excess;
    double d_dec, d_inc, d_ai, d_hai, d_min;
    int64_t d_frs;
    int dcqcn, d_clamp;
    /* FIFO service (m4ray_fluidsim_fifo; FlowSim's service="fifo"): the flows of at most f_bits
     * (f_in[i]) served in order of arrival (each stamped, in t_start, at the first rate
     * computation after it arrived), the flows of one instant sharing max-min what earlier ones
     * left, then the others sharing what is left (f_resid, f_sum: per link; f_members,
     * f_off, f_idx, f_caps, f_rates: one group's flows gathered) */
    double *f_resid, *f_sum, *f_caps, *f_rates, f_bits;
    int64_t *f_members, *f_off, *f_idx, *f_touched, f_stamped;
    unsigned char *f_in, *f_mark;
    int fifo;
} fluidsim;

void m4ray_fluidsim_free(fluidsim *s) {
    if (!s) return;
    free(s->tag);
    free(s->len);
    free(s->off);
    free(s->idx);
    free(s->finishing);
    free(s->delay);
    free(s->caps);
    free(s->remaining);
    free(s->rates);
    free(s->left);
    free(s->capacity);
    free(s->ack_cap);
    free(s->data);
    free(s->rtt);
    free(s->t_start);
    free(s->q_cap);
    free(s->q_load);
    free(s->q_excess);
    free(s->q_young);
    free(s->d_rate);
    free(s->d_target);
    free(s->d_line);
    free(s->d_tcut);
    free(s->d_tinc);
    free(s->d_caps);
    free(s->d_cont);
    free(s->d_stage);
    free(s->d_switch);
    free(s->d_kmin);
    free(s->d_load);
    free(s->d_held);
    free(s->d_excess);
    free(s->f_resid);
    free(s->f_sum);
    free(s->f_caps);
    free(s->f_rates);
    free(s->f_members);
    free(s->f_off);
    free(s->f_idx);
    free(s->f_in);
    free(s->f_touched);
    free(s->f_mark);
    mm_free(s->ws);
    sc_free(s->sc);
    free(s);
}

fluidsim *m4ray_fluidsim_new(int64_t n_links, const double *capacity, double ack_fraction,
                             int64_t ack_passes, int capped) {
    fluidsim *s = calloc(1, sizeof(fluidsim));
    if (!s) return NULL;
    s->n_links = n_links, s->ack_fraction = ack_fraction, s->ack_passes = ack_passes;
    s->capped = capped;
    s->capacity = malloc((n_links + 1) * sizeof(double));
    s->ack_cap = malloc((n_links + 1) * sizeof(double));
    s->data = malloc((n_links + 1) * sizeof(double));
    s->off = calloc(1, sizeof(int64_t));
    s->ws = mm_new(n_links);
    s->sc = calloc(1, sizeof(scanws));
    if (!s->capacity || !s->ack_cap || !s->data || !s->off || !s->ws || !s->sc) {
        m4ray_fluidsim_free(s);
        return NULL;
    }
    for (int64_t l = 0; l < n_links; ++l) s->capacity[l] = capacity[l];
    return s;
}

static int fs_grow(fluidsim *s, int64_t n, int64_t n_idx) {
    if (n > s->cap) {
        int64_t c = s->cap ? 2 * s->cap : 64;
        while (c < n) c *= 2;
#define GROW(p, T)                                       \
    do {                                                 \
        void *q = realloc(s->p, (c + 1) * sizeof(T));    \
        if (!q) return 2;                                \
        s->p = q;                                        \
    } while (0)
        GROW(tag, int64_t);
        GROW(len, int64_t);
        GROW(off, int64_t);
        GROW(finishing, int64_t);
        GROW(delay, double);
        GROW(caps, double);
        GROW(remaining, double);
        GROW(rates, double);
        GROW(left, double);
        GROW(rtt, double);
        GROW(t_start, double);
        GROW(d_rate, double);
        GROW(d_target, double);
        GROW(d_line, double);
        GROW(d_tcut, double);
        GROW(d_tinc, double);
        GROW(d_caps, double);
        GROW(d_cont, double);
        GROW(d_stage, int64_t);
        GROW(f_caps, double);
        GROW(f_rates, double);
        GROW(f_members, int64_t);
        GROW(f_off, int64_t);
        GROW(f_in, unsigned char);
#undef GROW
        s->cap = c;
    }
    if (n_idx > s->cap_idx) {
        int64_t c = s->cap_idx ? 2 * s->cap_idx : 256;
        while (c < n_idx) c *= 2;
        void *q = realloc(s->idx, c * sizeof(int64_t));
        if (!q) return 2;
        s->idx = q;
        q = realloc(s->f_idx, c * sizeof(int64_t));
        if (!q) return 2;
        s->f_idx = q, s->cap_idx = c;
    }
    return 0;
}

/* A flow arrives: appended after every active one (rates are stale until the next step). */
int m4ray_fluidsim_add(fluidsim *s, int64_t tag, int64_t n, const int64_t *links, double delay,
                       double cap, double bits) {
    if (fs_grow(s, s->n + 1, s->n_idx + n)) return 2;
    int64_t i = s->n++;
    s->tag[i] = tag, s->len[i] = n, s->delay[i] = delay, s->caps[i] = cap;
    s->remaining[i] = bits, s->rtt[i] = 0.0, s->t_start[i] = 0.0;
    for (int64_t k = 0; k < n; ++k) s->idx[s->n_idx++] = links[k];
    s->off[i + 1] = s->n_idx;
    /* DCQCN: starts at its line rate (its cap, else its first link), uncut */
    double first = n ? s->capacity[links[0]] : INFINITY;
    s->d_line[i] = cap < first ? cap : first;
    s->d_rate[i] = INFINITY, s->d_target[i] = INFINITY, s->d_tcut[i] = -INFINITY;
    s->d_tinc[i] = INFINITY, s->d_stage[i] = 0;
    s->f_in[i] = bits <= s->f_bits;
    s->dirty = 1;
    return 0;
}

void m4ray_fluidsim_set_capacity(fluidsim *s, int64_t link, double bps) {
    s->capacity[link] = bps;
    s->dirty = 1;
}

static int fs_max_min(fluidsim *s, const double *capacity, const double *caps, double *rates) {
    if (caps) return max_min_scan(s->sc, s->n, s->off, s->idx, s->n_links, capacity, caps, rates);
    return max_min_fill(s->ws, s->n, s->off, s->idx, capacity, rates);
}

/* FlowSim._share: max-min rates under caps (NULL: none) into rates, with the ACKs' passes. */
static int fs_share_into(fluidsim *s, const double *caps, double *rates) {
    s->q_fresh = 0;
    int rc = fs_max_min(s, s->capacity, caps, rates);
    if (rc || s->ack_fraction == 0.0) return rc;
    for (int64_t pass = 1; pass < s->ack_passes; ++pass) {
        /* FlowSim._share: data per link summed in flow order (np.bincount), then
         * fairshare.ack_capacity over the links' reverses (2k <-> 2k + 1) */
        for (int64_t l = 0; l < s->n_links; ++l) s->data[l] = 0.0;
        for (int64_t i = 0; i < s->n; ++i)
            for (int64_t e = s->off[i]; e < s->off[i + 1]; ++e) s->data[s->idx[e]] += rates[i];
        for (int64_t l = 0; l < s->n_links; ++l) {
            double c = s->capacity[l], d = s->data[l ^ 1];
            double load = s->ack_fraction * (d > 0.0 ? d : 0.0);
            double left = c - load, floor = 0.01 * c;
            s->ack_cap[l] = left >= floor ? left : floor;
        }
        rc = fs_max_min(s, s->ack_cap, caps, rates);
        if (rc) return rc;
    }
    return 0;
}

/* FIFO service on (FlowSim's service="fifo") for flows of at most bits on the wire (INFINITY:
 * every flow), before any flow arrives. 0 or 2. */
int m4ray_fluidsim_fifo(fluidsim *s, double bits) {
    s->f_resid = malloc((s->n_links + 1) * sizeof(double));
    s->f_sum = malloc((s->n_links + 1) * sizeof(double));
    s->f_touched = malloc((s->n_links + 1) * sizeof(int64_t));
    s->f_mark = calloc(s->n_links + 1, 1);
    if (!s->f_resid || !s->f_sum || !s->f_touched || !s->f_mark) return 2;
    s->fifo = 1, s->f_bits = bits;
    return 0;
}

/* One group of fairshare.fifo_rates: its flows (f_members[0 .. m)) share max-min (under caps;
 * NULL: none) what f_resid has left; their rates written, f_resid reduced. 0 or 2. */
static int fs_fifo_group(fluidsim *s, int64_t m, const double *caps, double *rates) {
    double *resid = s->f_resid, *sum = s->f_sum;
    int64_t e_out = 0;
    s->f_off[0] = 0;
    for (int64_t k = 0; k < m; ++k) {
        int64_t i = s->f_members[k];
        for (int64_t e = s->off[i]; e < s->off[i + 1]; ++e) s->f_idx[e_out++] = s->idx[e];
        s->f_off[k + 1] = e_out;
        if (caps) s->f_caps[k] = caps[i];
    }
    int rc = caps ? max_min_scan(s->sc, m, s->f_off, s->f_idx, s->n_links, resid, s->f_caps,
                                 s->f_rates)
                  : max_min_fill(s->ws, m, s->f_off, s->f_idx, resid, s->f_rates);
    if (rc) return rc;
    /* per link the group's rates summed in flow order (np.bincount), only on its own links */
    int64_t n_touched = 0;
    for (int64_t k = 0; k < m; ++k) {
        rates[s->f_members[k]] = s->f_rates[k];
        for (int64_t e = s->f_off[k]; e < s->f_off[k + 1]; ++e) {
            int64_t l = s->f_idx[e];
            if (!s->f_mark[l]) s->f_mark[l] = 1, sum[l] = 0.0, s->f_touched[n_touched++] = l;
            sum[l] += s->f_rates[k];
        }
    }
    for (int64_t j = 0; j < n_touched; ++j) {
        int64_t l = s->f_touched[j];
        double r = resid[l] - sum[l];
        resid[l] = r > 0.0 ? r : 0.0;
        s->f_mark[l] = 0;
    }
    return 0;
}

/* fairshare.fifo_rates: the flows served in order (f_in), in arrival order, each instant's
 * sharing max-min (under caps; NULL: none) what the earlier instants' left, per link floored
 * at 0; then the others sharing what is left. */
static int fs_fifo_share(fluidsim *s, const double *caps, double *rates) {
    for (int64_t l = 0; l < s->n_links; ++l) s->f_resid[l] = s->capacity[l];
    int64_t m = 0, rc;
    for (int64_t i = 0; i < s->n; ++i) {
        if (!s->f_in[i]) continue;
        if (m && s->t_start[i] != s->t_start[s->f_members[m - 1]]) {
            if ((rc = fs_fifo_group(s, m, caps, rates))) return (int)rc;
            m = 0;
        }
        s->f_members[m++] = i;
    }
    if (m && (rc = fs_fifo_group(s, m, caps, rates))) return (int)rc;
    m = 0;
    for (int64_t i = 0; i < s->n; ++i)
        if (!s->f_in[i]) s->f_members[m++] = i;
    if (m && (rc = fs_fifo_group(s, m, caps, rates))) return (int)rc;
    return 0;
}

/* The capacity the last share computation shared (FlowSim._shared). */
static const double *fs_shared(const fluidsim *s) {
    return s->ack_fraction != 0.0 && s->ack_passes > 1 ? s->ack_cap : s->capacity;
}

/* DCQCN on (FlowSim's rate_control, DcqcnRates): its decrease and increase intervals, fast
 * recovery steps, AI and hyper AI, whether the target clamps, the minimum rate, and per link
 * whether a switch sends on it (CNPs come from there) and K_min (bytes). 0 or 2. */
int m4ray_fluidsim_dcqcn(fluidsim *s, double decrease_s, double increase_s, int64_t fast_steps,
                         double ai, double hai, int clamp, double min_rate,
                         const unsigned char *switch_link, const double *k_min) {
    int64_t n = s->n_links + 1;
    s->d_switch = malloc(n);
    s->d_kmin = malloc(n * sizeof(double));
    s->d_load = malloc(n * sizeof(double));
    s->d_held = malloc(n * sizeof(double));
    s->d_excess = malloc(n * sizeof(double));
    if (!s->d_switch || !s->d_kmin || !s->d_load || !s->d_held || !s->d_excess) return 2;
    for (int64_t l = 0; l < s->n_links; ++l) s->d_switch[l] = switch_link[l], s->d_kmin[l] = k_min[l];
    s->d_dec = decrease_s, s->d_inc = increase_s, s->d_frs = fast_steps, s->d_ai = ai;
    s->d_hai = hai, s->d_clamp = clamp, s->d_min = min_rate, s->dcqcn = 1;
    return 0;
}

/* _DcqcnState.increase: every increase timer due by now; whether any rate moved. */
static int dq_increase(fluidsim *s, double now) {
    int any = 0;
    for (int64_t i = 0; i < s->n; ++i) {
        if (!(s->d_tinc[i] <= now)) continue;
        any = 1;
        int64_t stage = s->d_stage[i];
        double step = stage == s->d_frs ? s->d_ai : s->d_hai;
        double raised = s->d_target[i] + (stage >= s->d_frs ? step : 0.0);
        s->d_target[i] = raised < s->d_line[i] ? raised : s->d_line[i];
        s->d_rate[i] = (s->d_rate[i] + s->d_target[i]) / 2;
        s->d_stage[i] += 1;
        s->d_tinc[i] += s->d_inc;
    }
    return any;
}

/* FlowSim._dcqcn_rates: the shares under DCQCN's rates as caps; where they fill a switch's
 * link, hold a flow on it below its rate and line rate, and its flows' excess in flight passes
 * K_min, the flows crossing it not cut within the decrease interval are cut to their shares
 * (_DcqcnState.cut), and the shares are made again. */
static int dq_capped_share(fluidsim *s) { /* the shares under min(cap, DCQCN's rate) */
    for (int64_t i = 0; i < s->n; ++i)
        s->d_caps[i] = s->caps[i] < s->d_rate[i] ? s->caps[i] : s->d_rate[i];
    return fs_share_into(s, s->d_caps, s->rates);
}

static int dq_rates(fluidsim *s, double now) {
    int rc = dq_capped_share(s);
    if (rc) return rc;
    for (int64_t l = 0; l < s->n_links; ++l)
        s->d_load[l] = 0.0, s->d_held[l] = 0.0, s->d_excess[l] = 0.0;
    double window = s->queued ? s->q_window : INFINITY;
    for (int64_t i = 0; i < s->n; ++i) {
        double r = s->d_rate[i] < s->d_line[i] ? s->d_rate[i] : s->d_line[i];
        double held = s->rates[i] < r * (1.0 - QUEUE_FULL) ? 1.0 : 0.0;
        double left = s->remaining[i] / 8.0;
        double excess = (window < left ? window : left) - s->rates[i] * s->rtt[i] / 8.0;
        if (excess < 0.0) excess = 0.0;
        for (int64_t e = s->off[i]; e < s->off[i + 1]; ++e) {
            int64_t l = s->idx[e];
            s->d_load[l] += s->rates[i], s->d_held[l] += held, s->d_excess[l] += excess;
        }
    }
    const double *shared = fs_shared(s);
    for (int64_t l = 0; l < s->n_links; ++l) /* d_load: 1 where the link cuts */
        s->d_load[l] = s->d_load[l] >= shared[l] * (1.0 - QUEUE_FULL) && s->d_switch[l] &&
                       s->d_held[l] > 0 && s->d_excess[l] > s->d_kmin[l];
    int any = 0;
    for (int64_t i = 0; i < s->n; ++i) {
        int met = 0;
        for (int64_t e = s->off[i]; e < s->off[i + 1] && !met; ++e) met = s->d_load[s->idx[e]] > 0;
        if (!met || !(now - s->d_tcut[i] >= s->d_dec)) continue;
        int fresh = !isfinite(s->d_tcut[i]) || s->d_stage[i] != 0 || s->d_clamp;
        double before = s->d_rate[i] < s->d_line[i] ? s->d_rate[i] : s->d_line[i];
        if (fresh) s->d_target[i] = before;
        s->d_rate[i] = s->d_min > s->rates[i] ? s->d_min : s->rates[i];
        s->d_tcut[i] = now, s->d_tinc[i] = now + s->d_inc, s->d_stage[i] = 0;
        any = 1;
    }
    return any ? dq_capped_share(s) : 0;
}

/* FlowSim._refresh: DCQCN's due increases, then the rates brought up to date if anything
 * changed. 0, 2 out of memory or 3 no rate. */
static int fs_refresh(fluidsim *s, double now) {
    if (s->n == 0) return 0;
    if (s->dcqcn && dq_increase(s, now)) s->dirty = 1;
    if (!s->dirty) return 0;
    const double *caps = s->capped ? s->caps : NULL;
    int rc;
    if (s->fifo) {
        for (; s->f_stamped < s->n; ++s->f_stamped) s->t_start[s->f_stamped] = now;
        s->q_fresh = 0;
        rc = fs_fifo_share(s, caps, s->rates);
    } else {
        rc = s->dcqcn ? dq_rates(s, now) : fs_share_into(s, caps, s->rates);
    }
    if (!rc) s->dirty = 0;
    return rc;
}

/* The next completion from now: its time in *t_done (INFINITY: no flow) and how many flows
 * finish with it (within REL_TIE of the earliest), kept for m4ray_fluidsim_complete.
 * Returns 0, 2 out of memory, or 3 when active flows have no rate. */
int m4ray_fluidsim_next(fluidsim *s, double now, double *t_done, int64_t *n_finishing) {
    s->n_finishing = 0;
    *n_finishing = 0;
    if (s->n == 0) {
        *t_done = INFINITY;
        return 0;
    }
    int rc = fs_refresh(s, now);
    if (rc) return rc;
    double m = INFINITY;
    for (int64_t i = 0; i < s->n; ++i) {
        s->left[i] = s->rates[i] > 0 ? s->remaining[i] / s->rates[i] : INFINITY;
        if (s->left[i] < m) m = s->left[i];
    }
    double dt = 0.0 > m ? 0.0 : m;
    if (dt == INFINITY) return 3;
    double bound = dt * (1 + REL_TIE);
    *t_done = now + dt;
    if (s->dcqcn) { /* an increase timer before any completion: wake for it */
        double t_increase = INFINITY;
        for (int64_t i = 0; i < s->n; ++i)
            if (s->d_tinc[i] < t_increase) t_increase = s->d_tinc[i];
        if (t_increase < *t_done) {
            *t_done = t_increase;
            return 0;
        }
    }
    for (int64_t i = 0; i < s->n; ++i)
        if (s->left[i] <= bound) s->finishing[s->n_finishing++] = i;
    *n_finishing = s->n_finishing;
    return 0;
}

/* Standing queues on (FlowSim's StandingQueues): window = the senders' window on the wire
 * (bytes), q_cap[l] = the most link l queues (its CC's standing level, bytes); first: only
 * flows in their first round trip keep an excess (HPCC); buffer > 0: flows in their first
 * round trip queue their excess on top of the level, up to it (StandingQueues.buffer_bytes).
 * 0 or 2. */
int m4ray_fluidsim_queued(fluidsim *s, double window, const double *q_cap, int first,
                          double buffer) {
    int64_t n = s->n_links + 1;
    s->q_cap = malloc(n * sizeof(double));
    s->q_load = malloc(n * sizeof(double));
    s->q_excess = malloc(n * sizeof(double));
    s->q_young = malloc(n * sizeof(double));
    if (!s->q_cap || !s->q_load || !s->q_excess || !s->q_young) return 2;
    for (int64_t l = 0; l < s->n_links; ++l) s->q_cap[l] = q_cap[l];
    s->q_window = window, s->queued = 1, s->q_fresh = 0, s->q_first = first;
    s->q_buffer = buffer > 0 ? buffer : 0.0;
    return 0;
}

/* FlowSim._burst_delay's sums: per link the data rate, the excess of the flows past their first
 * round trip (none with q_first) and of those in it, each flow's in flight at most its bits
 * left and, without a window (q_window infinite), a young flow's one round trip at its line
 * rate (its cap, else its first link). */
static void fs_burst_sums(fluidsim *s, double now, const double *rates) {
    for (int64_t l = 0; l < s->n_links; ++l)
        s->q_load[l] = 0.0, s->q_excess[l] = 0.0, s->q_young[l] = 0.0;
    int unbounded = isinf(s->q_window);
    for (int64_t i = 0; i < s->n; ++i) {
        double left = s->remaining[i] / 8.0, window = s->q_window;
        int young = now - s->t_start[i] < s->rtt[i];
        if (unbounded && young) {
            double line = s->capacity[s->idx[s->off[i]]];
            if (s->capped && s->caps[i] < line) line = s->caps[i];
            window = line * s->rtt[i] / 8.0;
        }
        double excess = (window < left ? window : left) - rates[i] * s->rtt[i] / 8.0;
        if (excess < 0.0) excess = 0.0;
        double *sums = young ? s->q_young : s->q_excess;
        if (!young && s->q_first) excess = 0.0;
        for (int64_t e = s->off[i]; e < s->off[i + 1]; ++e) {
            s->q_load[s->idx[e]] += rates[i];
            sums[s->idx[e]] += excess;
        }
    }
}

/* The queueing delay a flow arriving at time now meets on links[0..n) (FlowSim._queue_delay,
 * the same arithmetic in the same order): rates brought up to date, then per link the data
 * rate and the bytes the flows crossing it keep in flight beyond their own bandwidth-delay
 * product (window - rate x rtt, at least 0; with q_first only a flow that started less than
 * its round trip ago); a link whose data fill its capacity (the one the last pass shared)
 * holds the lesser of that and its cap (0 on hosts' uplinks), which the flow waits to drain.
 * Returns 0, 2 out of memory, or 3 when active flows have no rate; *queue_s the delay. */
int m4ray_fluidsim_queue_delay(fluidsim *s, int64_t n, const int64_t *links, double now,
                               double *queue_s) {
    *queue_s = 0.0;
    if (!s->queued) return 0;
    int rc = fs_refresh(s, now);
    if (rc || s->n == 0) return rc;
    const double *rates = s->rates;
    if (s->dcqcn) { /* contention: the shares DCQCN's cuts answer (never kept); uncapped
                       * flows' caps are all infinite: the uncapped max-min gives the same */
        rc = fs_share_into(s, s->capped ? s->caps : NULL, s->d_cont);
        if (rc) return rc;
        rates = s->d_cont;
    }
    if (s->q_buffer > 0) {
        fs_burst_sums(s, now, rates); /* ages with time and drains with the flows: every arrival */
    } else if (!s->q_fresh) {
        for (int64_t l = 0; l < s->n_links; ++l) s->q_load[l] = 0.0, s->q_excess[l] = 0.0;
        for (int64_t i = 0; i < s->n; ++i) {
            double excess = s->q_window - rates[i] * s->rtt[i] / 8.0;
            if (excess < 0.0 || (s->q_first && !(now - s->t_start[i] < s->rtt[i]))) excess = 0.0;
            for (int64_t e = s->off[i]; e < s->off[i + 1]; ++e) {
                s->q_load[s->idx[e]] += rates[i];
                s->q_excess[s->idx[e]] += excess;
            }
        }
        /* first round trips: young flows age with time; contention's shares are made anew */
        s->q_fresh = !s->q_first && !s->dcqcn;
    }
    const double *shared = fs_shared(s);
    double total = 0.0;
    for (int64_t k = 0; k < n; ++k) {
        int64_t l = links[k];
        if (s->q_load[l] < shared[l] * (1.0 - QUEUE_FULL)) continue;
        double q = s->q_excess[l] < s->q_cap[l] ? s->q_excess[l] : s->q_cap[l];
        if (s->q_buffer > 0) {
            if (s->q_cap[l] <= 0) continue; /* a host's uplink: its NIC paces its flows */
            q += s->q_young[l];
            if (q > s->q_buffer) q = s->q_buffer;
        }
        total += q * 8.0 / s->capacity[l];
    }
    *queue_s = total;
    return 0;
}

void m4ray_fluidsim_set_queue_cap(fluidsim *s, int64_t link, double bytes) {
    if (s->queued) s->q_cap[link] = bytes;
}

/* The round trip and start of the flow added last (standing queues' excess in flight). */
void m4ray_fluidsim_set_rtt(fluidsim *s, double rtt, double start) {
    if (s->n) s->rtt[s->n - 1] = rtt, s->t_start[s->n - 1] = start;
}

void m4ray_fluidsim_advance(fluidsim *s, double dt) {
    if (dt > 0)
        for (int64_t i = 0; i < s->n; ++i) s->remaining[i] = s->remaining[i] - s->rates[i] * dt;
}

/* Remove the flows the last m4ray_fluidsim_next found finishing, writing their tags and
 * delivery delays in arrival order; the others keep their order. */
void m4ray_fluidsim_complete(fluidsim *s, int64_t *tags, double *delays) {
    int64_t k = 0, kept = 0, e_out = 0;
    for (int64_t i = 0; i < s->n; ++i) {
        int64_t lo = s->off[i], hi = s->off[i + 1];
        if (k < s->n_finishing && s->finishing[k] == i) {
            tags[k] = s->tag[i], delays[k] = s->delay[i];
            ++k;
            continue;
        }
        s->tag[kept] = s->tag[i], s->len[kept] = s->len[i], s->delay[kept] = s->delay[i];
        s->caps[kept] = s->caps[i], s->remaining[kept] = s->remaining[i];
        s->rates[kept] = s->rates[i], s->rtt[kept] = s->rtt[i], s->t_start[kept] = s->t_start[i];
        s->d_rate[kept] = s->d_rate[i], s->d_target[kept] = s->d_target[i];
        s->d_line[kept] = s->d_line[i], s->d_tcut[kept] = s->d_tcut[i];
        s->d_tinc[kept] = s->d_tinc[i], s->d_stage[kept] = s->d_stage[i];
        s->f_in[kept] = s->f_in[i];
        for (int64_t e = lo; e < hi; ++e) s->idx[e_out++] = s->idx[e];
        ++kept;
        s->off[kept] = e_out;
    }
    s->n = kept, s->n_idx = e_out, s->n_finishing = 0;
    s->f_stamped = kept; /* every flow left was stamped by the step that found these */
    s->dirty = 1;
}

/* A set of flows known up front through this fluid state, with no caller in between (m3's
 * path flowSim under DCQCN's rates): flow i crosses links idx[off[i] .. off[i+1]), carries
 * bits[i] and arrives at start[i] (order: the flows by start, stably), capped at cap[i]; rtt[i]
 * its round trip (standing queues) and line[i] its DCQCN line rate (NULL: its cap or first
 * link, as m4ray_fluidsim_add has it). The same steps as FlowSim.run over a trace (completion
 * wins ties with arrivals; each arrival waits for the queues it meets, then joins). Writes
 * finish[i] (its last bit drained) and wait[i] (the queues it waited for at arrival).
 * Returns 0, 2 out of memory or 3 when active flows have no rate. */
int m4ray_fluidsim_trace(fluidsim *s, int64_t n, const int64_t *order, const int64_t *off,
                         const int64_t *idx, const double *bits, const double *start,
                         const double *cap, const double *rtt, const double *line,
                         double *finish, double *wait) {
    int64_t *tags = malloc((n + 1) * sizeof(int64_t));
    double *delays = malloc((n + 1) * sizeof(double));
    int rc = tags && delays ? 0 : 2;
    double now = 0.0;
    int64_t next = 0;
    while (!rc) {
        double t_arrive = next < n ? start[order[next]] : INFINITY, t_done;
        int64_t n_fin;
        rc = m4ray_fluidsim_next(s, now, &t_done, &n_fin);
        if (rc || (t_done == INFINITY && t_arrive == INFINITY)) break;
        if (t_done <= t_arrive) {
            m4ray_fluidsim_advance(s, t_done - now);
            now = t_done;
            m4ray_fluidsim_complete(s, tags, delays);
            for (int64_t k = 0; k < n_fin; ++k) finish[tags[k]] = now;
            continue;
        }
        m4ray_fluidsim_advance(s, t_arrive - now);
        now = t_arrive;
        while (!rc && next < n && start[order[next]] <= now) {
            int64_t i = order[next++], len = off[i + 1] - off[i];
            double q = 0.0;
            if (s->queued) rc = m4ray_fluidsim_queue_delay(s, len, idx + off[i], now, &q);
            if (!rc) rc = m4ray_fluidsim_add(s, i, len, idx + off[i], q, cap[i], bits[i]);
            if (rc) break;
            wait[i] = q;
            if (s->queued) m4ray_fluidsim_set_rtt(s, rtt[i], now);
            if (line) s->d_line[s->n - 1] = line[i];
        }
    }
    free(tags), free(delays);
    return rc;
}

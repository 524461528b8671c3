/* flowSim for a set of flows that all start at time 0, compiled: the lockstep replay's rounds
 * (m4ray/sim/lockstep.py). The same algorithm as m4ray.sim.flowsim.FlowSim with no window, cap
 * or ACK load — progressive filling (max_min_rates), re-shared whenever flows drain, drains and
 * shares within REL_TIE together, delivery = drain end + delay — with the same arithmetic, so
 * the two agree to rounding. What differs is the cost of a share: a heap of link shares and
 * per-link flow lists, so freezing a level touches only its flows (O(edges log links) per share,
 * where the numpy loop scans every edge per level). Built and loaded by m4ray.native; called
 * through ctypes. Units: bits, bits/s, seconds.
 *
 * Returns 0; 1 when active flows have zero rate (a link without capacity); 2 out of memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REL_TIE 1e-9

typedef struct {
    double share;
    int64_t link;
    int64_t version;
} entry;

typedef struct {
    entry *v;
    int64_t n, cap;
} heap;

static int before(const entry *x, const entry *y) {
    return x->share < y->share || (x->share == y->share && x->link < y->link);
}

static int push(heap *h, entry e) {
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 1024;
        entry *v = realloc(h->v, sizeof(entry) * cap);
        if (!v) return 2;
        h->v = v;
        h->cap = cap;
    }
    int64_t i = h->n++;
    h->v[i] = e;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!before(&h->v[i], &h->v[p])) break;
        entry t = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = t;
        i = p;
    }
    return 0;
}

static entry pop(heap *h) {
    entry top = h->v[0];
    h->v[0] = h->v[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && before(&h->v[l], &h->v[m])) m = l;
        if (r < h->n && before(&h->v[r], &h->v[m])) m = r;
        if (m == i) break;
        entry t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
    return top;
}

/* n flows; flow i crosses links idx[off[i]..off[i+1]) (ids < n_links), carries bits[i] and is
 * delivered delay[i] after it drains. finish[i] (out): its delivery time. */
int m4ray_round_finish(int64_t n, const int64_t *off, const int64_t *idx, int64_t n_links,
                       const double *capacity, const double *bits, const double *delay,
                       double *finish) {
    int rc = 0;
    int64_t n_edges = off[n];
    int64_t *slot = malloc(sizeof(int64_t) * (n_links + 1));
    int64_t *edge_link = malloc(sizeof(int64_t) * (n_edges + 1));
    int64_t *lf_off = NULL, *lf_idx = NULL, *fill = NULL, *version = NULL, *count = NULL;
    int64_t *dirty = NULL, *bottleneck = NULL;
    double *cap = NULL, *remaining = NULL, *load = NULL;
    double *left = malloc(sizeof(double) * (n + 1));
    double *rate = malloc(sizeof(double) * (n + 1));
    char *active = malloc(n + 1), *frozen = malloc(n + 1);
    heap h = {NULL, 0, 0};
    if (!slot || !edge_link || !left || !rate || !active || !frozen) {
        rc = 2;
        goto out;
    }
    /* compact the links the flows use */
    int64_t m = 0;
    for (int64_t l = 0; l < n_links; l++) slot[l] = -1;
    for (int64_t e = 0; e < n_edges; e++) {
        if (slot[idx[e]] < 0) slot[idx[e]] = m++;
        edge_link[e] = slot[idx[e]];
    }
    lf_off = calloc(m + 1, sizeof(int64_t));
    lf_idx = malloc(sizeof(int64_t) * (n_edges + 1));
    fill = calloc(m + 1, sizeof(int64_t));
    version = calloc(m + 1, sizeof(int64_t));
    count = calloc(m + 1, sizeof(int64_t));
    dirty = malloc(sizeof(int64_t) * (m + 1));
    bottleneck = malloc(sizeof(int64_t) * (m + 1));
    cap = malloc(sizeof(double) * (m + 1));
    remaining = malloc(sizeof(double) * (m + 1));
    load = malloc(sizeof(double) * (m + 1));
    if (!lf_off || !lf_idx || !fill || !version || !count || !dirty || !bottleneck || !cap ||
        !remaining || !load) {
        rc = 2;
        goto out;
    }
    for (int64_t l = 0; l < n_links; l++)
        if (slot[l] >= 0) cap[slot[l]] = capacity[l];
    for (int64_t e = 0; e < n_edges; e++) lf_off[edge_link[e] + 1]++;
    for (int64_t l = 0; l < m; l++) lf_off[l + 1] += lf_off[l];
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = off[i]; e < off[i + 1]; e++) {
            int64_t l = edge_link[e];
            lf_idx[lf_off[l] + fill[l]++] = i;
        }
    /* the last share's freezes, in order: seq[lev_start[j]..lev_start[j+1]) froze at lev_val[j]
     * (level j); a flow's level index is level_of[i] */
    int64_t *act = malloc(sizeof(int64_t) * (n + 1));
    int64_t *seq = malloc(sizeof(int64_t) * (n + 1));
    int64_t *lev_start = malloc(sizeof(int64_t) * (n + 2));
    int64_t *level_of = malloc(sizeof(int64_t) * (n + 1));
    double *lev_val = malloc(sizeof(double) * (n + 1));
    double *base = malloc(sizeof(double) * (m + 1)); /* active flows per link */
    if (!act || !seq || !lev_start || !level_of || !lev_val || !base) {
        rc = 2;
        goto done;
    }
    for (int64_t l = 0; l < m; l++) base[l] = 0.0;
    for (int64_t i = 0; i < n; i++) {
        left[i] = bits[i];
        active[i] = 1;
        frozen[i] = 0;
        finish[i] = NAN;
        act[i] = i;
        level_of[i] = 0;
        for (int64_t e = off[i]; e < off[i + 1]; e++) base[edge_link[e]] += 1.0;
    }
    int64_t n_active = n, n_levels = 0, keep = 0; /* levels [0, keep) stand */
    lev_start[0] = 0;
    double now = 0.0;
    while (n_active > 0) {
        /* max-min rates of the active flows (flowsim.max_min_rates, no caps). Removing flows
         * that froze at level k leaves every level before k as it was (their links were no
         * bottleneck before k, and lose load), so the share restarts at the first level that
         * froze a flow which has since drained: the links as those earlier levels left them. */
        for (int64_t l = 0; l < m; l++) {
            load[l] = base[l];
            remaining[l] = cap[l];
        }
        for (int64_t j = 0; j < keep; j++) {
            int64_t nd = 0;
            for (int64_t k = lev_start[j]; k < lev_start[j + 1]; k++)
                for (int64_t e = off[seq[k]]; e < off[seq[k] + 1]; e++) {
                    int64_t x = edge_link[e];
                    if (count[x]++ == 0) dirty[nd++] = x;
                }
            for (int64_t d = 0; d < nd; d++) {
                int64_t l = dirty[d];
                load[l] -= (double)count[l];
                remaining[l] -= (double)count[l] * lev_val[j];
                count[l] = 0;
            }
        }
        n_levels = keep;
        int64_t n_seq = lev_start[keep];
        for (int64_t a = 0; a < n_active; a++) frozen[act[a]] = 0;
        for (int64_t k = 0; k < n_seq; k++) frozen[seq[k]] = 1;
        h.n = 0;
        for (int64_t l = 0; l < m; l++) {
            version[l]++;
            if (load[l] > 0 && (rc = push(&h, (entry){remaining[l] / load[l], l, version[l]})))
                goto done;
        }
        int64_t open = n_active - n_seq;
        while (open > 0) {
            double level = INFINITY;
            int64_t nb = 0;
            while (h.n > 0) {
                entry top = h.v[0];
                if (top.version != version[top.link] || load[top.link] <= 0) {
                    pop(&h);
                    continue;
                }
                if (nb == 0) level = top.share;
                if (top.share > level * (1 + REL_TIE)) break;
                pop(&h);
                bottleneck[nb++] = top.link;
            }
            if (nb == 0) break; /* no link limits the open flows: they keep rate 0 */
            double lvl = level > 0 ? level : 0.0;
            int64_t nd = 0;
            for (int64_t b = 0; b < nb; b++) {
                int64_t l = bottleneck[b];
                for (int64_t k = lf_off[l]; k < lf_off[l + 1]; k++) {
                    int64_t i = lf_idx[k];
                    if (frozen[i]) continue;
                    frozen[i] = 1;
                    rate[i] = lvl;
                    level_of[i] = n_levels;
                    seq[n_seq++] = i;
                    open--;
                    for (int64_t e = off[i]; e < off[i + 1]; e++) {
                        int64_t x = edge_link[e];
                        if (count[x]++ == 0) dirty[nd++] = x;
                    }
                }
            }
            lev_val[n_levels++] = lvl;
            lev_start[n_levels] = n_seq;
            for (int64_t d = 0; d < nd; d++) {
                int64_t l = dirty[d];
                load[l] -= (double)count[l];
                remaining[l] -= (double)count[l] * lvl;
                count[l] = 0;
                version[l]++;
                if (load[l] > 0 && (rc = push(&h, (entry){remaining[l] / load[l], l, version[l]})))
                    goto done;
            }
        }
        for (int64_t a = 0; a < n_active; a++)
            if (!frozen[act[a]]) { /* unlimited by any link: rate 0, as max_min_rates leaves it */
                rate[act[a]] = 0.0;
                level_of[act[a]] = n_levels;
            }
        /* drain to the next completion (FlowSim._next_completion, _advance, _complete) */
        double dt = INFINITY;
        for (int64_t a = 0; a < n_active; a++) {
            int64_t i = act[a];
            double to_go = rate[i] > 0 ? left[i] / rate[i] : INFINITY;
            if (to_go < dt) dt = to_go;
        }
        if (dt == INFINITY) {
            rc = 1;
            goto done;
        }
        if (dt < 0) dt = 0.0;
        double tie = dt * (1 + REL_TIE);
        now += dt;
        int64_t kept = 0;
        keep = n_levels;
        for (int64_t a = 0; a < n_active; a++) {
            int64_t i = act[a];
            double to_go = rate[i] > 0 ? left[i] / rate[i] : INFINITY;
            if (to_go <= tie) {
                active[i] = 0;
                frozen[i] = 1; /* a drained flow holds no share */
                finish[i] = now + delay[i];
                if (level_of[i] < keep) keep = level_of[i];
                for (int64_t e = off[i]; e < off[i + 1]; e++) base[edge_link[e]] -= 1.0;
            } else {
                left[i] = left[i] - rate[i] * dt;
                act[kept++] = i;
            }
        }
        n_active = kept;
    }
done:
    free(act);
    free(seq);
    free(lev_start);
    free(level_of);
    free(lev_val);
    free(base);
out:
    free(slot);
    free(edge_link);
    free(lf_off);
    free(lf_idx);
    free(fill);
    free(version);
    free(count);
    free(dirty);
    free(bottleneck);
    free(cap);
    free(remaining);
    free(load);
    free(left);
    free(rate);
    free(active);
    free(frozen);
    free(h.v);
    return rc;
}

/* flowSim on one path, compiled: the same algorithm, operation for operation, as
 * m4ray/m3/pathsim.py (class water-filling, per-class service heaps, NIC cap, tie rules), so the
 * two agree to rounding. Built and loaded by m4ray/m3/native.py; no Python API, called through
 * ctypes. Units: bits, bits/s, seconds.
 *
 * Returns 0, or 1 when a class with flows has zero rate (a path link without capacity), 2 when
 * memory runs out. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define REL_TIE 1e-9
#define QUEUE_FULL 1e-6 /* as m4ray/models/_maxmin.c: a link this close to full is full */

typedef struct {
    double key;  /* service at which the flow is done */
    int64_t flow;
} item;

typedef struct {
    item *v;
    int64_t n;
} heap;

static int less(const item *x, const item *y) {
    /* Python compares (key, flow) tuples */
    return x->key < y->key || (x->key == y->key && x->flow < y->flow);
}

static void push(heap *h, item it) {
    int64_t i = h->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!less(&it, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = it;
}

static item pop(heap *h) {
    item top = h->v[0];
    item last = h->v[--h->n];
    int64_t i = 0, n = h->n;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && less(&h->v[c + 1], &h->v[c])) c++;
        if (!less(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (n) h->v[i] = last;
    return top;
}

/* Max-min fair per-flow rate of each class, by progressive filling (pathsim.class_rates). */
static void class_rates(int k, const int *ca, const int *cb, const int64_t *counts, int L,
                        const double *capacity, double cap, double *rate, int *open_,
                        double *remaining, int64_t *load, char *bottleneck) {
    int n_open = 0;
    for (int i = 0; i < k; i++) {
        rate[i] = 0.0;
        if (counts[i] > 0) open_[n_open++] = i;
    }
    for (int l = 0; l < L; l++) remaining[l] = capacity[l];
    while (n_open) {
        for (int l = 0; l < L; l++) load[l] = 0;
        for (int j = 0; j < n_open; j++) {
            int i = open_[j];
            for (int l = ca[i]; l < cb[i]; l++) load[l] += counts[i];
        }
        double level = INFINITY;
        for (int l = 0; l < L; l++)
            if (load[l]) {
                double s = remaining[l] / (double)load[l];
                if (s < level) level = s;
            }
        if (cap <= level) {
            for (int j = 0; j < n_open; j++) rate[open_[j]] = cap;
            return;
        }
        if (level < 0.0) level = 0.0;
        double limit = level * (1 + REL_TIE);
        for (int l = 0; l < L; l++)
            bottleneck[l] = load[l] > 0 && remaining[l] / (double)load[l] <= limit;
        int still = 0;
        for (int j = 0; j < n_open; j++) {
            int i = open_[j];
            int hit = 0;
            for (int l = ca[i]; l < cb[i]; l++)
                if (bottleneck[l]) { hit = 1; break; }
            if (hit) {
                rate[i] = level;
                for (int l = ca[i]; l < cb[i]; l++) remaining[l] -= (double)counts[i] * level;
            } else {
                open_[still++] = i;
            }
        }
        n_open = still;
    }
}

/* Standing queues (pathsim._Queues): per path link the data rate and the bytes its flows
 * keep in flight beyond their bandwidth-delay product (window - rate x rtt, at least 0), by
 * class in class order; young (first round trips only): the flows of each class that keep
 * it, else all of them. */
static void queue_sums(int k, const int *ca, const int *cb, const int64_t *counts,
                       const int64_t *young, const double *rate, const double *crtt,
                       double window, int L, double *qload, double *qexcess) {
    for (int l = 0; l < L; l++) qload[l] = 0.0, qexcess[l] = 0.0;
    for (int c = 0; c < k; c++) {
        if (!counts[c]) continue;
        double excess = window - rate[c] * crtt[c] / 8.0;
        if (excess < 0.0) excess = 0.0;
        double keep = (double)(young ? young[c] : counts[c]);
        for (int l = ca[c]; l < cb[c]; l++) {
            qload[l] += (double)counts[c] * rate[c];
            qexcess[l] += keep * excess;
        }
    }
}

/* First windows over the level (pathsim._Queues._burst_wait): per path link the data rate, the
 * excess of the flows past their first round trip (qexcess; none with first) and of those in it
 * (qyoung), each at its own round trip (rtt: per flow), every active flow's in flight at most
 * the bits it has left and, without a window (window infinite), a young flow's at most one
 * round trip at its senders' line rate (the lesser of cap and its class's first link), by class
 * in class order and within a class in heap order. */
static void burst_sums(int k, const int *ca, const int *cb, const int64_t *counts,
                       const heap *heaps, const double *service, const double *rate,
                       const double *rtt, const double *start_s, double now, double window,
                       const double *capacity, double cap, int first, int L, double *qload,
                       double *qexcess, double *qyoung) {
    for (int l = 0; l < L; l++) qload[l] = 0.0, qexcess[l] = 0.0, qyoung[l] = 0.0;
    int unbounded = isinf(window);
    for (int c = 0; c < k; c++) {
        if (!counts[c]) continue;
        double e_old = 0.0, e_young = 0.0;
        double line = cap < capacity[ca[c]] ? cap : capacity[ca[c]];
        for (int64_t j = 0; j < heaps[c].n; j++) {
            int64_t f = heaps[c].v[j].flow;
            double left = (heaps[c].v[j].key - service[c]) / 8.0;
            int young = now - start_s[f] < rtt[f];
            double w = unbounded && young ? line * rtt[f] / 8.0 : window;
            double e = (w < left ? w : left) - rate[c] * rtt[f] / 8.0;
            if (e < 0.0) e = 0.0;
            if (young) e_young += e;
            else if (!first) e_old += e;
        }
        for (int l = ca[c]; l < cb[c]; l++) {
            qload[l] += (double)counts[c] * rate[c];
            qexcess[l] += e_old;
            qyoung[l] += e_young;
        }
    }
}

/* First round trips: the active flows of class c that arrived less than its round trip ago
 * (list[off[c]..]: the class's flows in arrival order; arrived[c] so far; oldest[c] the first
 * that may still be young, moved on as time passes). */
static int64_t young_flows(int c, double now, const double *start_s, const double *crtt,
                           const int64_t *off, const int64_t *list, const int64_t *arrived,
                           int64_t *oldest, const double *finish) {
    int64_t j = oldest[c], end = off[c] + arrived[c], n = 0;
    while (j < end && !(now - start_s[list[j]] < crtt[c])) j++;
    oldest[c] = j;
    for (; j < end; j++)
        if (isnan(finish[list[j]])) n++;
    return n;
}

/* n flows; cls[i]: class index of flow i (0..k-1, numbered in order of first appearance);
 * ca/cb: each class's first link and last link + 1; order: flow indices by start time (stable);
 * finish: out, the time each flow's last bit drained. With standing queues (rtt not NULL: each
 * flow's round trip; window: the senders' window on the wire, bytes; qcap: each path link's
 * most queued bytes; first: only flows in their first round trip keep their excess; buffer > 0:
 * first windows over the level, up to it, burst_sums), a flow arriving also waits for the queues
 * of the full links it crosses, added to its finish. */
int m4ray_path_finish(int64_t n, const int64_t *cls, const double *bits, const double *start_s,
                      const int64_t *order, int k, const int *ca, const int *cb, int L,
                      const double *capacity, double nic_cap, const double *rtt, double window,
                      const double *qcap, int first, double buffer, double *finish) {
    int rc = 2;
    double cap = nic_cap > 0 ? nic_cap : INFINITY;
    double *crtt = NULL, *qload = NULL, *qexcess = NULL, *qyoung = NULL, *wait = NULL;
    int64_t *young = NULL, *yoff = NULL, *ylist = NULL, *arrived = NULL, *oldest = NULL;
    int q_fresh = 0;
    if (rtt) {
        crtt = calloc(k ? k : 1, sizeof *crtt);
        qload = calloc(L ? L : 1, sizeof *qload);
        qexcess = calloc(L ? L : 1, sizeof *qexcess);
        qyoung = calloc(L ? L : 1, sizeof *qyoung);
        wait = calloc(n ? n : 1, sizeof *wait);
        if (!crtt || !qload || !qexcess || !qyoung || !wait) {
            free(crtt), free(qload), free(qexcess), free(qyoung), free(wait);
            return 2;
        }
        for (int64_t i = n - 1; i >= 0; i--) crtt[cls[i]] = rtt[i];
    }
    int64_t *counts = calloc(k, sizeof *counts), *size = calloc(k, sizeof *size);
    double *service = calloc(k, sizeof *service), *rate = calloc(k, sizeof *rate);
    heap *heaps = calloc(k, sizeof *heaps);
    int *open_ = calloc(k, sizeof *open_);
    double *remaining = calloc(L, sizeof *remaining);
    int64_t *load = calloc(L, sizeof *load);
    char *bottleneck = calloc(L, 1);
    if (!counts || !size || !service || !rate || !heaps || !open_ || !remaining || !load ||
        !bottleneck)
        goto out;
    if (rtt && first && !(buffer > 0)) {
        young = calloc(k ? k : 1, sizeof *young);
        yoff = calloc(k + 1, sizeof *yoff);
        ylist = calloc(n ? n : 1, sizeof *ylist);
        arrived = calloc(k ? k : 1, sizeof *arrived);
        oldest = calloc(k ? k : 1, sizeof *oldest);
        if (!young || !yoff || !ylist || !arrived || !oldest) goto out;
        for (int64_t i = 0; i < n; i++) yoff[cls[i] + 1]++;
        for (int c = 0; c < k; c++) yoff[c + 1] += yoff[c], oldest[c] = yoff[c];
        for (int64_t j = 0; j < n; j++) { /* each class's flows in arrival order */
            int64_t c = cls[order[j]];
            ylist[yoff[c] + arrived[c]++] = order[j];
        }
        for (int c = 0; c < k; c++) arrived[c] = 0;
    }
    for (int64_t i = 0; i < n; i++) size[cls[i]]++;
    for (int c = 0; c < k; c++) {
        heaps[c].v = malloc((size[c] ? size[c] : 1) * sizeof(item));
        if (!heaps[c].v) goto out;
    }
    for (int64_t i = 0; i < n; i++) finish[i] = NAN;
    double now = 0.0;
    int64_t nxt = 0, active = 0;
    int dirty = 0;
    while (nxt < n || active) {
        double t_done = INFINITY;
        if (active) {
            if (dirty) {
                class_rates(k, ca, cb, counts, L, capacity, cap, rate, open_, remaining, load,
                            bottleneck);
                dirty = 0, q_fresh = 0;
            }
            for (int c = 0; c < k; c++)
                if (counts[c]) {
                    if (rate[c] <= 0) { rc = 1; goto out; }
                    double left = heaps[c].v[0].key - service[c];
                    double t = now + (left > 0 ? left : 0.0) / rate[c];
                    if (t < t_done) t_done = t;
                }
        }
        double t_arrive = nxt < n ? start_s[order[nxt]] : INFINITY;
        double t = t_done <= t_arrive ? t_done : t_arrive;
        for (int c = 0; c < k; c++)
            if (counts[c]) service[c] += rate[c] * (t - now);
        now = t;
        if (t_done <= t_arrive) {
            double tick = 4 * (nextafter(now, INFINITY) - now);
            for (int c = 0; c < k; c++) {
                heap *h = &heaps[c];
                while (h->n) {
                    double key = h->v[0].key;
                    double tol = REL_TIE * (key > 1.0 ? key : 1.0);
                    double step = rate[c] * tick;
                    if (!(key - service[c] <= (tol > step ? tol : step))) break;
                    finish[pop(h).flow] = now;
                    counts[c]--;
                    active--;
                }
            }
            dirty = 1;
        } else {
            while (nxt < n && start_s[order[nxt]] <= now) {
                int64_t i = order[nxt];
                int64_t c = cls[i];
                if (rtt) {
                    if (dirty) {
                        class_rates(k, ca, cb, counts, L, capacity, cap, rate, open_,
                                    remaining, load, bottleneck);
                        dirty = 0, q_fresh = 0;
                    }
                    if (buffer > 0) {
                        burst_sums(k, ca, cb, counts, heaps, service, rate, rtt, start_s, now,
                                   window, capacity, cap, first, L, qload, qexcess, qyoung);
                    } else if (young) { /* first round trips: young flows age with time */
                        for (int j = 0; j < k; j++)
                            young[j] = counts[j] ? young_flows(j, now, start_s, crtt, yoff, ylist,
                                                               arrived, oldest, finish)
                                                 : 0;
                        queue_sums(k, ca, cb, counts, young, rate, crtt, window, L, qload, qexcess);
                    } else if (!q_fresh) {
                        queue_sums(k, ca, cb, counts, NULL, rate, crtt, window, L, qload, qexcess);
                        q_fresh = 1;
                    }
                    double w = 0.0;
                    for (int l = ca[c]; l < cb[c]; l++) {
                        if (qload[l] < capacity[l] * (1.0 - QUEUE_FULL)) continue;
                        double q = qexcess[l] < qcap[l] ? qexcess[l] : qcap[l];
                        if (buffer > 0) {
                            if (qcap[l] <= 0) continue;
                            q += qyoung[l];
                            if (q > buffer) q = buffer;
                        }
                        w += q * 8.0 / capacity[l];
                    }
                    wait[i] = w;
                }
                push(&heaps[c], (item){service[c] + bits[i], i});
                if (arrived) arrived[c]++;
                counts[c]++;
                active++;
                nxt++;
                dirty = 1;
            }
        }
    }
    if (rtt)
        for (int64_t i = 0; i < n; i++) finish[i] = finish[i] + wait[i];
    rc = 0;
out:
    free(crtt), free(qload), free(qexcess), free(qyoung), free(wait);
    free(young), free(yoff), free(ylist), free(arrived), free(oldest);
    if (heaps)
        for (int c = 0; c < k; c++) free(heaps[c].v);
    free(counts); free(size); free(service); free(rate); free(heaps); free(open_);
    free(remaining); free(load); free(bottleneck);
    return rc;
}

/* A parking lot's background stretches (m4ray.m3.paths.RoutedFlows.scenario, compiled): the
 * (flow, hop) entries of the path's n_links links (link j's entries are flow[lo_j:hi_j] and
 * hop[lo_j:hi_j], ascending by flow, ranges = lo_0, hi_0, lo_1, ...), merged in (flow, hop)
 * order, those of flows on the foreground's route (path_of[flow] == fg_route) left out; a
 * stretch goes on while a flow's next hop is the path's next link. Writes each stretch's flow
 * and its links [a, b) on the path; returns how many. */
int64_t m4ray_lot_stretches(int n_links, const int64_t *ranges, const int64_t *flow,
                            const int64_t *hop, const int64_t *path_of, int64_t fg_route,
                            int64_t *origin, int64_t *a, int64_t *b) {
    int64_t at[16], end[16];
    for (int j = 0; j < n_links; j++) {
        at[j] = ranges[2 * j];
        end[j] = ranges[2 * j + 1];
    }
    int64_t n = 0, prev_flow = -1, prev_hop = -2, prev_pos = -2;
    for (;;) {
        int best = -1;
        for (int j = 0; j < n_links; j++) {
            if (at[j] >= end[j]) continue;
            if (best < 0) {
                best = j;
                continue;
            }
            int64_t f = flow[at[j]], g = flow[at[best]];
            if (f < g || (f == g && hop[at[j]] < hop[at[best]])) best = j;
        }
        if (best < 0) break;
        int64_t i = at[best]++, f = flow[i], h = hop[i];
        if (path_of[f] == fg_route) continue;
        if (n > 0 && f == prev_flow && h == prev_hop + 1 && best == prev_pos + 1) {
            b[n - 1] = best + 1;
        } else {
            origin[n] = f;
            a[n] = best;
            b[n] = best + 1;
            n++;
        }
        prev_flow = f;
        prev_hop = h;
        prev_pos = best;
    }
    return n;
}

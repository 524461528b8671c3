/* flowSim's event loop and the DAG replay's flow-level bookkeeping, compiled: the twin of
 * m4ray.sim.flowsim.FlowSim.run (the event queue and the fluid steps) and of the flow half of
 * m4ray.sim.replay.Replay (a collective's transfers: send latency, ``after`` order, parents,
 * each flow's path, ideal FCT and ACK trip, its row in the flow table). The Python versions stay
 * the reference and the fallback; this file does the same arithmetic in the same order and keeps
 * the same event order (time, then insertion rank, one counter for Python's events and its own),
 * so answers are equal to the bit (tests/sim/test_dagloop.py holds them to it).
 *
 * In m4 mode (m4ray_loop_m4, below) the m4 backend's events and its engine take the fluid's
 * place.
 *
 * What stays in Python: workload nodes (compute, sends, joining collectives), decomposing a
 * collective into transfers, and every callback Python scheduled. m4ray_loop_run returns to
 * Python whenever one of those is due (RET_* below) and picks up where it stopped when called
 * again. Built and loaded by m4ray.native (with ../models/_maxmin.c, whose fluid state it drives);
 * called through ctypes from m4ray.sim.dagloop. Units: seconds, bits, bits/s, bytes. */
#include <string.h>

#include "../models/_maxmin.c"

enum { EV_PY = 0, EV_READY = 1, EV_DELIVER = 2, EV_ACKED = 3, EV_PYDONE = 4 };
enum { EV_M4_UPDATE = 5, EV_M4_DONE = 6 }; /* m4's (m4 mode, below) */
/* m4ray_loop_run's answers: nothing left (or the horizon), a Python event (id in *a), a flow
 * Python sent through FlowSim.send delivered (its tag in *a), a flow Python started through the
 * loop done (its tag in *a), a rank's part of a collective done (run in *a, rank in *b). */
enum { RET_DONE = 0, RET_PY = 1, RET_PYDONE = 2, RET_FLOW = 3, RET_FINISH = 4 };
/* m4 mode: an update Python runs (beyond the engine's compiled_limits: the stepper's path), then
 * m4ray_loop_m4_schedule */
enum { RET_M4_UPDATE = 5 };
/* errors: out of memory, active flows with zero rate, no route, a size m4 has no feature of,
 * the m4 engine refusing a flow's links */
enum { ERR_MEMORY = -2, ERR_RATE = -3, ERR_ROUTE = -4, ERR_FEATURE = -5, ERR_LINKS = -6 };

typedef struct {
    double t;
    int64_t seq, a, b;
    int kind;
} event;

typedef struct { /* one collective's transfers (Replay._CollectiveRun) */
    int64_t n, left;
    int64_t *src, *dst, *size, *after, *node, *dep0; /* dep0: first dependency or -1 */
    int64_t *waiting, *child_off, *child, *flow_of, *blk_head, *blk_tail, *blk_next;
    int64_t *rank_left; /* per rank of the workload */
} crun;

typedef struct {
    fluidsim *fluid;
    event *ev;
    int64_t n_ev, cap_ev, seq;
    double now, rate_cap;
    int64_t n_events; /* arrivals and completions (FlowSim.n_events) */
    int draining;     /* inside the loop that runs every event due now */
    int64_t p_run, p_index, p_stage; /* a transfer's completion paused for Python */
    /* topology and routing (Routing.path) */
    int64_t n_nodes, *out_off, *out_link, *link_dst;
    double *lat, *bw;
    uint64_t seed;
    char **ok; /* per destination host: next-hop flags over out_link, NULL until given */
    int64_t mtu, header, ack_bytes; /* ack_bytes < 0: flows done at delivery */
    double send_latency;
    int64_t n_ranks, *host_of;
    int64_t *pair_count; /* per (src, dst) rank pair: its flows so far (pair keys), or NULL */
    /* the flow table (Replay.flows): row = flow id */
    int64_t n_flows, cap_flows;
    int64_t *f_node, *f_src, *f_dst, *f_size, *f_parent, *f_run, *f_index;
    double *f_start, *f_finish, *f_ideal, *f_done, *f_ack;
    crun *runs;
    int64_t n_runs, cap_runs;
    int64_t *links, *stack, cap_stack;
    struct m4mode *m4; /* m4's engine instead of the fluid (m4ray_loop_m4), or NULL */
} loop;

static void m4_free(struct m4mode *m);
static int64_t m4_arrive(loop *L, int64_t id, int64_t n, int64_t wire, double ideal, int64_t size);

/* ------------------------------------------------------------------ events */
static int ev_less(const event *x, const event *y) {
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

/* An event at insertion rank seq (ev_push: the next one; m4's completions: one reserved). */
static int ev_insert(loop *L, double t, int64_t seq, int kind, int64_t a, int64_t b) {
    if (L->n_ev == L->cap_ev) {
        int64_t c = L->cap_ev ? 2 * L->cap_ev : 256;
        event *q = realloc(L->ev, c * sizeof(event));
        if (!q) return ERR_MEMORY;
        L->ev = q, L->cap_ev = c;
    }
    event e = {t, seq, a, b, kind};
    int64_t i = L->n_ev++;
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!ev_less(&e, &L->ev[up])) break;
        L->ev[i] = L->ev[up];
        i = up;
    }
    L->ev[i] = e;
    return 0;
}

static int ev_push(loop *L, double t, int kind, int64_t a, int64_t b) {
    return ev_insert(L, t, L->seq++, kind, a, b);
}

static event ev_pop(loop *L) {
    event top = L->ev[0], last = L->ev[--L->n_ev];
    int64_t i = 0, n = L->n_ev;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ev_less(&L->ev[c + 1], &L->ev[c])) ++c;
        if (!ev_less(&L->ev[c], &last)) break;
        L->ev[i] = L->ev[c];
        i = c;
    }
    if (n) L->ev[i] = last;
    return top;
}

static double ev_peek(const loop *L) { return L->n_ev ? L->ev[0].t : INFINITY; }

/* ------------------------------------------------------------------ life */
static void run_free(crun *r) { /* the per-transfer columns are one block from r->src */
    free(r->src);
    free(r->child_off);
    free(r->child);
    free(r->rank_left);
    r->src = NULL, r->waiting = NULL, r->child_off = NULL, r->child = NULL, r->rank_left = NULL;
}

void m4ray_loop_free(loop *L) {
    if (!L) return;
    m4ray_fluidsim_free(L->fluid);
    free(L->ev);
    free(L->out_off), free(L->out_link), free(L->link_dst), free(L->lat), free(L->bw);
    if (L->ok)
        for (int64_t v = 0; v < L->n_nodes; ++v) free(L->ok[v]);
    free(L->ok);
    free(L->host_of);
    free(L->pair_count);
    free(L->f_node), free(L->f_src), free(L->f_dst), free(L->f_size), free(L->f_parent);
    free(L->f_run), free(L->f_index), free(L->f_start), free(L->f_finish), free(L->f_ideal);
    free(L->f_done), free(L->f_ack);
    for (int64_t r = 0; r < L->n_runs; ++r) run_free(&L->runs[r]);
    free(L->runs);
    free(L->links), free(L->stack);
    m4_free(L->m4);
    free(L);
}

/* A loop over a fresh fluid state (m4ray_fluidsim_new's arguments), with no flows. */
loop *m4ray_loop_new(int64_t n_links, const double *capacity, double ack_fraction,
                     int64_t ack_passes, int capped) {
    loop *L = calloc(1, sizeof(loop));
    if (!L) return NULL;
    L->fluid = m4ray_fluidsim_new(n_links, capacity, ack_fraction, ack_passes, capped);
    L->ack_bytes = -1, L->rate_cap = INFINITY;
    if (!L->fluid) {
        free(L);
        return NULL;
    }
    return L;
}

fluidsim *m4ray_loop_fluid(loop *L) { return L->fluid; }
int64_t m4ray_loop_n_events(const loop *L) { return L->n_events; }
int64_t m4ray_loop_n_flows(const loop *L) { return L->n_flows; }
int64_t m4ray_loop_pending(const loop *L) { return L->n_ev; }
double m4ray_loop_peek(const loop *L) { return ev_peek(L); }

/* A Python event: runs at t (RET_PY with its id). */
int m4ray_loop_push(loop *L, double t, int64_t id) { return ev_push(L, t, EV_PY, id, 0); }

/* A flow Python sends through FlowSim.send (tag >= 0): its delivery comes back as RET_PYDONE. */
int m4ray_loop_add(loop *L, int64_t tag, int64_t n, const int64_t *links, double delay,
                   double cap, double bits) {
    L->n_events += 1;
    return m4ray_fluidsim_add(L->fluid, -tag - 1, n, links, delay, cap, bits);
}

/* The topology the replay's flows are routed over (Routing's arrays; seed already masked). */
int m4ray_loop_topology(loop *L, int64_t n_nodes, const int64_t *out_off, const int64_t *out_link,
                        int64_t n_links, const int64_t *link_dst, const double *lat,
                        const double *bw, uint64_t seed, int64_t mtu, int64_t header) {
    int64_t n_out = out_off[n_nodes];
    L->n_nodes = n_nodes, L->seed = seed, L->mtu = mtu, L->header = header;
    L->out_off = malloc((n_nodes + 1) * sizeof(int64_t));
    L->out_link = malloc((n_out + 1) * sizeof(int64_t));
    L->link_dst = malloc((n_links + 1) * sizeof(int64_t));
    L->lat = malloc((n_links + 1) * sizeof(double));
    L->bw = malloc((n_links + 1) * sizeof(double));
    L->ok = calloc(n_nodes, sizeof(char *));
    L->links = malloc((n_nodes + 1) * sizeof(int64_t));
    if (!L->out_off || !L->out_link || !L->link_dst || !L->lat || !L->bw || !L->ok || !L->links)
        return ERR_MEMORY;
    memcpy(L->out_off, out_off, (n_nodes + 1) * sizeof(int64_t));
    memcpy(L->out_link, out_link, n_out * sizeof(int64_t));
    memcpy(L->link_dst, link_dst, n_links * sizeof(int64_t));
    memcpy(L->lat, lat, n_links * sizeof(double));
    memcpy(L->bw, bw, n_links * sizeof(double));
    return 0;
}

/* Which out-links (flags over out_link) lead one hop closer to host dst (Routing._path). */
int m4ray_loop_routes(loop *L, int64_t dst, const char *ok) {
    int64_t n_out = L->out_off[L->n_nodes];
    char *own = malloc(n_out + 1);
    if (!own) return ERR_MEMORY;
    memcpy(own, ok, n_out);
    free(L->ok[dst]);
    L->ok[dst] = own;
    return 0;
}


/* The replay's settings: ranks' hosts, SimAI's send latency, the ACK's bytes (< 0: none),
 * flowSim's per-flow rate cap (INFINITY: none) and whether flows are keyed per rank pair. */
int m4ray_loop_replay(loop *L, int64_t n_ranks, const int64_t *host_of, double send_latency,
                      int64_t ack_bytes, double rate_cap, int pair_keys) {
    L->host_of = malloc((n_ranks + 1) * sizeof(int64_t));
    if (!L->host_of) return ERR_MEMORY;
    if (pair_keys) { /* Replay(pair_keys=True): a flow's ECMP key is its number in its pair */
        L->pair_count = calloc(n_ranks * n_ranks + 1, sizeof(int64_t));
        if (!L->pair_count) return ERR_MEMORY;
    }
    memcpy(L->host_of, host_of, n_ranks * sizeof(int64_t));
    L->n_ranks = n_ranks, L->send_latency = send_latency, L->ack_bytes = ack_bytes;
    L->rate_cap = rate_cap;
    return 0;
}

/* ------------------------------------------------------------------ flows */
static uint64_t mix(uint64_t h, uint64_t v) { /* m4ray.sim.routing.mix64, one value */
    h = (h ^ v) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (h >> 31)) * 0x94D049BB133111EBULL;
    return h ^ (h >> 29);
}

/* Routing.path(src, dst, key).links into L->links; their count, or ERR_ROUTE. */
static int64_t route(loop *L, int64_t src, int64_t dst, int64_t key) {
    const char *ok = L->ok[dst];
    if (!ok) return ERR_ROUTE;
    int64_t node = src, n = 0;
    while (node != dst) {
        if (n >= L->n_nodes) return ERR_ROUTE;
        int64_t lo = L->out_off[node], hi = L->out_off[node + 1], count = 0, p;
        for (p = lo; p < hi; ++p) count += ok[p];
        if (!count) return ERR_ROUTE;
        uint64_t pick = 0;
        if (count > 1) {
            uint64_t h = 0x9E3779B97F4A7C15ULL;
            h = mix(h, L->seed), h = mix(h, (uint64_t)src), h = mix(h, (uint64_t)dst);
            h = mix(h, (uint64_t)key), h = mix(h, (uint64_t)node);
            pick = h % (uint64_t)count;
        }
        for (p = lo;; ++p)
            if (ok[p] && pick-- == 0) break;
        int64_t link = L->out_link[p];
        L->links[n++] = link;
        node = L->link_dst[link];
    }
    return n;
}

/* Routing.links_many's walk for flows toward one host dst, compiled: row rows[i] of table
 * (hops wide, already -1) gets the links of the flow from src[rows[i]] keyed keys[rows[i]],
 * choosing among the out-links ok flags (over out_link, CSR by out_off) as route() does.
 * Returns 0, or ERR_ROUTE when a walk finds no way on or more than hops links. */
int m4ray_route_many(const int64_t *out_off, const int64_t *out_link, const int64_t *link_dst,
                     const char *ok, uint64_t seed, int64_t dst, int64_t n, const int64_t *rows,
                     const int64_t *src, const int64_t *keys, int64_t hops, int64_t *table) {
    for (int64_t i = 0; i < n; ++i) {
        int64_t r = rows[i], node = src[r], k = 0;
        while (node != dst) {
            if (k >= hops) return ERR_ROUTE;
            int64_t lo = out_off[node], hi = out_off[node + 1], count = 0, p;
            for (p = lo; p < hi; ++p) count += ok[p];
            if (!count) return ERR_ROUTE;
            uint64_t pick = 0;
            if (count > 1) {
                uint64_t h = 0x9E3779B97F4A7C15ULL;
                h = mix(h, seed), h = mix(h, (uint64_t)src[r]), h = mix(h, (uint64_t)dst);
                h = mix(h, (uint64_t)keys[r]), h = mix(h, (uint64_t)node);
                pick = h % (uint64_t)count;
            }
            for (p = lo;; ++p)
                if (ok[p] && pick-- == 0) break;
            table[r * hops + k++] = out_link[p];
            node = link_dst[out_link[p]];
        }
    }
    return 0;
}

typedef struct {
    double latency, inverse, bottleneck;
} pathinfo;

static pathinfo describe(const loop *L, int64_t n) { /* Routing._describe */
    pathinfo p = {0.0, 0.0, L->bw[L->links[0]]};
    for (int64_t k = 0; k < n; ++k) p.latency += L->lat[L->links[k]];
    for (int64_t k = 0; k < n; ++k) {
        double b = L->bw[L->links[k]];
        p.inverse += 1.0 / b;
        if (b < p.bottleneck) p.bottleneck = b;
    }
    return p;
}

static int64_t wire_bytes(const loop *L, int64_t size) {
    return size + (size + L->mtu - 1) / L->mtu * L->header;
}

static double delivery_delay(const loop *L, int64_t size, pathinfo p) {
    int64_t first = wire_bytes(L, size < L->mtu ? size : L->mtu);
    return p.latency + (double)(first * 8) * (p.inverse - 1.0 / p.bottleneck);
}

static int grow_flows(loop *L) {
    if (L->n_flows < L->cap_flows) return 0;
    int64_t c = L->cap_flows ? 2 * L->cap_flows : 1024;
#define GROWF(p, T)                                   \
    do {                                              \
        void *q = realloc(L->p, c * sizeof(T));       \
        if (!q) return ERR_MEMORY;                    \
        L->p = q;                                     \
    } while (0)
    GROWF(f_node, int64_t);
    GROWF(f_src, int64_t);
    GROWF(f_dst, int64_t);
    GROWF(f_size, int64_t);
    GROWF(f_parent, int64_t);
    GROWF(f_run, int64_t);
    GROWF(f_index, int64_t);
    GROWF(f_start, double);
    GROWF(f_finish, double);
    GROWF(f_ideal, double);
    GROWF(f_done, double);
    GROWF(f_ack, double);
#undef GROWF
    L->cap_flows = c;
    return 0;
}

/* Replay._start_flow then FlowSim.send: a flow of ranks src -> dst starts now; done at its last
 * ACK with ack (the algorithm's ack_bytes), else at delivery. run >= 0: transfer index of that
 * run; run < 0: Python's flow, index its tag. Returns the flow id or an error. */
int64_t m4ray_loop_start_flow(loop *L, int64_t src, int64_t dst, int64_t size, int64_t node,
                              int64_t parent, int ack, int64_t run, int64_t index) {
    if (grow_flows(L)) return ERR_MEMORY;
    int64_t id = L->n_flows, hs = L->host_of[src], hd = L->host_of[dst], key = id;
    if (L->pair_count) /* as Replay._start_flow's set_key */
        key = (int64_t)(((uint64_t)L->pair_count[src * L->n_ranks + dst]++ << 40) |
                        ((uint64_t)src << 20) | (uint64_t)dst);
    int64_t n = route(L, hs, hd, key);
    if (n < 0) return n;
    pathinfo p = describe(L, n);
    int64_t wire = wire_bytes(L, size);
    double delay = delivery_delay(L, size, p);
    double ideal = delay + (double)(wire * 8) / p.bottleneck;
    double ack_s = 0.0;
    if (ack && L->ack_bytes >= 0) {
        int64_t nb = route(L, hd, hs, key);
        if (nb < 0) return nb;
        pathinfo back = describe(L, nb);
        ack_s = back.latency + (double)(L->ack_bytes * 8) * back.inverse;
        n = route(L, hs, hd, key); /* the data path again, into L->links */
    }
    L->n_flows += 1;
    L->f_node[id] = node, L->f_src[id] = hs, L->f_dst[id] = hd, L->f_size[id] = size;
    L->f_parent[id] = parent, L->f_run[id] = run, L->f_index[id] = index;
    L->f_start[id] = L->now, L->f_finish[id] = NAN, L->f_done[id] = NAN;
    L->f_ideal[id] = ideal, L->f_ack[id] = ack_s;
    L->n_events += 1;
    if (L->m4) {
        int64_t rc = m4_arrive(L, id, n, wire, ideal, size);
        return rc < 0 ? rc : id;
    }
    if (m4ray_fluidsim_add(L->fluid, id, n, L->links, delay, L->rate_cap, (double)wire * 8.0))
        return ERR_MEMORY;
    return id;
}

/* Columns of the flow table: ints (n x 6: node, src, dst, size, parent, flow id) and doubles
 * (n x 4: start, finish, ideal FCT, done). */
void m4ray_loop_flow_table(const loop *L, int64_t *ints, double *dbl) {
    for (int64_t i = 0; i < L->n_flows; ++i) {
        int64_t *o = ints + 6 * i;
        o[0] = L->f_node[i], o[1] = L->f_src[i], o[2] = L->f_dst[i], o[3] = L->f_size[i];
        o[4] = L->f_parent[i], o[5] = i;
        double *d = dbl + 4 * i;
        d[0] = L->f_start[i], d[1] = L->f_finish[i], d[2] = L->f_ideal[i], d[3] = L->f_done[i];
    }
}

/* ------------------------------------------------------------------ collectives */
/* Replay._launch's second half: a collective's n transfers (ranks, bytes, after or -1, the
 * sender's node id, dependencies as CSR) start waiting; those with none are sent after the send
 * latency, in index order. Returns the run's id, or an error. */
int64_t m4ray_loop_launch(loop *L, int64_t n, const int64_t *src, const int64_t *dst,
                          const int64_t *size, const int64_t *after, const int64_t *node,
                          const int64_t *dep_off, const int64_t *dep) {
    if (L->n_runs == L->cap_runs) {
        int64_t c = L->cap_runs ? 2 * L->cap_runs : 16;
        crun *q = realloc(L->runs, c * sizeof(crun));
        if (!q) return ERR_MEMORY;
        L->runs = q, L->cap_runs = c;
    }
    crun *r = &L->runs[L->n_runs];
    memset(r, 0, sizeof(crun));
    int64_t m = n + 1, n_dep = dep_off[n];
    /* one block for the per-transfer columns */
    r->src = malloc(12 * m * sizeof(int64_t)); /* the twelve columns below */
    r->child_off = calloc(n + 2, sizeof(int64_t));
    r->child = malloc((n_dep + 1) * sizeof(int64_t));
    r->rank_left = calloc(L->n_ranks + 1, sizeof(int64_t));
    if (!r->src || !r->child_off || !r->child || !r->rank_left) {
        run_free(r);
        return ERR_MEMORY;
    }
    r->dst = r->src + m, r->size = r->src + 2 * m, r->after = r->src + 3 * m;
    r->node = r->src + 4 * m, r->dep0 = r->src + 5 * m, r->waiting = NULL;
    int64_t *waiting = r->src + 6 * m;
    r->flow_of = r->src + 7 * m, r->blk_head = r->src + 8 * m, r->blk_tail = r->src + 9 * m;
    r->blk_next = r->src + 10 * m;
    int64_t *fill = r->src + 11 * m;
    r->n = r->left = n;
    for (int64_t i = 0; i < n; ++i) {
        r->src[i] = src[i], r->dst[i] = dst[i], r->size[i] = size[i], r->after[i] = after[i];
        r->node[i] = node[i];
        r->dep0[i] = dep_off[i + 1] > dep_off[i] ? dep[dep_off[i]] : -1;
        waiting[i] = dep_off[i + 1] - dep_off[i];
        r->flow_of[i] = -1, r->blk_head[i] = -1, r->blk_tail[i] = -1, r->blk_next[i] = -1;
        for (int64_t e = dep_off[i]; e < dep_off[i + 1]; ++e) r->child_off[dep[e] + 1] += 1;
        r->rank_left[src[i]] += 1;
        r->rank_left[dst[i]] += 1;
    }
    for (int64_t i = 0; i < n; ++i) r->child_off[i + 1] += r->child_off[i];
    for (int64_t i = 0; i < n; ++i) fill[i] = r->child_off[i];
    for (int64_t i = 0; i < n; ++i) /* children in transfer order, as Replay's lists */
        for (int64_t e = dep_off[i]; e < dep_off[i + 1]; ++e) r->child[fill[dep[e]]++] = i;
    r->waiting = waiting;
    int64_t id = L->n_runs++;
    for (int64_t i = 0; i < n; ++i)
        if (waiting[i] == 0 && ev_push(L, L->now + L->send_latency, EV_READY, id, i))
            return ERR_MEMORY;
    return id;
}

/* Replay._transfer_ready, with the transfers it unblocks (depth first, in their order). */
static int transfer_ready(loop *L, int64_t run, int64_t index) {
    crun *r = &L->runs[run];
    int64_t top = 0;
    if (L->cap_stack < r->n + 1) {
        int64_t *q = realloc(L->stack, (r->n + 1) * sizeof(int64_t));
        if (!q) return ERR_MEMORY;
        L->stack = q, L->cap_stack = r->n + 1;
    }
    L->stack[top++] = index;
    while (top) {
        int64_t i = L->stack[--top], after = r->after[i];
        if (after >= 0 && r->flow_of[after] < 0) {
            if (r->blk_tail[after] < 0)
                r->blk_head[after] = i;
            else
                r->blk_next[r->blk_tail[after]] = i;
            r->blk_tail[after] = i;
            continue;
        }
        int64_t parent = r->dep0[i] >= 0 ? r->flow_of[r->dep0[i]] : -1;
        int64_t f = m4ray_loop_start_flow(L, r->src[i], r->dst[i], r->size[i], r->node[i],
                                          parent, L->ack_bytes >= 0, run, i);
        if (f < 0) return (int)f;
        r->flow_of[i] = f;
        /* the ones blocked on i, first on top */
        int64_t k = top;
        for (int64_t w = r->blk_head[i]; w >= 0; w = r->blk_next[w]) L->stack[top++] = w;
        for (int64_t lo = k, hi = top - 1; lo < hi; ++lo, --hi) {
            int64_t s = L->stack[lo];
            L->stack[lo] = L->stack[hi], L->stack[hi] = s;
        }
        r->blk_head[i] = r->blk_tail[i] = -1;
    }
    return 0;
}

/* Replay._transfer_done from stage L->p_stage: 1 the sender's rank, 2 the receiver's (each may
 * finish its part: RET_FINISH, resumed by the next call), 3 the children. */
static int transfer_done(loop *L, int64_t *a, int64_t *b) {
    crun *r = &L->runs[L->p_run];
    int64_t i = L->p_index;
    while (L->p_stage) {
        if (L->p_stage == 1 || L->p_stage == 2) {
            int64_t rank = L->p_stage == 1 ? r->src[i] : r->dst[i];
            L->p_stage += 1;
            if (--r->rank_left[rank] == 0) {
                *a = L->p_run, *b = rank;
                return RET_FINISH;
            }
            continue;
        }
        L->p_stage = 0;
        for (int64_t e = r->child_off[i]; e < r->child_off[i + 1]; ++e) {
            int64_t c = r->child[e];
            if (--r->waiting[c] == 0 &&
                ev_push(L, L->now + L->send_latency, EV_READY, L->p_run, c))
                return ERR_MEMORY;
        }
        if (--r->left == 0) run_free(r);
    }
    return -1; /* nothing for Python */
}

/* A flow's last ACK (or its delivery, without ACKs) at t. */
static int acked(loop *L, int64_t f, double t, int64_t *a, int64_t *b) {
    L->f_done[f] = t;
    if (L->f_run[f] < 0) {
        *a = L->f_index[f];
        return RET_FLOW;
    }
    L->p_run = L->f_run[f], L->p_index = L->f_index[f], L->p_stage = 1;
    return transfer_done(L, a, b);
}

/* ------------------------------------------------------------------ m4 mode */
/* m4's backend (m4ray.sim.m4.backend.M4Backend with window_us 0) on this loop in place of the
 * fluid: a flow arriving joins the m4 engine (_core.c, called by address), an update runs once
 * per instant something changed (an event queued when the first change comes), and its
 * predicted completions wait in time order as one batch with only its next current one in
 * the queue (M4Backend._apply / _next_in: the ranks reserved at the update, so the order is
 * that of one event per flow; a later update supersedes a row's earlier prediction by its
 * version). Python runs the updates too large for the compiled pass's one-graph path. */
typedef int64_t (*m4_arrive_fn)(void *, const int64_t *, int64_t, double, double, double, double);
typedef int (*m4_complete_fn)(void *, int64_t, double);
typedef void (*m4_pending_fn)(void *, int64_t *);
typedef int64_t (*m4_update_fn)(void *, double, const int64_t *, int64_t *, double *, int64_t *);

typedef struct {
    int64_t n, i; /* its flows; the next one to run */
    double *t;
    int64_t *row, *version, *rank, *flow; /* one block from t */
} m4batch;

struct m4mode {
    void *engine;
    m4_arrive_fn arrive;
    m4_complete_fn complete;
    m4_pending_fn pending;
    m4_update_fn update;
    int64_t *stats;              /* the engine's counters (Python-owned, m4ray_engine_update's) */
    int64_t dedup_min, max_rows; /* updates of >= dedup_min flows or > max_rows rows: Python */
    int armed;                   /* an update is queued */
    int64_t *version, *flow_of, n_rows; /* per engine row: its prediction's version, its flow */
    m4batch *batches;
    int64_t n_batches, cap_batches, *spare, n_spare; /* batches done, to reuse */
    int64_t sizes[4];
    int64_t *rows, cap_out;
    double *finish;
    int64_t *key;  /* sizes with a feature (open addressing; 0: empty) */
    double *value; /* their features */
    int64_t cap_key, n_key;
    struct m4order *order;
    int64_t cap_order;
};

struct m4order {
    double t;
    int64_t i;
};

static void m4_free(struct m4mode *m) {
    if (!m) return;
    for (int64_t b = 0; b < m->n_batches; b++) free(m->batches[b].t);
    free(m->batches), free(m->spare), free(m->version), free(m->flow_of);
    free(m->rows), free(m->finish), free(m->key), free(m->value), free(m->order);
    free(m);
}

/* m4 mode on: the engine and its functions (m4ray_engine_arrive, _complete, _pending, _update)
 * by address, its counters, and which updates go to Python. Before any flow. */
int m4ray_loop_m4(loop *L, void *engine, void *arrive, void *complete, void *pending,
                  void *update, int64_t *stats, int64_t dedup_min, int64_t max_rows) {
    struct m4mode *m = calloc(1, sizeof *m);
    if (!m) return ERR_MEMORY;
    m->engine = engine, m->arrive = (m4_arrive_fn)arrive, m->complete = (m4_complete_fn)complete;
    m->pending = (m4_pending_fn)pending, m->update = (m4_update_fn)update, m->stats = stats;
    m->dedup_min = dedup_min, m->max_rows = max_rows;
    m4_free(L->m4);
    L->m4 = m;
    return 0;
}

static int64_t *m4_key_slot(const struct m4mode *m, int64_t size) {
    uint64_t h = (uint64_t)size * 0x9E3779B97F4A7C15ULL;
    for (int64_t i = (int64_t)(h >> 20) & (m->cap_key - 1);; i = (i + 1) & (m->cap_key - 1))
        if (m->key[i] == size || m->key[i] == 0) return &m->key[i];
}

/* The size feature m4 gives a flow of size bytes (m4ray.sim.m4.engine.size_feature: float32
 * arithmetic Python does, once per size). */
int m4ray_loop_m4_feature(loop *L, int64_t size, double feature) {
    struct m4mode *m = L->m4;
    if (size <= 0) return ERR_FEATURE;
    if (2 * (m->n_key + 1) > m->cap_key) {
        int64_t cap = m->cap_key ? 2 * m->cap_key : 64, *old = m->key, old_cap = m->cap_key;
        double *old_v = m->value;
        m->key = calloc(cap, sizeof *m->key), m->value = malloc(cap * sizeof *m->value);
        if (!m->key || !m->value) return ERR_MEMORY;
        m->cap_key = cap;
        for (int64_t i = 0; i < old_cap; i++)
            if (old[i]) {
                int64_t *slot = m4_key_slot(m, old[i]);
                *slot = old[i], m->value[slot - m->key] = old_v[i];
            }
        free(old), free(old_v);
    }
    int64_t *slot = m4_key_slot(m, size);
    if (!*slot) m->n_key++;
    *slot = size, m->value[slot - m->key] = feature;
    return 0;
}

static int m4_changed(loop *L) { /* M4Backend._changed: one update per instant */
    if (L->m4->armed) return 0;
    L->m4->armed = 1;
    return ev_push(L, L->now, EV_M4_UPDATE, 0, 0);
}

/* M4Backend.send: flow id (its path in L->links) joins the engine; its row or an error. */
static int64_t m4_arrive(loop *L, int64_t id, int64_t n, int64_t wire, double ideal, int64_t size) {
    struct m4mode *m = L->m4;
    if (!m->cap_key) return ERR_FEATURE;
    int64_t *slot = m4_key_slot(m, size);
    if (*slot != size) return ERR_FEATURE;
    int64_t row = m->arrive(m->engine, L->links, n, (double)wire, ideal, L->now,
                            m->value[slot - m->key]);
    if (row < 0) return row == -2 ? ERR_MEMORY : ERR_LINKS;
    if (row >= m->n_rows) {
        int64_t c = 2 * row + 64;
        int64_t *v = realloc(m->version, c * sizeof *v), *f = v ? realloc(m->flow_of, c * sizeof *f) : NULL;
        if (v) m->version = v;
        if (!f) return ERR_MEMORY;
        m->flow_of = f;
        memset(v + m->n_rows, 0, (c - m->n_rows) * sizeof *v);
        m->n_rows = c;
    }
    m->flow_of[row] = id;
    return m4_changed(L) ? ERR_MEMORY : row;
}

static int m4_order_less(const void *x, const void *y) {
    const struct m4order *a = x, *b = y;
    return a->t < b->t ? -1 : a->t > b->t ? 1 : (a->i > b->i) - (a->i < b->i);
}

/* M4Backend._next_in: queue batch b's next current completion, or retire the batch. */
static int m4_next_in(loop *L, int64_t b) {
    struct m4mode *m = L->m4;
    m4batch *B = &m->batches[b];
    while (B->i < B->n && m->version[B->row[B->i]] != B->version[B->i]) B->i++;
    if (B->i == B->n) {
        m->spare[m->n_spare++] = b;
        return 0;
    }
    return ev_insert(L, B->t[B->i], B->rank[B->i], EV_M4_DONE, b, 0); /* its reserved rank */
}

/* M4Backend._apply: an update's predictions (engine rows, completion times) as one batch. */
int m4ray_loop_m4_schedule(loop *L, int64_t n, const int64_t *rows, const double *finish) {
    struct m4mode *m = L->m4;
    if (!n) return 0;
    if (n > m->cap_order) {
        struct m4order *o = realloc(m->order, n * sizeof *o);
        if (!o) return ERR_MEMORY;
        m->order = o, m->cap_order = n;
    }
    int64_t b;
    if (m->n_spare) {
        b = m->spare[--m->n_spare];
        free(m->batches[b].t);
    } else {
        if (m->n_batches == m->cap_batches) {
            int64_t c = m->cap_batches ? 2 * m->cap_batches : 64;
            m4batch *q = realloc(m->batches, c * sizeof *q);
            int64_t *sp = q ? realloc(m->spare, c * sizeof *sp) : NULL;
            if (q) m->batches = q;
            if (!sp) return ERR_MEMORY;
            m->spare = sp, m->cap_batches = c;
        }
        b = m->n_batches++;
    }
    m4batch *B = &m->batches[b];
    B->t = malloc(5 * n * sizeof(double));
    if (!B->t) {
        B->n = B->i = 0;
        m->spare[m->n_spare++] = b;
        return ERR_MEMORY;
    }
    B->row = (int64_t *)(B->t + n), B->version = B->row + n, B->rank = B->version + n;
    B->flow = B->rank + n, B->n = n, B->i = 0;
    int64_t first = L->seq;
    L->seq += n;
    for (int64_t i = 0; i < n; i++) {
        m->order[i].t = finish[i] > L->now ? finish[i] : L->now; /* np.maximum(times, now) */
        if (finish[i] != finish[i]) m->order[i].t = finish[i]; /* (a NaN stays one) */
        m->order[i].i = i;
        m->version[rows[i]] += 1;
    }
    qsort(m->order, n, sizeof *m->order, m4_order_less); /* by time, ties by rank */
    for (int64_t j = 0; j < n; j++) {
        int64_t i = m->order[j].i, r = rows[i];
        B->t[j] = m->order[j].t, B->row[j] = r, B->version[j] = m->version[r];
        B->rank[j] = first + i, B->flow[j] = m->flow_of[r];
    }
    return m4_next_in(L, b);
}

/* The update queued at an instant: compiled where the engine's one-call path takes it, else
 * back to Python. */
static int m4_update(loop *L) {
    struct m4mode *m = L->m4;
    m->armed = 0;
    m->pending(m->engine, m->sizes);
    int64_t k = m->sizes[0], F = m->sizes[1];
    if (!k) return -1;
    if (F >= m->dedup_min || F + m->sizes[2] > m->max_rows) return RET_M4_UPDATE;
    if (F > m->cap_out) {
        int64_t *r = realloc(m->rows, F * sizeof *r);
        double *f = r ? realloc(m->finish, F * sizeof *f) : NULL;
        if (r) m->rows = r;
        if (!f) return ERR_MEMORY;
        m->finish = f, m->cap_out = F;
    }
    int64_t got = m->update(m->engine, L->now, m->sizes, m->rows, m->finish, m->stats);
    if (got < 0) return ERR_MEMORY;
    int rc = m4ray_loop_m4_schedule(L, got, m->rows, m->finish);
    return rc ? rc : -1;
}

/* M4Backend._fire then _finish: batch b's next flow completes now, if still current. */
static int m4_done(loop *L, int64_t b, int64_t *a, int64_t *bb) {
    struct m4mode *m = L->m4;
    m4batch *B = &m->batches[b];
    int64_t i = B->i++, row = B->row[i], f = B->flow[i];
    int current = m->version[row] == B->version[i];
    int rc = m4_next_in(L, b); /* (its rank is reserved: the order is the same either way) */
    if (rc) return rc;
    if (!current) return -1;
    if (m->complete(m->engine, row, L->now)) return ERR_MEMORY;
    L->n_events += 1;
    if (m4_changed(L)) return ERR_MEMORY;
    L->f_finish[f] = L->now; /* Replay's done(): its ACK trip, or acked now */
    if (L->f_ack[f] != 0.0)
        return ev_push(L, L->now + L->f_ack[f], EV_ACKED, f, 0) ? ERR_MEMORY : -1;
    return acked(L, f, L->now, a, bb);
}

/* One event due now; -1 when Python has nothing to do. */
static int handle(loop *L, event e, int64_t *a, int64_t *b) {
    switch (e.kind) {
    case EV_PY:
        *a = e.a;
        return RET_PY;
    case EV_PYDONE:
        *a = e.a;
        return RET_PYDONE;
    case EV_READY: {
        int rc = transfer_ready(L, e.a, e.b);
        return rc ? rc : -1;
    }
    case EV_M4_UPDATE:
        return m4_update(L);
    case EV_M4_DONE:
        return m4_done(L, e.a, a, b);
    case EV_DELIVER:
        L->f_finish[e.a] = e.t;
        if (L->f_ack[e.a] != 0.0)
            return ev_push(L, L->now + L->f_ack[e.a], EV_ACKED, e.a, 0) ? ERR_MEMORY : -1;
        return acked(L, e.a, e.t, a, b);
    default: /* EV_ACKED */
        return acked(L, e.a, e.t, a, b);
    }
}

/* FlowSim.run until horizon (INFINITY: until nothing is left), returning to Python as the
 * RET_* above say; *t is the time then. Call again to go on. */
int m4ray_loop_run(loop *L, double horizon, double *t, int64_t *a, int64_t *b) {
    int rc;
    *a = *b = 0;
    if (L->p_stage) {
        rc = transfer_done(L, a, b);
        if (rc != -1) goto out;
    }
    for (;;) {
        if (L->draining) {
            if (L->n_ev && L->ev[0].t <= L->now) {
                event e = ev_pop(L);
                rc = handle(L, e, a, b);
                if (rc != -1) goto out;
                continue;
            }
            L->draining = 0;
        }
        double t_event = ev_peek(L), t_done = INFINITY;
        int64_t n_fin = 0;
        rc = L->m4 ? 0 : m4ray_fluidsim_next(L->fluid, L->now, &t_done, &n_fin);
        if (rc) {
            rc = rc == 3 ? ERR_RATE : ERR_MEMORY;
            goto out;
        }
        double t_next = t_event < t_done ? t_event : t_done;
        if (t_next == INFINITY) {
            rc = RET_DONE;
            goto out;
        }
        if (t_next > horizon) {
            if (!L->m4) m4ray_fluidsim_advance(L->fluid, horizon - L->now);
            L->now = horizon;
            rc = RET_DONE;
            goto out;
        }
        if (t_done <= t_event) {
            m4ray_fluidsim_advance(L->fluid, t_done - L->now);
            L->now = t_done;
            fluidsim *s = L->fluid;
            int64_t *tags = malloc((n_fin + 1) * sizeof(int64_t));
            double *delays = malloc((n_fin + 1) * sizeof(double));
            if (!tags || !delays) {
                free(tags), free(delays);
                rc = ERR_MEMORY;
                goto out;
            }
            m4ray_fluidsim_complete(s, tags, delays);
            L->n_events += n_fin;
            rc = 0;
            for (int64_t k = 0; k < n_fin && !rc; ++k) {
                double when = L->now + delays[k];
                rc = tags[k] >= 0 ? ev_push(L, when, EV_DELIVER, tags[k], 0)
                                  : ev_push(L, when, EV_PYDONE, -tags[k] - 1, 0);
            }
            free(tags), free(delays);
            if (rc) goto out;
        } else {
            if (!L->m4) m4ray_fluidsim_advance(L->fluid, t_event - L->now);
            L->now = t_event;
            L->draining = 1;
        }
    }
out:
    *t = L->now;
    return rc;
}

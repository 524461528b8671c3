/* The fluid DCTCP's time steps in C (m4ray/sim/fluidcc.py is the reference: the same state,
 * the same arithmetic in the same order; its docstring says what the model is). Python adds
 * flows as they arrive and calls fcc_run, which steps until the next event is due or flows
 * have sent their last bit; those come back with their delivery times and leave the state
 * (swapped out: the order of the active flows is the state's own, not Python's). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 16 /* the most links on a path */

typedef struct {
    /* the history keeps a row per slot (dt of time, lag + 1 rows); slot: the last written,
     * last_mark: the last that marked anything */
    int64_t n_links, lag, slot, last_mark;
    const double *cap, *kmin, *kmax, *pmax;
    const uint8_t *sw, *marks; /* switch egress ports (they queue), and those that mark */
    double *q, *hist, *arrive, *used, *level, *total;
    double *whist; /* the time each slot's row has averaged so far */
    double *eff, *data; /* each link's capacity left to data by ACKs; its data rate last step */
    double ack_frac;    /* ACK bits per data bit (0: ACKs take no capacity) */
    int64_t *n_free, *count;
    int64_t *lag_row; /* the history row (its offset) d slots back, d = 0..lag */
    double gain, ai, min_rate, win_bits, pkt_bits, alpha_init, dt;
    int window_cuts, var_window; /* var_window: the window scales with rate / line rate */
    int first_window;            /* a flow that has sent less than its window: not held */
    double max_rate;             /* every sender's line rate at most this (INFINITY: none) */
    int hop_lag, tandem;         /* marks back per hop (hlag); hops see what earlier let out */
    /* DCQCN (dcqcn != 0): CNPs drawn (sampled) by seed, else in expectation; its parameters */
    int dcqcn, sampled, clamp;
    uint64_t seed;
    double g_d, alpha_iv, dec_iv, inc_iv, fast, ai_d, hai_d, first_factor;
    double *through; /* tandem: each link's share let through */
    /* HPCC (hpcc != 0): eta, AI, max stage, T; each link's queue and tx rate, one row a step
     * (as the hops stamp them), and what it sent this step */
    int hpcc;
    double eta, hp_ai, max_stage, hp_t;
    double *qh, *txh, *tx;
    double *wait; /* TIMELY: each link's queue over what the ACKs leave of it, as stamped */
    /* TIMELY (timely != 0): T_low, T_high, beta, EWMA weight, min RTT, AI, hyper AI */
    int timely;
    double t_low, t_high, beta, ewma, min_rtt, ti_ai, ti_hai;
    /* active flows */
    int64_t n, room;
    int64_t *id, *links, *len, *hlag;
    double *left, *bits, *rate, *line, *alpha, *tick, *rtt0, *delay, *x, *qd, *tout, *unm;
    double *target, *stage, *t_alpha, *t_dec, *t_inc, *u_alpha, *u_dec, *n_dec, *inflight;
    double *cur, *util, *hu; /* HPCC: reference rate, utilisation, this step's U */
    double *last_rtt, *rtt_diff, *rs; /* TIMELY: last sample, its change's EWMA; this one */
    /* backlog (with tandem): each flow's bits queued per hop (WIDTH a flow) and when the first
     * of them leaves, the hop its last bit waits at (-1: still sending) and when it leaves;
     * per link scratch of the pass */
    int backlog;
    double *held, *head, *lb_t;
    int64_t *lb_hop;
    double *mine, *due, *hsum, *psi, *spare, *phi, *outl;
    double *fr, *fwd; /* per flow and step: drain_frac; per hop what it passes at phi 1 */
} fcc;

/* a draw in [0, 1) for flow id and draw k from seed (fluidcc.py's uniform: SplitMix64's
 * finaliser; unsigned arithmetic wraps as numpy's uint64 does) */
static double uniform(uint64_t seed, int64_t id, double k) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ULL + (uint64_t)id * 0xBF58476D1CE4E5B9ULL;
    z += ((uint64_t)k + 1ULL) * 0x94D049BB133111EBULL;
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static void *grow(void *p, int64_t n, size_t size) { return realloc(p, (size_t)n * size); }

fcc *fcc_new(int64_t n_links, const double *cap, const uint8_t *sw, const uint8_t *marks,
             const double *kmin, const double *kmax, const double *pmax, int64_t lag,
             const double *params, int window_cuts) {
    fcc *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_links = n_links, s->lag = lag, s->last_mark = -(1 << 30);
    s->cap = cap, s->sw = sw, s->marks = marks;
    s->kmin = kmin, s->kmax = kmax, s->pmax = pmax;
    s->gain = params[0], s->ai = params[1], s->min_rate = params[2], s->win_bits = params[3];
    s->pkt_bits = params[4], s->alpha_init = params[5], s->dt = params[6];
    s->var_window = params[7] != 0.0;
    s->ack_frac = params[8];
    s->first_window = params[9] != 0.0;
    s->max_rate = params[10];
    s->dcqcn = params[11] != 0.0, s->sampled = params[12] != 0.0, s->seed = (uint64_t)params[13];
    s->hop_lag = params[14] != 0.0, s->tandem = params[15] != 0.0;
    s->g_d = params[16], s->alpha_iv = params[17], s->dec_iv = params[18];
    s->inc_iv = params[19], s->fast = params[20], s->ai_d = params[21], s->hai_d = params[22];
    s->clamp = params[23] != 0.0, s->first_factor = params[24];
    s->through = calloc(n_links, sizeof(double));
    s->lag_row = calloc(lag + 1, sizeof(int64_t));
    s->hpcc = params[25] != 0.0, s->eta = params[26], s->hp_ai = params[27];
    s->max_stage = params[28], s->hp_t = params[29];
    s->timely = params[30] != 0.0, s->t_low = params[31], s->t_high = params[32];
    s->beta = params[33], s->ewma = params[34], s->min_rtt = params[35];
    s->ti_ai = params[36], s->ti_hai = params[37];
    s->backlog = s->tandem && params[38] != 0.0;
    if (s->backlog) {
        double **scratch[] = {&s->mine, &s->due, &s->hsum, &s->psi, &s->spare, &s->phi, &s->outl};
        for (size_t k = 0; k < sizeof scratch / sizeof *scratch; k++)
            *scratch[k] = calloc(n_links, sizeof(double));
    }
    if (s->hpcc || s->timely) s->qh = calloc((lag + 1) * n_links, sizeof(double));
    if (s->timely) s->wait = calloc(n_links, sizeof(double));
    if (s->hpcc) {
        s->txh = calloc((lag + 1) * n_links, sizeof(double));
        s->tx = calloc(n_links, sizeof(double));
    }
    s->window_cuts = window_cuts;
    s->q = calloc(n_links, sizeof(double));
    s->hist = calloc((lag + 1) * n_links, sizeof(double));
    s->whist = calloc(lag + 1, sizeof(double));
    s->arrive = calloc(n_links, sizeof(double));
    s->used = calloc(n_links, sizeof(double));
    s->level = calloc(n_links, sizeof(double));
    s->total = calloc(n_links, sizeof(double));
    s->n_free = calloc(n_links, sizeof(int64_t));
    s->count = calloc(n_links, sizeof(int64_t));
    s->eff = calloc(n_links, sizeof(double));
    s->data = calloc(n_links, sizeof(double));
    memcpy(s->eff, cap, n_links * sizeof(double));
    return s;
}

void fcc_free(fcc *s) {
    if (!s) return;
    void *all[] = {s->q,     s->hist,  s->whist, s->arrive, s->used, s->level,
                   s->total, s->n_free, s->count, s->id,   s->links, s->len,
                   s->left,  s->rate,  s->line,   s->alpha, s->tick, s->rtt0,
                   s->delay, s->x,     s->qd,     s->tout, s->eff,  s->data, s->bits,
                   s->hlag,  s->unm,   s->target, s->stage, s->t_alpha, s->t_dec, s->t_inc,
                   s->u_alpha, s->u_dec, s->n_dec, s->inflight, s->through,
                   s->qh,    s->txh,   s->tx,     s->cur,   s->util,  s->hu,
                   s->last_rtt, s->rtt_diff, s->rs, s->lag_row,
                   s->held,  s->head,  s->lb_t,  s->lb_hop, s->mine,  s->due,   s->hsum,
                   s->psi,   s->spare,  s->phi,    s->outl,  s->wait,  s->fr,   s->fwd};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    free(s);
}

int64_t fcc_n(const fcc *s) { return s->n; }

/* each link's queue now (bits), copied into out (n_links) */
void fcc_queues(const fcc *s, double *out) {
    memcpy(out, s->q, (size_t)s->n_links * sizeof(double));
}

int fcc_add(fcc *s, int64_t id, int64_t n_path, const int64_t *path, const int64_t *lags,
            double bits, double rtt, double delay, double now) {
    if (n_path < 1 || n_path > WIDTH) return 1;
    if (s->n == s->room) {
        int64_t r = s->room ? 2 * s->room : 64;
        int64_t **ints[] = {&s->id, &s->len, &s->lb_hop};
        double **reals[] = {&s->left,   &s->bits,    &s->rate,  &s->line,  &s->alpha,
                            &s->tick,   &s->rtt0,    &s->delay, &s->x,     &s->qd,
                            &s->tout,   &s->unm,     &s->target, &s->stage, &s->t_alpha,
                            &s->t_dec,  &s->t_inc,   &s->u_alpha, &s->u_dec, &s->n_dec,
                            &s->inflight, &s->cur,   &s->util,  &s->hu,
                            &s->last_rtt, &s->rtt_diff, &s->rs, &s->lb_t};
        for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
            if (!(*ints[k] = grow(*ints[k], r, sizeof(int64_t)))) return 2;
        for (size_t k = 0; k < sizeof reals / sizeof *reals; k++)
            if (!(*reals[k] = grow(*reals[k], r, sizeof(double)))) return 2;
        if (!(s->links = grow(s->links, r * WIDTH, sizeof(int64_t)))) return 2;
        if (!(s->hlag = grow(s->hlag, r * WIDTH, sizeof(int64_t)))) return 2;
        if (!(s->held = grow(s->held, r * WIDTH, sizeof(double)))) return 2;
        if (!(s->head = grow(s->head, r * WIDTH, sizeof(double)))) return 2;
        if (!(s->fr = grow(s->fr, r, sizeof(double)))) return 2;
        if (!(s->fwd = grow(s->fwd, r * WIDTH, sizeof(double)))) return 2;
        s->room = r;
    }
    int64_t i = s->n++;
    s->id[i] = id, s->len[i] = n_path;
    memcpy(s->links + i * WIDTH, path, n_path * sizeof(int64_t));
    double line = s->cap[path[0]] < s->max_rate ? s->cap[path[0]] : s->max_rate;
    s->left[i] = s->bits[i] = bits, s->rate[i] = s->line[i] = line;
    s->alpha[i] = s->alpha_init, s->tick[i] = now + rtt, s->rtt0[i] = rtt, s->delay[i] = delay;
    for (int64_t k = 0; k < n_path; k++) s->hlag[i * WIDTH + k] = lags ? lags[k] : s->lag;
    s->target[i] = line, s->stage[i] = 0.0, s->n_dec[i] = 0.0, s->inflight[i] = 0.0;
    s->t_alpha[i] = s->t_dec[i] = s->t_inc[i] = INFINITY, s->u_alpha[i] = s->u_dec[i] = 1.0;
    s->cur[i] = line, s->util[i] = 1.0, s->hu[i] = 0.0;
    s->last_rtt[i] = NAN, s->rtt_diff[i] = 0.0, s->rs[i] = 0.0;
    s->lb_hop[i] = -1, s->lb_t[i] = INFINITY;
    memset(s->held + i * WIDTH, 0, WIDTH * sizeof(double));
    memset(s->head + i * WIDTH, 0, WIDTH * sizeof(double));
    if (s->hpcc) s->tick[i] = INFINITY; /* its first ACKs set the reference */
    return 0;
}

/* a queue's wait: what link l's queue holds over what the ACKs leave of the link (every
 * delay of the fluid: a round trip's queueing, a last bit's, a first bit's, TIMELY's) */
static double wait_at(const fcc *s, int64_t l) { return s->q[l] / s->eff[l]; }

/* flow i's queueing delay: each queue on its path over what the ACKs leave of its link */
static double queue_delay(const fcc *s, int64_t i) {
    const int64_t *p = s->links + i * WIDTH;
    double d = 0.0;
    for (int64_t k = 0; k < s->len[i]; k++) d += wait_at(s, p[k]);
    return d;
}

/* each host link's flows max-min over its capacity with caps x (fluidcc.py's _nic_share) */
static void nic_share(fcc *s) {
    int64_t n = s->n;
    for (int64_t i = 0; i < n; i++) {
        int64_t h = s->links[i * WIDTH];
        s->total[h] = 0.0, s->count[h] = 0;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t h = s->links[i * WIDTH];
        s->total[h] += s->x[i], s->count[h]++;
    }
    int any = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t h = s->links[i * WIDTH];
        if (s->total[h] > s->eff[h] * (1 + 1e-12)) any = 1;
        s->level[h] = s->eff[h] / (double)s->count[h];
    }
    if (!any) return;
    for (int it = 0; it < 64; it++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t h = s->links[i * WIDTH];
            s->used[h] = 0.0, s->n_free[h] = 0;
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t h = s->links[i * WIDTH];
            if (!(s->total[h] > s->eff[h] * (1 + 1e-12))) continue;
            if (s->x[i] < s->level[h]) s->used[h] += s->x[i];
            else s->n_free[h]++;
        }
        int moved = 0; /* the new levels in used (each group's once: n_free = -1 after) */
        for (int64_t i = 0; i < n; i++) {
            int64_t h = s->links[i * WIDTH];
            if (!(s->total[h] > s->eff[h] * (1 + 1e-12)) || s->n_free[h] < 0) continue;
            double nw = s->n_free[h] > 0 ? (s->eff[h] - s->used[h]) / (double)s->n_free[h]
                                         : s->level[h];
            if (!(fabs(nw - s->level[h]) <= 1e-12 * s->level[h])) moved = 1;
            s->used[h] = nw, s->n_free[h] = -1;
        }
        if (!moved) break; /* as the reference: the levels stay those of the last pass */
        for (int64_t i = 0; i < n; i++) {
            int64_t h = s->links[i * WIDTH];
            if (s->total[h] > s->eff[h] * (1 + 1e-12)) s->level[h] = s->used[h];
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t h = s->links[i * WIDTH];
        if (s->total[h] > s->eff[h] * (1 + 1e-12) && s->x[i] > s->level[h]) s->x[i] = s->level[h];
    }
}

/* keep the flows not marked done (tout < 0), in their order (the reference's sums' order) */
static void compact(fcc *s) {
    int64_t j = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (s->tout[i] < 0) continue;
        if (i != j) {
            s->id[j] = s->id[i], s->len[j] = s->len[i];
            memcpy(s->links + j * WIDTH, s->links + i * WIDTH, WIDTH * sizeof(int64_t));
            memcpy(s->hlag + j * WIDTH, s->hlag + i * WIDTH, WIDTH * sizeof(int64_t));
            memcpy(s->held + j * WIDTH, s->held + i * WIDTH, WIDTH * sizeof(double));
            memcpy(s->head + j * WIDTH, s->head + i * WIDTH, WIDTH * sizeof(double));
            s->lb_hop[j] = s->lb_hop[i], s->lb_t[j] = s->lb_t[i];
            s->target[j] = s->target[i], s->stage[j] = s->stage[i];
            s->t_alpha[j] = s->t_alpha[i], s->t_dec[j] = s->t_dec[i], s->t_inc[j] = s->t_inc[i];
            s->u_alpha[j] = s->u_alpha[i], s->u_dec[j] = s->u_dec[i], s->n_dec[j] = s->n_dec[i];
            s->inflight[j] = s->inflight[i];
            s->cur[j] = s->cur[i], s->util[j] = s->util[i];
            s->last_rtt[j] = s->last_rtt[i], s->rtt_diff[j] = s->rtt_diff[i];
            s->left[j] = s->left[i], s->bits[j] = s->bits[i];
            s->rate[j] = s->rate[i], s->line[j] = s->line[i];
            s->alpha[j] = s->alpha[i], s->tick[j] = s->tick[i], s->rtt0[j] = s->rtt0[i];
            s->delay[j] = s->delay[i];
        }
        j++;
    }
    s->n = j;
}

static double mark_p(const fcc *s, int64_t l) {
    double q = s->q[l], p;
    if (q <= s->kmin[l]) p = 0.0;
    else {
        double span = s->kmax[l] - s->kmin[l];
        span = span > 1e-9 ? span : 1e-9;
        p = s->pmax[l] * (q - s->kmin[l]) / span;
        p = p < 1.0 ? p : 1.0;
    }
    if (q >= s->kmax[l]) p = 1.0;
    if (!s->marks[l]) p = 0.0;
    return p;
}

/* No flow sends for gap seconds, until t_end (fluidcc.py's _idle): the queues drain; after a
 * round trip's worth of time the marks in flight are the drained queues' */
void fcc_idle(fcc *s, double gap, double t_end) {
    const int64_t L = s->n_links, R = s->lag + 1;
    int any = 0;
    if (!(gap > 0)) return;
    if (s->ack_frac) { /* nothing sent: no ACKs */
        memset(s->data, 0, L * sizeof(double));
        memcpy(s->eff, s->cap, L * sizeof(double));
    }
    for (int64_t l = 0; l < L; l++)
        if (s->q[l] != 0.0) any = 1;
    if (!any) return;
    for (int64_t l = 0; l < L; l++)
        if (s->sw[l]) {
            double v = s->q[l] - s->cap[l] * gap;
            s->q[l] = v > 0.0 ? v : 0.0;
        }
    if (gap >= (double)s->lag * s->dt) {
        int marked = 0;
        for (int64_t l = 0; l < L; l++) {
            double p = mark_p(s, l);
            for (int64_t r = 0; r < R; r++) s->hist[r * L + l] = p;
            if (p != 0.0) marked = 1;
        }
        memset(s->whist, 0, R * sizeof(double));
        s->slot = (int64_t)floor(t_end / s->dt);
        s->last_mark = marked ? s->slot : s->slot - s->lag - 1;
    }
}

/* the bits flow i has acknowledged over dt (fluidcc.py's _ack_clock): what is in flight over a
 * round trip, in flight growing by what it sends */
static double ack_clock(fcc *s, int64_t i, double dt) {
    double rtt = s->rtt0[i] + s->qd[i], keep = exp(-dt / rtt), was = s->inflight[i];
    s->inflight[i] = was * keep + s->x[i] * rtt * (1.0 - keep);
    return was + s->x[i] * dt - s->inflight[i];
}

/* HPCC over dt for flow i (fluidcc.py's _hpcc_step; its U read in fcc_run from the hops'
 * telemetry a return trip old) */
static void hpcc_step(fcc *s, int64_t i, double now, double dt) {
    double acked = ack_clock(s, i, dt), rtt = s->rtt0[i] + s->qd[i];
    if (!(acked > 0)) return;
    if (isinf(s->tick[i])) { /* the first window: keep the reference */
        s->tick[i] = now + rtt;
        return;
    }
    double big_u = s->hu[i];
    if (big_u < 0.0) return; /* no switch on its path: no telemetry, the rate holds */
    double keep = exp(-(dt < s->hp_t ? dt : s->hp_t) / s->hp_t);
    double util = big_u + (s->util[i] - big_u) * keep;
    s->util[i] = util;
    double max_c = util / s->eta;
    int mult = max_c >= 1.0 || s->stage[i] >= s->max_stage;
    double rate = (mult ? s->cur[i] / (max_c > 1e-12 ? max_c : 1e-12) : s->cur[i]) + s->hp_ai;
    rate = s->min_rate > rate ? s->min_rate : rate;
    rate = s->line[i] < rate ? s->line[i] : rate;
    s->rate[i] = rate;
    if (now >= s->tick[i]) {
        s->cur[i] = rate;
        s->stage[i] = mult ? 0.0 : s->stage[i] + 1.0;
        s->tick[i] = now + rtt;
    }
}

/* TIMELY once a window for flow i (fluidcc.py's _timely_step; its RTT sample rs read in
 * fcc_run from the hops' queues a return trip old) */
static void timely_step(fcc *s, int64_t i, double now) {
    if (!(now >= s->tick[i])) return;
    double sample = s->rs[i], last = s->last_rtt[i];
    if (!isnan(last)) {
        double diff = (1.0 - s->ewma) * s->rtt_diff[i] + s->ewma * (sample - last);
        double gradient = diff / s->min_rtt;
        int up = sample < s->t_low || (sample <= s->t_high && gradient <= 0.0);
        double high = s->t_high / sample;
        double c = sample > s->t_high ? 1.0 - s->beta * (1.0 - high) : 1.0 - s->beta * gradient;
        c = c > 0.0 ? c : 0.0;
        double cur = s->cur[i], stage = s->stage[i], rate;
        if (up) {
            rate = cur + (stage < 5 ? s->ti_ai : s->ti_hai);
            rate = s->line[i] < rate ? s->line[i] : rate;
        } else {
            rate = cur * c;
            rate = s->min_rate > rate ? s->min_rate : rate;
        }
        s->rate[i] = rate, s->cur[i] = rate;
        s->stage[i] = up ? stage + 1.0 : 0.0;
        s->rtt_diff[i] = diff;
    }
    s->last_rtt[i] = sample;
    s->tick[i] = now + s->rtt0[i] + s->qd[i];
}

/* DCQCN over dt for flow i (fluidcc.py's _dcqcn_step, after the in-flight ACK clock of
 * _advance): its CNP chance from the ACKs back, the first CNP, then the alpha, decrease and
 * increase ticks due by now */
static void dcqcn_step(fcc *s, int64_t i, double now, double dt) {
    double acked = ack_clock(s, i, dt);
    double no_cnp = exp(-(acked / s->pkt_bits) * (1.0 - s->unm[i]));
    s->u_alpha[i] *= no_cnp;
    s->u_dec[i] *= no_cnp;
    /* the first CNP: its chance since the start past the flow's own draw (or 1/2) */
    if (isinf(s->t_alpha[i]) &&
        1.0 - s->u_dec[i] >= (s->sampled ? uniform(s->seed, s->id[i], 0.0) : 0.5)) {
        s->alpha[i] = 1.0;
        s->t_alpha[i] = now + s->alpha_iv;
        s->t_dec[i] = now + s->dec_iv + 1e-9;
        s->rate[i] *= s->first_factor;
        s->target[i] = s->rate[i];
        s->u_alpha[i] = 1.0, s->u_dec[i] = 0.0;
    }
    if (now >= s->t_alpha[i]) {
        double n = floor((now - s->t_alpha[i]) / s->alpha_iv) + 1.0;
        double kp = pow(1.0 - s->g_d, n - 1.0);
        double a = (1.0 - s->g_d) * s->alpha[i] + s->g_d * (1.0 - s->u_alpha[i]);
        s->alpha[i] = a * kp;
        s->u_alpha[i] = 1.0;
        s->t_alpha[i] += n * s->alpha_iv;
    }
    if (now >= s->t_dec[i]) {
        double n = floor((now - s->t_dec[i]) / s->dec_iv) + 1.0;
        double chance = 1.0 - s->u_dec[i], cnp = chance;
        if (s->sampled) {
            s->n_dec[i] += 1.0;
            cnp = uniform(s->seed, s->id[i], s->n_dec[i]) < chance ? 1.0 : 0.0;
        }
        if (cnp > 0) {
            double rate = s->rate[i];
            if (s->stage[i] != 0 || s->clamp) s->target[i] += cnp * (rate - s->target[i]);
            double r = rate * (1.0 - cnp * s->alpha[i] / 2.0);
            s->rate[i] = s->min_rate > r ? s->min_rate : r;
            if (cnp >= 0.5) s->stage[i] = 0.0;
            double restart = s->t_dec[i] + s->inc_iv, old = s->t_inc[i];
            double blend = cnp * restart + (1.0 - cnp) * (isinf(old) ? 0.0 : old);
            s->t_inc[i] = (isinf(old) || cnp >= 1.0) ? restart : blend;
        }
        s->u_dec[i] = 1.0;
        s->t_dec[i] += n * s->dec_iv;
    }
    while (now >= s->t_inc[i]) {
        double stage = s->stage[i], raise = 0.0;
        if (stage == s->fast) raise = s->ai_d;
        if (stage > s->fast) raise = s->hai_d;
        double t = s->target[i] + raise;
        t = s->line[i] < t ? s->line[i] : t;
        s->target[i] = t;
        s->rate[i] = s->rate[i] / 2.0 + t / 2.0;
        s->stage[i] = stage + 1.0;
        s->t_inc[i] += s->inc_iv;
    }
}

/* backlog: the share of what flow i holds at the hop its last bit waits at that leaves over
 * dt (evenly from when the first of it leaves to when that bit leaves; 0: still sending) */
static double drain_frac(const fcc *s, int64_t i, double now, double dt) {
    if (s->lb_hop[i] < 0) return 0.0;
    double first = s->head[i * WIDTH + s->lb_hop[i]];
    first = first > now ? first : now;
    double span = s->lb_t[i] - first, f;
    if (!(span > 0)) return 1.0;
    f = (now + dt - first) / span;
    return f < 0.0 ? 0.0 : (f > 1.0 ? 1.0 : f);
}

/* backlog: what each switch queue sends over dt, passed on to each flow's next hop, and the
 * queues after (fluidcc.py's _pass_backlogs: the same sums in the same order) */
static void pass_backlogs(fcc *s, double now, double dt) {
    const int64_t L = s->n_links, n = s->n;
    int64_t longest = 0, calm = 1;
    for (int64_t l = 0; calm && l < L; l++)
        if (s->sw[l] && (s->q[l] != 0.0 || s->arrive[l] > s->eff[l])) calm = 0;
    if (calm) return; /* no queue and none to come: every hop passes what arrives */
    memset(s->mine, 0, L * sizeof(double));
    memset(s->due, 0, L * sizeof(double));
    memset(s->hsum, 0, L * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        const int64_t *p = s->links + i * WIDTH;
        const double *h = s->held + i * WIDTH;
        double frac = s->fr[i] = drain_frac(s, i, now, dt);
        longest = s->len[i] > longest ? s->len[i] : longest;
        for (int64_t k = 0; k < s->len[i]; k++) {
            s->hsum[p[k]] += h[k];
            if (k == s->lb_hop[i]) s->mine[p[k]] += h[k], s->due[p[k]] += h[k] * frac;
        }
    }
    for (int64_t l = 0; l < L; l++) {
        double a = s->q[l] - s->hsum[l], out_max = s->sw[l] ? s->eff[l] * dt : INFINITY;
        s->hsum[l] = a > 0.0 ? a : 0.0; /* now what no flow holds */
        s->psi[l] = s->due[l] > out_max ? out_max / s->due[l] : 1.0;
        a = out_max - s->due[l];
        s->spare[l] = a > 0.0 ? a : 0.0;
    }
    for (int64_t i = 0; i < n; i++) { /* what each hop passes, less phi: the same every pass */
        const int64_t *p = s->links + i * WIDTH;
        const double *h = s->held + i * WIDTH;
        for (int64_t k = 0; k < s->len[i]; k++)
            s->fwd[i * WIDTH + k] =
                k == s->lb_hop[i] ? s->psi[p[k]] * (h[k] * s->fr[i]) / dt : h[k] / dt;
    }
    for (int64_t pass = 0; pass < longest; pass++) {
        int last = pass == longest - 1;
        for (int64_t l = 0; l < L; l++) {
            double c = s->q[l] - s->mine[l] + s->arrive[l] * dt;
            c = c > 0.0 ? c : 0.0;
            s->phi[l] = c > s->spare[l] ? s->spare[l] / c : 1.0;
        }
        memset(s->arrive, 0, L * sizeof(double));
        if (last) memset(s->outl, 0, L * sizeof(double));
        for (int64_t i = 0; i < n; i++) {
            const int64_t *p = s->links + i * WIDTH;
            double *h = s->held + i * WIDTH, *hd = s->head + i * WIDTH, cur = s->x[i];
            const double *fwd = s->fwd + i * WIDTH, frac = s->fr[i];
            for (int64_t k = 0; k < s->len[i]; k++) {
                int64_t l = p[k];
                int here = k == s->lb_hop[i];
                double must = here ? h[k] * frac : 0.0;
                s->arrive[l] += cur;
                double nxt = here ? fwd[k] : s->phi[l] * (fwd[k] + cur);
                if (last) {
                    if (h[k] == 0 && cur > 0) hd[k] = now + wait_at(s, l);
                    double hn = h[k] + cur * dt;
                    double passed = here ? s->psi[l] * must : s->phi[l] * hn;
                    s->outl[l] += passed;
                    h[k] = hn - passed;
                }
                cur = nxt;
            }
        }
    }
    for (int64_t l = 0; l < L; l++)
        if (s->sw[l]) {
            double out = s->outl[l] + s->phi[l] * s->hsum[l];
            double v = s->q[l] + s->arrive[l] * dt - out;
            s->q[l] = v > 1.0 ? v : 0.0; /* under a bit: the sums' rounding, gone */
        }
}

/* history row r of every kind emptied (a new slot's) */
static void clear_slot(fcc *s, int64_t r) {
    const int64_t L = s->n_links;
    memset(s->hist + r * L, 0, L * sizeof(double));
    if (s->qh) memset(s->qh + r * L, 0, L * sizeof(double));
    if (s->txh) memset(s->txh + r * L, 0, L * sizeof(double));
    s->whist[r] = 0.0;
}

/* a slot's mean of old over w_old and now over dt more (now alone where both are 0 long) */
static double mean_in(double old, double now, double w_old, double dt) {
    double w_new = w_old + dt;
    return w_new > 0.0 ? (old * w_old + now * dt) / w_new : now;
}

/* a slot's row of n: its mean so far (over w_old) and now over dt more */
static void blend(double *row, const double *now, int64_t n, double w_old, double dt) {
    for (int64_t l = 0; l < n; l++) row[l] = mean_in(row[l], now[l], w_old, dt);
}

/* Steps from *now until t_far or until flows send their last bit; those (at most max_out)
 * come back as ids and delivery times, and the count is returned (0: t_far reached). */
int64_t fcc_run(fcc *s, double *now, double t_far, int64_t *out_id, double *out_t,
                int64_t max_out) {
    const int64_t L = s->n_links;
    while (s->n && *now < t_far) {
        int64_t n = s->n;
        double t_min = INFINITY;
        if (s->ack_frac) /* the ACKs of last step's data on each reverse link (ack_capacity) */
            for (int64_t l = 0; l < L; l++) {
                double d = s->data[l ^ 1], load = s->ack_frac * (d > 0.0 ? d : 0.0);
                double v = s->cap[l] - load, floor = 0.01 * s->cap[l];
                s->eff[l] = v > floor ? v : floor;
            }
        for (int64_t i = 0; i < n; i++) {
            double qd = queue_delay(s, i), x = s->rate[i];
            s->qd[i] = qd;
            if (s->win_bits) {
                double w = s->win_bits / (s->rtt0[i] + qd), held = s->win_bits;
                if (s->var_window) { /* VAR_WIN: the window x rate / line rate */
                    double scale = s->rate[i] / s->line[i];
                    w *= scale, held *= scale;
                }
                /* a flow that has sent less than its window: no hold */
                if (!(s->first_window && s->bits[i] - s->left[i] < held)) x = x < w ? x : w;
            }
            if (s->lb_hop[i] >= 0) x = 0.0; /* its last bit has left: it sends no more */
            s->x[i] = x;
        }
        nic_share(s);
        memset(s->arrive, 0, L * sizeof(double));
        int at_line = 1;
        for (int64_t i = 0; i < n; i++) {
            double x = s->x[i];
            s->tout[i] = x > 0 ? s->left[i] / x : INFINITY;
            if (s->tout[i] < t_min) t_min = s->tout[i];
            const int64_t *p = s->links + i * WIDTH;
            for (int64_t k = 0; k < s->len[i]; k++) s->arrive[p[k]] += x;
            if (s->lb_hop[i] < 0 && !(s->rate[i] >= s->line[i])) at_line = 0;
        }
        if (s->tandem && !s->backlog) { /* what each hop lets through: at most C */
            int64_t longest = 0;
            for (int64_t i = 0; i < n; i++) longest = s->len[i] > longest ? s->len[i] : longest;
            for (int64_t pass = 0; pass < longest - 1; pass++) {
                for (int64_t l = 0; l < L; l++)
                    s->through[l] = s->arrive[l] > s->eff[l] ? s->eff[l] / s->arrive[l] : 1.0;
                memset(s->arrive, 0, L * sizeof(double));
                for (int64_t i = 0; i < n; i++) {
                    const int64_t *p = s->links + i * WIDTH;
                    double share = 1.0;
                    for (int64_t k = 0; k < s->len[i]; k++) {
                        s->arrive[p[k]] += s->x[i] * share;
                        share *= s->through[p[k]];
                    }
                }
            }
        }
        int quiet = !s->hpcc && at_line && s->slot - s->last_mark > s->lag;
        for (int64_t l = 0; quiet && l < L; l++)
            if (s->q[l] != 0.0 || (s->sw[l] && s->arrive[l] > s->eff[l])) quiet = 0;
        for (int64_t l = 0; quiet && s->ack_frac && l < L; l++)
            if (s->arrive[l] != s->data[l]) quiet = 0; /* the ACK load moves */
        double t_next = quiet ? t_far : (t_far < *now + s->dt ? t_far : *now + s->dt);
        double dt = t_next - *now;
        if (t_min < dt) dt = t_min;
        if (s->backlog) { /* up to the next last bit due out of a queue, then the hops pass */
            for (int64_t i = 0; i < n; i++)
                if (s->lb_t[i] > *now && s->lb_t[i] - *now < dt) dt = s->lb_t[i] - *now;
            pass_backlogs(s, *now, dt);
        } else
            for (int64_t l = 0; l < L; l++)
                if (s->sw[l]) {
                    double v = s->q[l] + (s->arrive[l] - s->eff[l]) * dt;
                    s->q[l] = v > 0.0 ? v : 0.0;
                }
        if (s->ack_frac && !s->backlog) memcpy(s->data, s->arrive, L * sizeof(double));
        else if (s->ack_frac) /* what each link sent (a queue at its rate): the ACKs to come */
            for (int64_t l = 0; l < L; l++) {
                double d = s->arrive[l] < s->eff[l] ? s->arrive[l] : s->eff[l];
                s->data[l] = s->q[l] > 0 ? s->eff[l] : d;
            }
        for (int64_t i = 0; i < n; i++) s->left[i] -= s->x[i] * dt;
        *now += dt;
        /* the marks senders see now (a base round trip old, or per hop as long as a packet
         * takes from there to the receiver and its ACK back); then this step's marks, averaged
         * into its slot's row: a mark comes back after its delay in time, however many events
         * split the steps */
        int64_t slot = (int64_t)floor(*now / s->dt), R = s->lag + 1;
        for (int64_t k = s->slot + 1 > slot - R + 1 ? s->slot + 1 : slot - R + 1; k <= slot; k++)
            clear_slot(s, k % R); /* slots no step ended in (or not yet this one) */
        if (slot > s->slot) s->slot = slot;
        int64_t r0 = slot % R, back = ((slot - s->lag) % R + R) % R;
        double *row = s->hist + r0 * L, w_old = s->whist[r0];
        for (int64_t d = 0; s->hop_lag && d <= s->lag; d++) /* rows by how far back */
            s->lag_row[d] = ((slot - d) % R + R) % R * L;
        if (s->hpcc) /* what each link sent this step: its data and the ACKs on it */
            for (int64_t l = 0; l < L; l++) {
                double d = s->arrive[l] < s->eff[l] ? s->arrive[l] : s->eff[l];
                s->tx[l] = (s->q[l] > 0 ? s->eff[l] : d) + (s->cap[l] - s->eff[l]);
            }
        double window = s->win_bits ? s->win_bits : INFINITY;
        for (int64_t i = 0; i < n; i++) {
            const int64_t *p = s->links + i * WIDTH, *lg = s->hlag + i * WIDTH;
            double unmarked = 1.0, big_u = -1.0, queued = 0.0; /* -1: no hop stamped */
            for (int64_t k = 0; k < s->len[i]; k++) {
                int64_t at = (s->hop_lag ? s->lag_row[lg[k]] : back * L) + p[k];
                unmarked *= 1.0 - s->hist[at];
                if (s->timely) queued += s->qh[at];
                if (s->hpcc && s->sw[p[k]]) { /* a switch's telemetry as it stamped it */
                    double c = s->cap[p[k]];
                    double u = s->txh[at] / c + s->qh[at] * s->line[i] /
                                                              (c * window);
                    big_u = u > big_u ? u : big_u;
                }
            }
            s->unm[i] = unmarked, s->hu[i] = big_u, s->rs[i] = s->rtt0[i] + queued;
        }
        if (s->timely) /* the wait a packet meets at each queue (HPCC: the queue) */
            for (int64_t l = 0; l < L; l++) s->wait[l] = wait_at(s, l);
        if (s->hpcc || s->timely) blend(s->qh + r0 * L, s->timely ? s->wait : s->q, L, w_old, dt);
        if (s->hpcc) blend(s->txh + r0 * L, s->tx, L, w_old, dt);
        int marked = 0;
        for (int64_t l = 0; l < L; l++) {
            double p = mark_p(s, l);
            row[l] = mean_in(row[l], p, w_old, dt);
            if (p != 0.0) marked = 1;
        }
        s->whist[r0] = w_old + dt;
        if (marked) s->last_mark = slot;
        for (int64_t i = 0; i < n; i++) {
            if (s->dcqcn) {
                dcqcn_step(s, i, *now, dt);
                continue;
            }
            if (s->hpcc) {
                hpcc_step(s, i, *now, dt);
                continue;
            }
            if (s->timely) {
                timely_step(s, i, *now);
                continue;
            }
            if (s->window_cuts && !(*now >= s->tick[i])) continue; /* not its window's end */
            double unmarked = s->unm[i];
            double frac = 1.0 - unmarked, rtt = s->rtt0[i] + s->qd[i];
            double pkts = s->x[i] * rtt / s->pkt_bits;
            pkts = pkts > 1.0 ? pkts : 1.0;
            /* a window's chance of a mark (pow(1, y) is 1 exactly: no call where none) */
            double m = unmarked == 1.0 ? 0.0 : 1.0 - pow(unmarked, pkts), r;
            if (s->window_cuts) {
                double a = (1 - s->gain) * s->alpha[i] + s->gain * frac;
                s->alpha[i] = a;
                r = s->rate[i] * (1.0 - m * a / 2.0) + (1.0 - m) * s->ai;
                s->tick[i] = *now + rtt;
            } else {
                double st = dt / rtt;
                s->alpha[i] = frac + (s->alpha[i] - frac) * exp(-s->gain * st);
                r = s->rate[i] * exp(m * log1p(-s->alpha[i] / 2.0) * st);
                r += (1.0 - m) * s->ai * st;
            }
            r = r < s->min_rate ? s->min_rate : r;
            s->rate[i] = r > s->line[i] ? s->line[i] : r;
        }
        int64_t k = 0;
        for (int64_t i = 0; s->backlog && i < n; i++) {
            const int64_t *p = s->links + i * WIDTH;
            if (s->tout[i] <= dt * (1 + 1e-12)) { /* its last bit joins its first hop's queue */
                s->left[i] = 0.0, s->lb_hop[i] = 0;
                s->lb_t[i] = *now + wait_at(s, p[0]);
            }
            /* each last bit due out of its queue leaves it and joins the next hop's, what
             * its flow still has there ahead of it (FIFO: _last_bits) */
            while (s->lb_hop[i] >= 0 && s->lb_hop[i] < s->len[i] && s->lb_t[i] <= *now) {
                int64_t k = s->lb_hop[i];
                double *h = s->held + i * WIDTH, left = h[k];
                h[k] = 0.0;
                if (++s->lb_hop[i] < s->len[i]) {
                    int64_t here = p[k], l = p[k + 1];
                    if (left > 0.0 && s->sw[l]) { /* (a switch's queue: always) */
                        if (h[k + 1] == 0.0)
                            s->head[i * WIDTH + k + 1] = s->lb_t[i] + wait_at(s, l);
                        h[k + 1] += left;
                        double v = s->q[here] - left;
                        s->q[here] = v > 0.0 ? v : 0.0;
                        s->q[l] += left;
                    }
                    s->lb_t[i] = s->lb_t[i] + wait_at(s, l);
                }
            }
            if (s->lb_hop[i] >= s->len[i]) { /* out of its last hop: delivered */
                if (k == max_out) return -1;
                double t = s->lb_t[i] + s->delay[i];
                out_id[k] = s->id[i], out_t[k] = t > *now ? t : *now;
                s->tout[i] = -1.0, k++;
            }
        }
        for (int64_t i = 0; !s->backlog && i < n; i++)
            if (s->tout[i] <= dt * (1 + 1e-12)) {
                if (k == max_out) return -1; /* the caller's arrays are too small */
                out_id[k] = s->id[i], out_t[k] = *now + queue_delay(s, i) + s->delay[i];
                s->tout[i] = -1.0, k++;
            }
        if (k) {
            compact(s);
            return k;
        }
    }
    if (!s->n && *now < t_far) *now = t_far;
    return 0;
}

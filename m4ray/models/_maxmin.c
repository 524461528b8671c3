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

#define REL_TIE 1e-9

int m4ray_max_min(int64_t n, const int64_t *off, const int64_t *idx, int64_t n_links,
                  const double *capacity, const double *caps, double *rate) {
    double *remaining = malloc(n_links * sizeof(double));
    double *used = malloc(n_links * sizeof(double));
    int64_t *load = calloc(n_links, sizeof(int64_t));
    int64_t *frozen = calloc(n_links, sizeof(int64_t));
    int64_t *links = malloc((off[n] + 1) * sizeof(int64_t)); /* distinct links used */
    char *open = malloc(n + 1);
    char *hit = malloc(n + 1);
    int status = 0;
    if (!remaining || !used || !load || !frozen || !links || !open || !hit) {
        status = 2;
        goto out;
    }
    int64_t n_used = 0;
    for (int64_t e = 0; e < off[n]; ++e) {
        int64_t l = idx[e];
        if (load[l]++ == 0) {
            links[n_used++] = l;
            remaining[l] = capacity[l];
        }
    }
    int64_t n_open = n;
    for (int64_t i = 0; i < n; ++i) open[i] = 1;
    while (n_open > 0) {
        double level = INFINITY;
        for (int64_t k = 0; k < n_used; ++k) {
            int64_t l = links[k];
            if (load[l] > 0) {
                double share = remaining[l] / (double)load[l];
                if (share < level) level = share;
            }
        }
        double capped = INFINITY;
        if (caps)
            for (int64_t i = 0; i < n; ++i)
                if (open[i] && caps[i] < capped) capped = caps[i];
        int by_cap = caps && capped < level;
        double at = level > 0.0 ? level : 0.0;
        for (int64_t i = 0; i < n; ++i) {
            hit[i] = 0;
            if (!open[i]) continue;
            if (by_cap) {
                hit[i] = caps[i] <= capped * (1 + REL_TIE);
            } else {
                for (int64_t e = off[i]; e < off[i + 1]; ++e) {
                    int64_t l = idx[e];
                    if (remaining[l] / (double)load[l] <= level * (1 + REL_TIE)) {
                        hit[i] = 1;
                        break;
                    }
                }
            }
        }
        for (int64_t k = 0; k < n_used; ++k) {
            frozen[links[k]] = 0;
            used[links[k]] = 0.0;
        }
        for (int64_t i = 0; i < n; ++i) {
            if (!hit[i]) continue;
            rate[i] = by_cap ? caps[i] : at;
            open[i] = 0;
            --n_open;
            for (int64_t e = off[i]; e < off[i + 1]; ++e) {
                frozen[idx[e]] += 1;
                used[idx[e]] += rate[i];
            }
        }
        for (int64_t k = 0; k < n_used; ++k) {
            int64_t l = links[k];
            if (!frozen[l]) continue;
            load[l] -= frozen[l];
            remaining[l] -= by_cap ? used[l] : (double)frozen[l] * at;
        }
    }
out:
    free(remaining);
    free(used);
    free(load);
    free(frozen);
    free(links);
    free(open);
    free(hit);
    return status;
}

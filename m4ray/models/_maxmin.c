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
    /* Each level scans only the flows still open and the links still loaded (both kept in
     * their first order), so a computation costs the levels times what is left, not times
     * everything: the same arithmetic in the same order as scanning all of them. */
    double *remaining = malloc(n_links * sizeof(double));
    double *used = malloc(n_links * sizeof(double));
    int64_t *load = calloc(n_links, sizeof(int64_t));
    int64_t *frozen = calloc(n_links, sizeof(int64_t));
    int64_t *links = malloc((off[n] + 1) * sizeof(int64_t)); /* loaded links, first-use order */
    int64_t *open = malloc((n + 1) * sizeof(int64_t));       /* open flows, ascending */
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
    for (int64_t i = 0; i < n; ++i) open[i] = i;
    while (n_open > 0) {
        double level = INFINITY;
        for (int64_t k = 0; k < n_used; ++k) {
            int64_t l = links[k];
            double share = remaining[l] / (double)load[l];
            if (share < level) level = share;
        }
        double capped = INFINITY;
        if (caps)
            for (int64_t j = 0; j < n_open; ++j)
                if (caps[open[j]] < capped) capped = caps[open[j]];
        int by_cap = caps && capped < level;
        double at = level > 0.0 ? level : 0.0;
        for (int64_t j = 0; j < n_open; ++j) {
            int64_t i = open[j];
            hit[i] = 0;
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
        int64_t still = 0;
        for (int64_t j = 0; j < n_open; ++j) {
            int64_t i = open[j];
            if (!hit[i]) {
                open[still++] = i;
                continue;
            }
            rate[i] = by_cap ? caps[i] : at;
            for (int64_t e = off[i]; e < off[i + 1]; ++e) {
                frozen[idx[e]] += 1;
                used[idx[e]] += rate[i];
            }
        }
        n_open = still;
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
    free(remaining);
    free(used);
    free(load);
    free(frozen);
    free(links);
    free(open);
    free(hit);
    return status;
}

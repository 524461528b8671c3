/* m3's token percentiles, compiled: the same answers as m4ray/models/m3_features.py's numpy
 * (grouped_percentiles, tokens' per-link grouping), value for value. Built and loaded by
 * m4ray/models/m3_features.py through m4ray/native.py; called through ctypes.
 *
 * Percentiles are nearest rank as numpy's method="nearest": the value at sorted index
 * rint((n - 1) * (j / 100)), j = 1..100, round half to even (the default rounding mode). Equal
 * values are interchangeable, so any sort that orders the values gives numpy's answer.
 *
 * Returns 0, or 2 when memory runs out. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define N_PCT 100

static void sort_values(double *v, int64_t n) {
    /* quicksort (median of three) down to runs of 16, then one insertion pass */
    while (n > 16) {
        double a = v[0], b = v[n / 2], c = v[n - 1];
        double p = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        int64_t i = 0, j = n - 1;
        for (;;) {
            while (v[i] < p) i++;
            while (v[j] > p) j--;
            if (i >= j) break;
            double t = v[i];
            v[i] = v[j];
            v[j] = t;
            i++;
            j--;
        }
        /* [0, j] <= p <= [j + 1, n): recurse on the smaller part, loop on the larger */
        int64_t left = j + 1;
        if (left < n - left) {
            sort_values(v, left);
            v += left;
            n -= left;
        } else {
            sort_values(v + left, n - left);
            n = left;
        }
    }
    for (int64_t i = 1; i < n; i++) {
        double x = v[i];
        int64_t k = i;
        while (k > 0 && v[k - 1] > x) {
            v[k] = v[k - 1];
            k--;
        }
        v[k] = x;
    }
}

/* Percentiles of values grouped by key (0 <= key < n_keys): out [n_keys, 100] (rows of empty
 * keys are zeros), empty [n_keys] (1: no value). */
int m4ray_grouped_pct(int64_t n, const double *values, const int64_t *key, int64_t n_keys,
                      double *out, uint8_t *empty) {
    int64_t *start = calloc((size_t)n_keys + 1, sizeof *start);
    double *sorted = malloc((size_t)(n > 0 ? n : 1) * sizeof *sorted);
    if (!start || !sorted) {
        free(start);
        free(sorted);
        return 2;
    }
    for (int64_t i = 0; i < n; i++) start[key[i] + 1]++;
    for (int64_t k = 0; k < n_keys; k++) start[k + 1] += start[k];
    int64_t *fill = malloc((size_t)(n_keys > 0 ? n_keys : 1) * sizeof *fill);
    if (!fill) {
        free(start);
        free(sorted);
        return 2;
    }
    memcpy(fill, start, (size_t)n_keys * sizeof *fill);
    for (int64_t i = 0; i < n; i++) sorted[fill[key[i]]++] = values[i];
    free(fill);
    memset(out, 0, (size_t)n_keys * N_PCT * sizeof *out);
    for (int64_t k = 0; k < n_keys; k++) {
        int64_t count = start[k + 1] - start[k];
        empty[k] = count == 0;
        if (!count) continue;
        double *v = sorted + start[k];
        sort_values(v, count);
        double last = (double)(count - 1);
        for (int j = 1; j <= N_PCT; j++)
            out[k * N_PCT + j - 1] = v[(int64_t)nearbyint(last * ((double)j / 100.0))];
    }
    free(start);
    free(sorted);
    return 0;
}

/* The grouping of m3's tokens: one entry per foreground flow (token 0) and per link k in
 * [a, b) a background flow crosses (token k + 1), keyed token * n_buckets + its size bucket
 * (np.digitize: how many edges are <= the size). keys [n_entries], values [n_entries]; returns
 * how many entries were written (the caller sizes them: foreground + the spans' sum). */
int64_t m4ray_token_entries(int64_t n, const double *slowdown, const int64_t *size,
                            const int64_t *a, const int64_t *b, const uint8_t *fg,
                            int64_t n_edges, const double *edges, double *values, int64_t *keys) {
    int64_t n_buckets = n_edges + 1, e = 0;
    for (int64_t i = 0; i < n; i++) {
        double s = (double)size[i];
        int64_t bucket = 0;
        while (bucket < n_edges && edges[bucket] <= s) bucket++;
        if (fg[i]) {
            values[e] = slowdown[i];
            keys[e++] = bucket;
        } else {
            for (int64_t k = a[i]; k < b[i]; k++) {
                values[e] = slowdown[i];
                keys[e++] = (k + 1) * n_buckets + bucket;
            }
        }
    }
    return e;
}

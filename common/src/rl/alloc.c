/* Per-layer bit-widths under an error budget, by dynamic programming (mqgrad/rl.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "mqgrad/rl.h"
#include "mqgrad/util.h"

static double s_err(double e, int b)
{
    double levels = ldexp(1.0, b) - 1;
    return e / (levels * levels);
}

double mq_alloc_error(const double *e, size_t l, const int *bits)
{
    double sum = 0;
    for (size_t i = 0; i < l; i++)
        sum += s_err(e[i], bits[i]);
    return sum;
}

int mq_alloc_bits(const double *n, const double *e, size_t l, int lo, int hi, double budget,
                  size_t steps, int *bits)
{
    if (l < 1 || l > 4096 || lo < 1 || hi < lo || hi > 16 || steps < 1 || steps > 1000000 ||
        !(budget >= 0) || !isfinite(budget)) {
        mq_err_set("per-layer bits: bad arguments (%zu layers, bits %d..%d, %zu steps, budget "
                   "%g)",
                   l, lo, hi, steps, budget);
        return -1;
    }
    for (size_t i = 0; i < l; i++)
        if (!(n[i] >= 0) || !isfinite(n[i]) || !(e[i] >= 0) || !isfinite(e[i])) {
            mq_err_set("per-layer bits: layer %zu has a bad size or error coefficient", i);
            return -1;
        }
    double unit = budget > 0 ? budget / (double)steps : 0;
    size_t width = steps + 1;
    /* cost[j]: the fewest bits for the layers so far with errors of j units in all;
     * pick[i * width + j]: layer i's width on that best path (0: unreachable). */
    double *cost = malloc(width * sizeof *cost), *next = malloc(width * sizeof *next);
    unsigned char *pick = calloc(l * width, 1);
    int rc = -1;
    if (!cost || !next || !pick) {
        mq_err_set("per-layer bits: out of memory");
        goto done;
    }
    for (size_t j = 0; j < width; j++)
        cost[j] = j == 0 ? 0 : INFINITY;
    for (size_t i = 0; i < l; i++) {
        for (size_t j = 0; j < width; j++)
            next[j] = INFINITY;
        for (int b = lo; b <= hi; b++) {
            double err = s_err(e[i], b);
            double u = unit > 0 ? ceil(err / unit) : (err > 0 ? INFINITY : 0);
            if (!(u <= (double)steps))
                continue; /* this width alone exceeds the budget */
            size_t du = (size_t)u;
            double c = n[i] * b;
            for (size_t j = 0; j + du < width; j++)
                if (cost[j] + c < next[j + du]) {
                    next[j + du] = cost[j] + c;
                    pick[i * width + j + du] = (unsigned char)b;
                }
        }
        double *t = cost;
        cost = next;
        next = t;
    }
    size_t at = 0;
    for (size_t j = 1; j < width; j++)
        if (cost[j] < cost[at])
            at = j;
    if (!isfinite(cost[at])) {
        mq_err_set("per-layer bits: no widths in %d..%d keep the error within %g", lo, hi,
                   budget);
        goto done;
    }
    for (size_t i = l; i-- > 0;) { /* back along the best path */
        int b = pick[i * width + at];
        bits[i] = b;
        double u = unit > 0 ? ceil(s_err(e[i], b) / unit) : 0;
        at -= (size_t)u;
    }
    rc = 0;
done:
    free(cost);
    free(next);
    free(pick);
    return rc;
}

/*
 * stats: see stats.h. Sorting is qsort on a copy the caller owns; the percentile formula is numpy's default
 * so numbers from wafer and from a Python notebook over the same samples agree exactly.
 */
#include "core/stats.h"

#include <math.h>
#include <stdlib.h>

static int stats_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void stats_sort(double *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof *v, stats_cmp_double);
}

double stats_percentile_sorted(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return NAN;
    if (!(p > 0))
        p = 0;
    if (p > 100)
        p = 100;
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double frac = rank - (double)lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

void stats_summarize(double *v, size_t n, struct stats_summary *out)
{
    out->n = n;
    if (n == 0) {
        out->mean = out->std = out->min = out->max = NAN;
        out->p50 = out->p90 = out->p95 = out->p99 = NAN;
        return;
    }
    stats_sort(v, n);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    double mean = sum / (double)n, ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (v[i] - mean) * (v[i] - mean);
    out->mean = mean;
    out->std = sqrt(ss / (double)n);
    out->min = v[0];
    out->max = v[n - 1];
    out->p50 = stats_percentile_sorted(v, n, 50);
    out->p90 = stats_percentile_sorted(v, n, 90);
    out->p95 = stats_percentile_sorted(v, n, 95);
    out->p99 = stats_percentile_sorted(v, n, 99);
}

/*
 * stats: summary statistics over a sample of doubles, for benchmarks and reports. Percentiles use the
 * linear interpolation between closest ranks that numpy.percentile uses by default ("linear", type 7 of
 * Hyndman & Fan): for p in [0, 100] over n sorted values, rank r = p/100 * (n - 1), and the result is
 * v[floor(r)] + (v[ceil(r)] - v[floor(r)]) * (r - floor(r)). The median is the 50th percentile; std is
 * the population standard deviation (numpy's default ddof = 0).
 */
#ifndef WAFER_CORE_STATS_H
#define WAFER_CORE_STATS_H

#include <stddef.h>

struct stats_summary {
    size_t n;
    double mean, std, min, max;
    double p50, p90, p95, p99; /* p50 is also the median */
};

/* Sorts v ascending in place (NaNs are the caller's problem: do not pass them). */
void stats_sort(double *v, size_t n);

/* The p-th percentile (0..100, clamped) of sorted values; NAN when n == 0. */
double stats_percentile_sorted(const double *sorted, size_t n, double p);

/* Sorts v in place and fills out; with n == 0 every field but n is NAN. */
void stats_summarize(double *v, size_t n, struct stats_summary *out);

#endif

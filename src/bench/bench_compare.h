/*
 * bench_compare: `wafer bench compare A.json B.json`: reads two `wafer bench serve --json` results and prints,
 * for each load point they share, A and B side by side with the ratio B/A and which side is better:
 * throughput, latency percentiles, goodput and cost (from the files, or from prices given here).
 */
#ifndef WAFER_BENCH_BENCH_COMPARE_H
#define WAFER_BENCH_BENCH_COMPARE_H

struct bench_compare_options {
    const char *a_path, *b_path;
    double cost_a, cost_b; /* USD per hour overriding the files' prices; NAN when not given */
};

/* Prints the comparison on stdout. Returns the exit status: 0, 1 when no load point matches, 2 when a file
 * cannot be read or is not a bench serve result. */
int bench_compare_main(const struct bench_compare_options *o);

#endif

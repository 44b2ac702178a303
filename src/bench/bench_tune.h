/*
 * bench_tune: `wafer bench --tune`, which measures on this CPU how each decode gemv should ask for its weights
 * (the prefetch rules of cpu_features.h) and writes what read fastest to the tune file (cpu_tune.h) that every
 * later wafer process on this CPU applies.
 *
 * Per weight type with more than one rule here, gemv_stream runs the 1B model's matrices from memory as decode
 * does, in rounds of a plain read and then one pass under each rule, so every rule sees the same minutes of a
 * machine whose bandwidth moves; a rule replaces the built-in one only where the median over the rounds of
 * built-in time / its time is at least 1 + BENCH_TUNE_MARGIN, so noise keeps the measured rule.
 */
#ifndef WAFER_BENCH_BENCH_TUNE_H
#define WAFER_BENCH_BENCH_TUNE_H

#include <stdbool.h>

/* A rule must beat the built-in one by this share in the median round to replace it. 5%, not less: on the
 * Zen 5 VM, whose two vCPUs move between one CCD and two, the best of the rules that differ by a few percent
 * changes with the placement (Q4_0 sparse 1.04x NTA in one minute on one CCD, 0.97x in others across two;
 * stop 42), while the choices that matter differ far more (Q8_0 sparse against every line 1.06x, Q4_K and
 * Q6_K sparse against NTA 0.44-0.81x there; on a Zen 4 no prefetch against every line, Q4_0 1.10-1.36x,
 * gemv_avx512q.c). */
#define BENCH_TUNE_MARGIN 0.05

struct bench_tune_opts {
    int threads;       /* <= 0: one per CPU, as decode */
    int rounds;        /* rounds per type (<= 0: 10) */
    const char *path;  /* the tune file to write; NULL: cpu_tune_path() */
    const char *types; /* comma-separated weight types to measure; NULL: every type with a choice */
    bool save;         /* write the tune file */
    bool json;         /* one JSON object as the last line of stdout */
};

/* Runs the measurement, prints a table (stdout; progress on stderr) and writes the file when o->save. 0; 2 for
 * a usage error (a type that is not one with a decode rule, the environment's rule overrides set, no SIMD
 * kernels); 1 when a measurement or the write failed (the message on stderr). */
int bench_tune_run(const struct bench_tune_opts *o);

#endif
